#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, in one run on a CUDA machine (some 8 minutes on an H100):
# the Llama-3-70B shape streamed from meta onto the GPU, the audit against fwd+bwd at the training
# batches and at the zoo's, the first-step and precision probes at the training batches, the host
# synchronisations CUDA itself reports, and the fast tier (with pytest-xdist installed, in XDIST processes).
#   bash benchmarks/gpu_table.sh [OUTDIR]
# STAGES picks stages (default "giant bench syncs tests"); BUDGET is the seconds the whole run may take
# (default 570): each stage's timeout is its own cap or what is left of the budget, whichever is less.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/initlint-gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 INITLINT_NO_PROGRESS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
stages="${STAGES:-giant bench syncs tests}"
deadline=$(( $(date +%s) + ${BUDGET:-570} ))
cap() {  # seconds for a stage: its own cap, or what is left of the budget less a reserve
    local left=$(( deadline - $(date +%s) - ${2:-0} ))
    (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"
}
has() { [[ " $stages " == *" $1 "* ]]; }
"$py" -c "import torch, sys; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
"$py" -c "import transformers; print('transformers', transformers.__version__)" || true
# The fast tier and the synchronisation count (neither is timed) run beside the 70B shape; the cost
# ratios run alone after them.
tests_pid=""
if has tests; then
    xdist=""
    "$py" -c "import xdist" 2>/dev/null && xdist="-n ${XDIST:-6}"
    # One torch thread per worker (16 threads in each of several workers starved the machine: load 56-96),
    # and -rA with one line per test as it ends, so a run stopped at its timeout still names its failures.
    OMP_NUM_THREADS=1 timeout "$(cap "${TESTS_TIMEOUT:-300}" 240)" "$py" -m pytest -v -p no:cacheprovider \
        --timeout 120 -rfs $xdist >"$out/tests.txt" 2>&1 &
    tests_pid=$!
fi
syncs_pid=""
if has syncs; then
    timeout "$(cap 120 240)" "$py" benchmarks/bench_syncs.py --cuda ${SYNC_ARGS:-} >"$out/syncs.md" 2>&1 &
    syncs_pid=$!
fi
if has giant; then
    timeout "$(cap 40 300)" "$py" benchmarks/bench_giant.py --device cuda --layers 2 --hidden 1024 --intermediate 3584 \
        --vocab 32000 --heads 8 --breakdown 2>&1 | tee "$out/giant_small.log"
    timeout "$(cap 240 200)" "$py" benchmarks/bench_giant.py --device cuda --threads 8 --layers 80 --hidden 8192 \
        --intermediate 28672 --heads 64 --breakdown 2>&1 | tee "$out/giant70b.log"
fi
if [[ -n "$syncs_pid" ]]; then
    wait "$syncs_pid"; echo "syncs: exit $?"; cat "$out/syncs.md"
fi
if [[ -n "$tests_pid" ]]; then
    wait "$tests_pid"; echo "tests: exit $?"; grep -E "FAILED|ERROR" "$out/tests.txt" | head -40; tail -3 "$out/tests.txt"
fi
if has bench; then
    timeout "$(cap 150 110)" "$py" benchmarks/bench_real_size.py --device cuda --batch training --repeats 3 2>&1 \
        | tee "$out/training.md"
    timeout "$(cap 60 60)" "$py" benchmarks/bench_real_size.py --device cuda --image-size zoo --repeats 3 \
        --models gpt2,llama32,bert,qwen3,vit,resnet50,swin 2>&1 | tee "$out/zoo.md"
    timeout "$(cap 90 0)" "$py" benchmarks/bench_step_cost.py --device cuda --batch training --precision bf16 \
        --repeats 2 --models gpt2,llama32,bert,resnet50 2>&1 | tee "$out/step.md"
fi
