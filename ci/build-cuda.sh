#!/bin/sh
# `make cuda`: compiles and links the CUDA sources with nvcc for Hopper (sm_90a).
# usage: build-cuda.sh BUILDDIR [SOURCES...]
set -eu
out=$1
shift
NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
        [ -x "$d/nvcc" ] && NVCC="$d/nvcc" && break
    done
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "make cuda: nvcc not found (install the CUDA toolkit or set NVCC)" >&2
    exit 1
fi
mkdir -p "$out"
if [ $# -eq 0 ]; then
    echo "make cuda: no CUDA sources yet; checking that nvcc compiles and links for sm_90a"
    printf '__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\nint main(void) { return 0; }\n' > "$out/probe.cu"
    "$NVCC" -gencode=arch=compute_90a,code=sm_90a -o "$out/probe" "$out/probe.cu"
    echo "make cuda: ok ($("$NVCC" --version | tail -n 1))"
    exit 0
fi
objs=""
for src in "$@"; do
    obj="$out/$(basename "$src" .cu).o"
    "$NVCC" -std=c++17 -O3 -Iinclude -Icore -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Werror \
        -c "$src" -o "$obj"
    objs="$objs $obj"
done
echo "make cuda: compiled$objs"
