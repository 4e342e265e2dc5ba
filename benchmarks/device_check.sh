#!/usr/bin/env bash
# Every CUDA path of aggbench in one call on a GPU machine (the device tool gives a session one
# call of at most 10 minutes): the bf16 GRPO steps and generation of benchmarks/gpu_check.py, the
# FSDP2 + bf16 + sharded-checkpoint run of benchmarks/gpu_fsdp_check.py (NCCL, one rank per GPU),
# and the tests marked `gpu` (vLLM's are skipped where vLLM is not installed, and say so).
#
#   here:  bash benchmarks/device_wheels.sh        # once: .whl/ with what the machine lacks
#   there: bash benchmarks/device_check.sh [OUT]   # device tool: carry [".whl"], OUT=$OUT
#
# Each step's output goes to OUT (default $OUT, else device-out/), with a summary.txt of exit codes;
# a failing step does not stop the next. The README's "Measured" table takes gpu_check's README line.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-device-out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/aggbench-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/aggbench-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
gpus=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, record the code
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
    tail -n 25 "$out/$name.log"
}
: > "$out/summary.txt"
{ nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
step gpu_check 180 python3 benchmarks/gpu_check.py --json "$out/gpu_check.json"
step gpu_fsdp_check 180 python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
    benchmarks/gpu_fsdp_check.py --json "$out/gpu_fsdp_check.json"
step pytest_gpu 200 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/plan/test_plan.py \
    tests/train/test_gpu_fsdp_check.py tests/rollout/test_vllm_parts.py
cat "$out/summary.txt"
! grep -qv "exit 0," "$out/summary.txt"
