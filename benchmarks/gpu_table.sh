#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, in one run on a CUDA machine (some 7 minutes on an H100):
# the audit against fwd+bwd at the training batches and at the zoo's, the first-step and precision
# probes at the training batches, the host synchronisations CUDA itself reports, then the fast tier.
#   bash benchmarks/gpu_table.sh [OUTDIR]       (stage 'tests' alone: STAGES=tests)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/initlint-gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 INITLINT_NO_PROGRESS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
stages="${STAGES:-bench syncs tests}"
"$py" -c "import torch, sys; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
"$py" -c "import transformers; print('transformers', transformers.__version__)" || true
if [[ " $stages " == *" bench "* ]]; then
    timeout 240 "$py" benchmarks/bench_real_size.py --device cuda --batch training --repeats 3 2>&1 | tee "$out/training.md"
    timeout 120 "$py" benchmarks/bench_real_size.py --device cuda --image-size zoo --repeats 5 \
        --models gpt2,llama32,bert,qwen3,vit,resnet50,swin 2>&1 | tee "$out/zoo.md"
    timeout 150 "$py" benchmarks/bench_step_cost.py --device cuda --batch training --precision bf16 --repeats 3 \
        --models gpt2,llama32,bert,resnet50 2>&1 | tee "$out/step.md"
fi
if [[ " $stages " == *" syncs "* ]]; then
    timeout 90 "$py" benchmarks/bench_syncs.py --cuda ${SYNC_ARGS:-} 2>&1 | tee "$out/syncs.md"
fi
if [[ " $stages " == *" tests "* ]]; then
    timeout "${TESTS_TIMEOUT:-300}" "$py" -m pytest -q -p no:cacheprovider --timeout 120 -rfs 2>&1 | tee "$out/tests.txt" | tail -40
fi
