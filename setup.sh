#!/usr/bin/env bash
# Set up specchat in ./.venv on a fresh machine (idempotent; safe to run again).
#
# torch is installed first and pinned to 2.13.0: on a CPU-only machine pip takes
# the CPU wheel (a bare `torch` requirement would pull a multi-GB CUDA build),
# and on a Linux GPU machine the same pin takes PyPI's CUDA build. Set
# SPECCHAT_TORCH to another requirement (e.g. "torch==2.9.1") to choose another, and
# SPECCHAT_TORCH_INDEX to the wheel index of a given CUDA build (docs/gpu.md, step 0).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TORCH=${SPECCHAT_TORCH:-torch==2.13.0}
step() { printf 'specchat setup [%s] %s\n' "$1" "$2"; }

if [ -x .venv/bin/python ]; then
    step 1/4 "virtual environment: .venv exists"
else
    step 1/4 "virtual environment: creating .venv"
    "$PY" -m venv .venv
fi
step 2/4 "pip: upgrading"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# An explicit SPECCHAT_TORCH is always handed to pip (which keeps an installed build that
# already satisfies it); SPECCHAT_TORCH_INDEX names the index its wheel comes from, e.g.
#   SPECCHAT_TORCH="torch==2.6.0+cu124" SPECCHAT_TORCH_INDEX=https://download.pytorch.org/whl/cu124 ./setup.sh
# Without SPECCHAT_TORCH, an installed torch of 2.6 or newer (the floor in pyproject.toml)
# is kept; an older one is replaced by the pin, so that step 4 never lets pip choose a build.
INDEX_ARGS=()
if [ -n "${SPECCHAT_TORCH_INDEX:-}" ]; then
    INDEX_ARGS=(--index-url "$SPECCHAT_TORCH_INDEX")
fi
torch_ok() {
    .venv/bin/python -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 6))" >/dev/null 2>&1
}
if [ -n "${SPECCHAT_TORCH:-}" ]; then
    step 3/4 "torch: installing $TORCH as asked${SPECCHAT_TORCH_INDEX:+ from $SPECCHAT_TORCH_INDEX}"
    .venv/bin/python -m pip install -q "$TORCH" ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"}
elif torch_ok; then
    step 3/4 "torch: $(.venv/bin/python -c 'import torch; print(torch.__version__)') already installed"
else
    step 3/4 "torch: installing $TORCH (a large download: several minutes on a slow line)"
    .venv/bin/python -m pip install -q "$TORCH" ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"}
fi
step 4/4 "specchat and its dependencies (editable install, with test and chart extras)"
.venv/bin/python -m pip install -q -e ".[test,chart]"
step done "run .venv/bin/specchat (the first start downloads and converts the pocket model)"
