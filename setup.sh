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
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "${SPECCHAT_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[test,chart]"
