#!/usr/bin/env bash
# One-shot GPU check of the engine's CUDA path: the Triton kernel set against the torch
# references, engine exactness, the state store's host-tier copy GB/s, and prefill / TTFT /
# decode figures (scripts/gpu_check.py), plus the `triton` and `gpu` pytest markers on
# CUDA. Engine-level: no Ray, no network.
#
#   make gpu-bundle              # anywhere with PyPI: wheels the GPU machine may lack
#   bash scripts/gpu_check.sh    # on the GPU machine, from the repository root
#
# Needs python3 with CUDA torch, triton, transformers, einops and numpy; installs the
# bundle's wheels (mamba-ssm's Triton kernels, msgpack, pytest) into build/gpu-site only.
# Results go to $GPU_CHECK_OUT (default benchmarks/results/gpu): gpu_check.json,
# summary.md, pytest.txt, env.txt. Budget: about 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${GPU_CHECK_OUT:-benchmarks/results/gpu}"
BUNDLE="${GPU_BUNDLE:-build/gpu-bundle}"
SITE=build/gpu-site
PY="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"  # cpu + TRITON_INTERPRET=1: a dry run of this script
mkdir -p "$RESULTS" "$SITE"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, triton.__version__)"
} > "$RESULTS/env.txt" 2>&1
cat "$RESULTS/env.txt"

# Install what the image lacks from the bundle (a wheel whose package already imports is
# skipped, so the image's own torch/triton/numpy are never replaced).
for wheel in "$BUNDLE"/*.whl; do
    name="$(basename "$wheel" | cut -d- -f1)"
    module="${name//-/_}"
    "$PY" -c "import $module" 2>/dev/null && continue
    "$PY" -m pip install -q --no-deps --no-index --target "$SITE" "$wheel" 2>/dev/null \
        || echo "skipped $(basename "$wheel") (not for this Python)"
done
export PYTHONPATH="$PWD/$SITE:$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "from marconi_kernels import get_kernels; print(get_kernels('$DEVICE', 'triton').backends)" \
    || { echo "the triton kernel set does not load; see above"; exit 1; }

echo "== pytest -m 'triton or gpu' on CUDA"
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m "triton or gpu" \
    tests/kernels tests/engine/test_engine_triton.py tests/engine/test_engine_gpu.py \
    tests/engine/test_attention.py > "$RESULTS/pytest.txt" 2>&1
echo "pytest exit $?"; tail -5 "$RESULTS/pytest.txt"

echo "== scripts/gpu_check.py"
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of flags
timeout 330 "$PY" scripts/gpu_check.py --device "$DEVICE" --out "$RESULTS" ${GPU_CHECK_ARGS:-}
echo "gpu_check exit $?"
