#!/usr/bin/env bash
# Bring up a real one-node SLURM with accounting on this machine, for tests/workflow/test_slurm.py.
#
#   bash .ci/slurm_up.sh            # installs the Debian packages if missing, then starts everything
#   bash .ci/slurm_up.sh --status   # says what is up; exit 0 only when SLURM accepts jobs
#
# What runs (no systemd: every daemon is started by hand, state and logs under $BASE):
#   munged (as user munge) -> mariadbd (private datadir, unix socket only, no TCP)
#   -> slurmdbd (accounting: the executor plugin asks `sacct` for job states and, without
#      accounting, waits forever saying nothing) -> slurmctld -> slurmd -N localhost (the hostname
#      of this machine is not `localhost`, the node's name in slurm.conf).
# Config lives under $BASE; /etc/slurm/slurm.conf is a symlink to it so every client (sinfo, sbatch,
# sacct, the plugin) finds it without SLURM_CONF. Idempotent: what already answers is left alone.
# Every wait is bounded: the script fails with the relevant log's tail rather than hang.
# Needs root (apt-get, /etc/slurm, munge's key). Facts behind the settings: ../shared/ENVIRONMENT.md.
set -euo pipefail

BASE=${AGGBENCH_SLURM_BASE:-/tmp/aggbench-slurm}
WAIT=${AGGBENCH_SLURM_WAIT:-90}       # seconds each daemon may take to answer
CLUSTER=aggbench
ACCOUNT=aggbench
SOCK=$BASE/mysql/mysqld.sock

log() { echo "slurm_up: $*" >&2; }
die() {
    log "ERROR: $1"
    [[ -n ${2:-} && -f $2 ]] && { log "last lines of $2:"; tail -n 25 "$2" >&2; }
    exit 1
}
# wait_for SECONDS LOGFILE DESCRIPTION CMD... : poll CMD once a second until it succeeds.
wait_for() {
    local secs=$1 logf=$2 what=$3
    shift 3
    local t0=$SECONDS
    until timeout 10 "$@" >/dev/null 2>&1; do
        ((SECONDS - t0 < secs)) || die "$what did not come up within ${secs}s" "$logf"
        sleep 1
    done
    log "$what up ($((SECONDS - t0)) s)"
}

munge_ok() { timeout 10 bash -c 'munge -n | unmunge' >/dev/null 2>&1; }
db_ok() { timeout 10 mariadb-admin --socket="$SOCK" ping >/dev/null 2>&1; }
dbd_ok() { timeout 10 sacctmgr -n list cluster format=cluster 2>/dev/null | grep -qw "$CLUSTER"; }
ctld_ok() { timeout 10 scontrol ping 2>/dev/null | grep -q "is UP"; }
node_ok() { timeout 10 sinfo -h -n localhost -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated|completing)'; }
all_ok() { munge_ok && db_ok && dbd_ok && ctld_ok && node_ok && timeout 10 sacct -n -X >/dev/null 2>&1; }

if [[ ${1:-} == --status ]]; then
    for f in munge_ok db_ok dbd_ok ctld_ok node_ok; do
        if $f; then echo "$f: yes"; else echo "$f: no"; fi
    done
    all_ok
    exit $?
fi

[[ $(id -u) == 0 ]] || die "run as root (it installs packages, writes /etc/slurm and starts daemons)"

# ---- packages (Debian bookworm: slurm-wlm 22.05, munge, MariaDB 10.11); ~30 s when missing
PKGS=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
    log "installing ${PKGS[*]}"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq || die "apt-get update failed or timed out"
    timeout 600 apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null ||
        die "apt-get install ${PKGS[*]} failed or timed out"
fi

mkdir -p "$BASE"/{state,spool,log,run,mysql}
chmod 755 "$BASE"

# ---- configs (rewritten every time: they only depend on this machine)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
old_conf=$(cat "$BASE/slurm.conf" 2>/dev/null || true)
cat >"$BASE/slurm.conf" <<EOF
# Written by .ci/slurm_up.sh: a one-node test cluster (see ../shared/ENVIRONMENT.md).
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$BASE/slurmdbd.conf" <<EOF
# Written by .ci/slurm_up.sh. Mode 600: slurmdbd refuses a readable file.
DbdHost=localhost
SlurmUser=root
AuthType=auth/munge
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
chmod 600 "$BASE/slurmdbd.conf"
if [[ -e /etc/slurm/slurm.conf && ! -L /etc/slurm/slurm.conf ]]; then
    die "/etc/slurm/slurm.conf exists and is not ours; move it away or set SLURM_CONF yourself"
fi
ln -sfn "$BASE/slurm.conf" /etc/slurm/slurm.conf
ln -sfn "$BASE/slurmdbd.conf" /etc/slurm/slurmdbd.conf

