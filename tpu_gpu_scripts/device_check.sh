#!/usr/bin/env bash
# One prepared device check for a lent GPU (an H200 with jax + CUDA): the kernel tests compiled (tests/kernels),
# then tpu_gpu_scripts/device_check.py (spec-verify kernel vs reference, llama-60m train-step MFU, SmolLM2
# decoding at batch 1/8/64 with fp32/bf16/int8 weights). Writes one JSON of figures and finishes within ~8 min.
#
#   tpu_gpu_scripts/device_check.sh [OUT.json]        # default: $OUT/device_check.json, else ./device_check.json
#   DEVICE_CHECK_SMALL=1 tpu_gpu_scripts/device_check.sh /tmp/f.json   # tiny shapes (CPU smoke run)
#   DEVICE_CHECK_KERNEL_TESTS=0 ...                    # skip the kernel tests (recorded as rc -1)
# Environment: PYTHON (default python), DEVICE_CHECK_SECTIONS (comma list, default all).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${1:-${OUT:-.}/device_check.json}
mkdir -p "$(dirname "$out")"
small=()
[ "${DEVICE_CHECK_SMALL:-0}" = 1 ] && small=(--small)
rc=-1
if [ "${DEVICE_CHECK_KERNEL_TESTS:-1}" = 1 ]; then
  # tests/conftest.py defaults JAX_PLATFORMS to cpu; on a GPU the kernels must run compiled
  platform=${JAX_PLATFORMS:-}
  command -v nvidia-smi > /dev/null && platform=cuda
  JAX_PLATFORMS=${platform:-cpu} timeout 150 "$py" -m pytest -q -x -p no:cacheprovider tests/kernels -n 0 \
    > "${out%.json}.kernel_tests.log" 2>&1
  rc=$?
  tail -n 3 "${out%.json}.kernel_tests.log"
fi
timeout 330 "$py" tpu_gpu_scripts/device_check.py --out "$out" --kernel-tests-rc "$rc" "${small[@]}" \
  --sections "${DEVICE_CHECK_SECTIONS:-spec_verify,train_step,decode}"
status=$?
echo "figures: $out"
[ "$rc" -gt 0 ] && exit "$rc"
exit "$status"
