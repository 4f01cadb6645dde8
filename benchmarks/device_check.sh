#!/usr/bin/env bash
# The GPU benchmarks in one run: losses.py and lm_head.py with --device cuda, each table written
# as markdown to the folder given as the first argument.
#
#   bash benchmarks/device_check.sh "$OUT"          # on the GPU machine, from the repository root
#   DEVICE_CHECK_SMOKE=1 bash benchmarks/device_check.sh /tmp/out   # the same steps, tiny, CPU
#
# Needs torch (with CUDA), lightning and torchmetrics only; the repository is imported through
# PYTHONPATH=. (no install); $PYTHON, if set, is the interpreter. Estimated on one H100 (~50 TFLOP/s float32 matmul, ~3 TB/s):
#   [3-4]  losses [32768, 1000], every case: ~2-10 ms a call (EXACT ~1 s), ~20 s each with
#          start-up;
#   [5-6]  losses [65536, 32000] (2.1e9 logits, 8 GiB in float32), the [N, C] losses only
#          (binary, EXACT and n-by-m would need 5x F.cross_entropy's memory): ~10 passes of
#          8 GiB a call, ~30-100 ms; 20 cases x 7 calls, ~30 s each;
#   [7]    the peers' wheels (benchmarks/wheels/, git-ignored, carried to the machine: Liger-Kernel,
#          cut-cross-entropy, packaging) installed with --no-deps --no-index into a temporary
#          folder put on PYTHONPATH (the machine may have no network); a missing folder is
#          reported and the peers are then left out of the tables, each with its reason;
#   [8]    lm_head float32 at 8192x512x32000, 32768x1024x128000 and 16384x4096x128256 (a
#          Llama-3-sized head): CE-type candidates of ours with --backend torch triton, focal,
#          the peers, each with its gradients' relative error against float64 (first 2048
#          rows); 3-4 matmuls of 8.6-17 TFLOP a call at the larger shapes, ~0.5-1 s a call,
#          ~20 candidates x 5 calls: ~2-3 minutes (estimated);
#   [9]    lm_head bfloat16, the same shapes, every loss of ours on both backends and the
#          peers: ~2-3 minutes (estimated).
# [10-14] the Triton kernels: the interpreter's tests on the device, then kernels.py at both
#          shapes, float32 and bfloat16: the phi-level table, then every public [N, C] loss with
#          backend="torch" and "triton" (checks on: one host synchronisation; off) beside
#          F.cross_entropy (15 losses x 4 candidates; estimated 2-3 minutes, not yet measured).
# In all about 10 minutes. DEVICE_CHECK_ONLY=lm_head runs steps [1], [7]-[9] alone (in 4 steps).
set -euo pipefail

out="${1:?usage: bash benchmarks/device_check.sh OUTPUT_DIR}"
mkdir -p "$out"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
python="${PYTHON:-$(command -v python || command -v python3)}"
total=14
only="${DEVICE_CHECK_ONLY:-}"
if [[ "$only" == lm_head ]]; then
    total=4
fi

device=cuda
small=(--rows 32768 --classes 1000 --repeats 20)
large=(--rows 65536 --classes 32000 --repeats 5)
head_shapes=(--shapes 8192x512x32000 32768x1024x128000 16384x4096x128256 --max-plain-gib 64
    --repeats 2)
if [[ "${DEVICE_CHECK_SMOKE:-0}" == 1 ]]; then # check the steps on a CPU, tiny
    device=cpu
    small=(--rows 256 --classes 20 --repeats 1 --threads 1)
    large=(--rows 128 --classes 300 --repeats 1 --threads 1)
    head_shapes=(--shapes 64x16x500 32x8x3000 --max-plain-gib 64 --repeats 1 --threads 1
        --no-memory)
fi
# The head in float32: CE-type losses of ours and focal on both backends, beside the peers, with
# the gradients' errors against float64; in bfloat16 every loss of ours on both backends.
head_float32_only=(
    "torch chunked CE (mean)" "ours ce" "ours ce, ls=0.1" "ours ce, z_loss=1e-4" "ours focal(2)"
    "Liger fused linear CE" "CCE cce" "CCE cce_exact" "torch.compile chunked CE"
)
# The Triton kernels of [N, C] logits (benchmarks/kernels.py); in smoke mode under Triton's
# interpreter on the CPU, tiny.
kernel_small=(--rows 32768 --classes 1000 --repeats 20)
kernel_large=(--rows 65536 --classes 32000 --repeats 5)
if [[ "${DEVICE_CHECK_SMOKE:-0}" == 1 ]]; then
    export TRITON_INTERPRET=1
    kernel_small=(--rows 64 --classes 50 --repeats 1)
    kernel_large=(--rows 32 --classes 300 --repeats 1)