if all_ok && [[ $old_conf == "$(cat "$BASE/slurm.conf")" ]]; then
    log "already up (cluster $CLUSTER, node localhost, accounting on)"
    exit 0
fi

# ---- munge: the key comes with the package; munged must run as user munge
if ! munge_ok; then
    [[ -f /etc/munge/munge.key ]] || { mungekey --create --keyfile /etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged --force
    wait_for "$WAIT" /var/log/munge/munged.log munged bash -c 'munge -n | unmunge'
fi

# ---- MariaDB: a private server on a unix socket; root logs in by socket authentication
if ! db_ok; then
    if [[ ! -d $BASE/mysql/data/mysql ]]; then
        timeout 120 mariadb-install-db --user=root --datadir="$BASE/mysql/data" \
            --auth-root-authentication-method=socket >"$BASE/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed" "$BASE/log/mariadb-install.log"
    fi
    setsid mariadbd --user=root --datadir="$BASE/mysql/data" --socket="$SOCK" --skip-networking \
        --pid-file="$BASE/run/mariadb.pid" --log-error="$BASE/log/mariadb.log" \
        --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
    wait_for "$WAIT" "$BASE/log/mariadb.log" mariadb mariadb-admin --socket="$SOCK" ping
fi

# ---- slurmdbd, then register the cluster and an account (what a real site has)
if ! timeout 10 sacctmgr -n list cluster >/dev/null 2>&1; then
    MYSQL_UNIX_PORT=$SOCK setsid slurmdbd </dev/null >/dev/null 2>&1
    wait_for "$WAIT" "$BASE/log/slurmdbd.log" slurmdbd sacctmgr -n list cluster
fi
if ! dbd_ok; then
    timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed" "$BASE/log/slurmdbd.log"
fi
if ! timeout 10 sacctmgr -n list account format=account | grep -qw "$ACCOUNT"; then
    timeout 30 sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description="aggbench CI" organization=ci >/dev/null
fi
if ! timeout 10 sacctmgr -n list user format=user | grep -qw root ||
    ! timeout 10 sacctmgr -n -s list user root format=account | grep -qw "$ACCOUNT"; then
    timeout 30 sacctmgr -i add user root account="$ACCOUNT" defaultaccount="$ACCOUNT" cluster="$CLUSTER" >/dev/null || true
fi

# ---- slurmctld and slurmd (a running slurmctld re-reads a changed slurm.conf)
if ctld_ok && [[ $old_conf != "$(cat "$BASE/slurm.conf")" ]]; then
    timeout 30 scontrol reconfigure || die "scontrol reconfigure failed" "$BASE/log/slurmctld.log"
    log "slurm.conf changed: reconfigured"
fi
if ! ctld_ok; then
    setsid slurmctld -f "$BASE/slurm.conf" </dev/null >/dev/null 2>&1
    wait_for "$WAIT" "$BASE/log/slurmctld.log" slurmctld bash -c 'scontrol ping | grep -q "is UP"'
fi
if ! node_ok; then
    if ! [[ -f $BASE/run/slurmd.pid ]] || ! kill -0 "$(cat "$BASE/run/slurmd.pid")" 2>/dev/null; then
        setsid slurmd -N localhost -f "$BASE/slurm.conf" </dev/null >/dev/null 2>&1
    fi
    t0=$SECONDS
    until node_ok; do
        ((SECONDS - t0 < WAIT)) || die "node localhost not idle within ${WAIT}s ($(sinfo -h -o '%T %E' 2>&1))" "$BASE/log/slurmd.log"
        state=$(timeout 10 sinfo -h -n localhost -o %T 2>/dev/null || true)
        [[ $state == down* || $state == drain* ]] && timeout 10 scontrol update nodename=localhost state=resume 2>/dev/null || true
        sleep 1
    done
    log "slurmd up ($((SECONDS - t0)) s)"
fi

# ---- prove it: a job runs and accounting knows it
jid=$(timeout 30 sbatch --parsable -J slurm_up_probe -o /dev/null --wrap true) || die "sbatch failed" "$BASE/log/slurmctld.log"
t0=$SECONDS
until timeout 10 sacct -n -X -j "$jid" -o State 2>/dev/null | grep -q COMPLETED; do
    ((SECONDS - t0 < WAIT)) || die "probe job $jid did not complete within ${WAIT}s ($(sacct -n -X -j "$jid" -o State 2>&1))" "$BASE/log/slurmctld.log"
    sleep 1
done
log "ready: cluster $CLUSTER, node localhost ($CPUS CPUs, $MEM_MB MB), account $ACCOUNT, probe job $jid COMPLETED"
