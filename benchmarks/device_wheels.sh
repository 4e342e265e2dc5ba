#!/usr/bin/env bash
# Wheels of the packages the GPU checks need that the lent GPU machine lacks (it has torch,
# transformers, click, pyyaml, pytest, tqdm, ... but no pydantic, and nothing can be fetched there).
# Run here, where PyPI is reachable; it fills .whl/ (in .gitignore, about 3 MiB),
# which the device call carries and benchmarks/device_check.sh installs. The versions are the ones
# this venv resolved; the machine's python is 3.12 (/work/.library/device/KINDS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
pins=$(.venv/bin/python - <<'PY'
import importlib.metadata as md
for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions"):
    print(f"{name}=={md.version(name)}")
PY
)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins
ls -la .whl