fi
# The losses of [N, C] logits: those that fit at [65536, 32000] (F.cross_entropy always runs).
large_cases=(
    cross_entropy "gamma_cross_entropy(0.5)" "F.cross_entropy(ls=0.1)" "cross_entropy(ls=0.1)"
    "gamma_cross_entropy(0.5, ls=0.1)" "gamma_cross_entropy(0.5, b=0.2)" soft_accuracy_loss
    "focal_loss(2)" "focal_loss(0.5)" adaptive_focal_loss "adafocal_loss (15 bins)"
    hard_truncated_loss poly1_loss soft_truncated_loss mbls_loss dual_focal_loss mdca_loss
    dca_loss mmce_loss
)

step=0
begin() {
    step=$((step + 1))
    echo
    echo "[$step/$total] $* (at ${SECONDS} s)"
}

begin "environment"
nvidia-smi -L || echo "nvidia-smi: not available"
"$python" --version
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "available", torch.cuda.is_available(),
    "float32 matmul precision", torch.get_float32_matmul_precision())'

if [[ "$only" != lm_head ]]; then
begin "import lightning_losses.functional (torch, lightning and torchmetrics only)"
"$python" -c 'import lightning_losses.functional; print("ok")'

begin "losses.py float32 [32768, 1000], every case -> $out/losses_float32.md"
"$python" benchmarks/losses.py --device "$device" --markdown "${small[@]}" \
    | tee "$out/losses_float32.md"

begin "losses.py bfloat16 [32768, 1000], every case -> $out/losses_bfloat16.md"
"$python" benchmarks/losses.py --device "$device" --dtype bfloat16 --markdown "${small[@]}" \
    | tee "$out/losses_bfloat16.md"

begin "losses.py float32 [65536, 32000], [N, C] losses -> $out/losses_large_float32.md"
"$python" benchmarks/losses.py --device "$device" --markdown "${large[@]}" \
    --only "${large_cases[@]}" | tee "$out/losses_large_float32.md"

begin "losses.py bfloat16 [65536, 32000], [N, C] losses -> $out/losses_large_bfloat16.md"
"$python" benchmarks/losses.py --device "$device" --dtype bfloat16 --markdown "${large[@]}" \
    --only "${large_cases[@]}" | tee "$out/losses_large_bfloat16.md"

fi

begin "the peers' wheels (benchmarks/wheels/) -> a temporary folder on PYTHONPATH"
if compgen -G "benchmarks/wheels/*.whl" > /dev/null; then
    peers="$(mktemp -d)"
    "$python" -m pip install --quiet --no-deps --no-index --target "$peers" benchmarks/wheels/*.whl \
        && export PYTHONPATH="$PYTHONPATH:$peers" && ls "$peers" \
        || echo "pip install of the wheels failed: the peers will be left out"
else
    echo "no wheels in benchmarks/wheels/: Liger and CCE will be left out (see docs/benchmarks.md)"
fi

begin "lm_head.py float32, backends torch and triton, peers -> $out/lm_head_float32.md"
"$python" benchmarks/lm_head.py --device "$device" --markdown "${head_shapes[@]}" \
    --backend torch triton --peers --only "${head_float32_only[@]}" \
    | tee "$out/lm_head_float32.md"

begin "lm_head.py bfloat16, backends torch and triton, peers -> $out/lm_head_bfloat16.md"
"$python" benchmarks/lm_head.py --device "$device" --dtype bfloat16 --markdown \
    "${head_shapes[@]}" --backend torch triton --peers | tee "$out/lm_head_bfloat16.md"

if [[ "$only" == lm_head ]]; then
    echo
    echo "done in ${SECONDS} s; tables in $out"
    exit 0
fi

begin "kernels: the interpreter's tests on the compiled kernels (pytest + hypothesis) -> $out/kernels_tests.txt"
if [[ "${DEVICE_CHECK_SMOKE:-0}" == 1 ]]; then
    echo "smoke mode: skipped (tests/kernels runs them under the interpreter in the suite)"
else
    KERNEL_TEST_DEVICE=cuda "$python" -m pytest -q -p no:cacheprovider tests/kernels/interpreted \
        | tee "$out/kernels_tests.txt" || echo "kernel tests failed: see $out/kernels_tests.txt"
fi

for dtype in float32 bfloat16; do
    begin "kernels.py $dtype [32768, 1000] -> $out/kernels_$dtype.md"
    "$python" benchmarks/kernels.py --device "$device" --dtype "$dtype" "${kernel_small[@]}" \
        | tee "$out/kernels_$dtype.md"
done
for dtype in float32 bfloat16; do
    begin "kernels.py $dtype [65536, 32000] -> $out/kernels_large_$dtype.md"
    "$python" benchmarks/kernels.py --device "$device" --dtype "$dtype" "${kernel_large[@]}" \
        | tee "$out/kernels_large_$dtype.md"
done

echo
echo "done in ${SECONDS} s; tables in $out"
