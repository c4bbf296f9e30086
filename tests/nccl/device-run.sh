#!/bin/bash
# One device call for the NCCL communicator (from the checkout root, after ci/device-env.sh):
# build, the one-GPU tests, a world of every visible GPU (numerics, trace identity, bandwidth) and,
# with >= 2 GPUs, a missing rank. Logs under ${OUT:-out}/nccl/. Exit 0 only if everything passed.
set -u -o pipefail
out=${OUT:-out}/nccl
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
inc=""
[ -f "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" ] || inc="NCCL_INC=-I/usr/include"
make -j16 $inc nccl > "$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
rc=0
timeout 300 build/nccl/test_nccl 2>&1 | tee "$out/test_nccl.txt" | grep -E "^(PASS|FAIL)" || rc=1
n=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$n" -ge 1 ] || n=1
timeout 300 sh tests/nccl/run_world.sh "$n" 2>&1 | tee "$out/world.txt" || rc=1
if [ "$n" -ge 2 ]; then
    timeout 120 sh tests/nccl/run_world.sh "$n" missing $((n - 1)) 2>&1 | tee "$out/world_missing.txt" || rc=1
fi
exit $rc
