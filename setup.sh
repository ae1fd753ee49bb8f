#!/usr/bin/env bash
# Set up specchat in ./.venv on a fresh machine (idempotent; safe to run again).
#
# torch is installed first and pinned to 2.13.0: on a CPU-only machine pip takes
# the CPU wheel (a bare `torch` requirement would pull a multi-GB CUDA build),
# and on a Linux GPU machine the same pin takes PyPI's CUDA build. Set
# SPECCHAT_TORCH to another requirement (e.g. "torch==2.9.1") to choose another.
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
if .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    step 3/4 "torch: $(.venv/bin/python -c 'import torch; print(torch.__version__)') already installed"
else
    step 3/4 "torch: installing $TORCH (a large download: several minutes on a slow line)"
    .venv/bin/python -m pip install -q "$TORCH"
fi
step 4/4 "specchat and its dependencies (editable install, with test and chart extras)"
.venv/bin/python -m pip install -q -e ".[test,chart]"
step done "run .venv/bin/specchat (the first start downloads and converts the pocket model)"
