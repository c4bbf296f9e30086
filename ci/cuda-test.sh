#!/bin/sh
# The CUDA backend's checks on a GPU machine (make cuda-test; the device call runs it):
#   1. build/cuda/test_cuda: the backend test table over ref, cpu and cuda (tests/test_backend_ops.c)
#      and the cuda backend's own cases (tests/cuda/test_cuda.c), against the reference;
#   2. scenarios/gpu.yaml through the CUDA CLI with --backend cuda;
#   3. compute-sanitizer memcheck on the "small" test case;
#   3b. build/cuda/test_devsim (the device sim communicator, ep 2/4/8) and it under memcheck;
#   4. timings at v4-flash shapes when DSV4MOE_CUDA_BENCH=1 (experts: DSV4MOE_CUDA_BENCH_EXPERTS, default 32).
# usage: cuda-test.sh BUILDDIR OUTDIR. Logs under OUTDIR; a table last.
set -u
B=${1:-build/cuda}
O=${2:-out/cuda}
mkdir -p "$O"
export DSV4MOE_TMP=${DSV4MOE_TMP:-/tmp/dsv4moe-cuda-tests}
export DSV4MOE_CUDA_REQUIRED=1
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -n 2 >"$O/summary.txt"

timeout "${T_TESTS:-240}" "$B/test_cuda" >"$O/test_cuda.log" 2>&1
rc_tests=$?
T1=$(date +%s)
timeout "${T_SCEN:-200}" "$B/dsv4moe" run scenarios/gpu.yaml --backend cuda --threads "$(nproc)" --report "$O/rep" \
    --cache "$DSV4MOE_TMP/scen-cache" >"$O/gpu_yaml.log" 2>&1
rc_scen=$?
T2=$(date +%s)
CK_FORK=no CK_RUN_CASE=small timeout "${T_SAN:-200}" "$SAN" --tool memcheck --leak-check full --error-exitcode 9 \
    "$B/test_cuda" >"$O/memcheck.log" 2>&1
rc_san=$?
timeout "${T_DEVSIM:-60}" "$B/test_devsim" >"$O/devsim.log" 2>&1
rc_devsim=$?
CK_FORK=no timeout "${T_SAN:-200}" "$SAN" --tool memcheck --leak-check full --error-exitcode 9 \
    "$B/test_devsim" >"$O/devsim_memcheck.log" 2>&1
rc_devsim_san=$?
T3=$(date +%s)
rm -f "$O/rep/report.html"
if [ "${DSV4MOE_CUDA_BENCH:-0}" = 1 ]; then
    : >"$O/timing.log"
    for e in ${DSV4MOE_CUDA_BENCH_EXPERTS:-32}; do
        DSV4MOE_CUDA_BENCH_E=$e CK_RUN_CASE=timing timeout "${T_BENCH:-120}" "$B/test_cuda" >>"$O/timing.log" 2>&1
    done
fi
T4=$(date +%s)

{
    echo "== test_cuda rc $rc_tests ($((T1 - T0)) s): $(grep -E '^[0-9]+%: Checks' "$O/test_cuda.log" | tail -n 1)"
    grep -E ':(F|E):' "$O/test_cuda.log" | head -n 20
    grep -E '^(cuda_suite|backend_ops cuda)' "$O/test_cuda.log" | sed -E 's/^(cuda_suite|backend_ops) +//' | \
        awk '{ line = $0; if (length(line) > 150) line = substr(line, 1, 150) "..."; print line }' | head -n 90
    echo "== scenarios/gpu.yaml rc $rc_scen ($((T2 - T1)) s): $(grep -E 'cases:' "$O/gpu_yaml.log" | tail -n 1)"
    grep -E 'FAIL|ERROR' "$O/gpu_yaml.log" | head -n 15
    echo "== compute-sanitizer memcheck rc $rc_san ($((T3 - T2)) s): $(grep -E 'ERROR SUMMARY' "$O/memcheck.log" | tail -n 1)"
    grep -E '^[0-9]+%: Checks' "$O/memcheck.log" | tail -n 1
    grep -E '========= (Invalid|Program hit|Error)' "$O/memcheck.log" | sort | uniq -c | head -n 5
    echo "== test_devsim rc $rc_devsim: $(grep -E '^[0-9]+%: Checks' "$O/devsim.log" | tail -n 1); memcheck rc $rc_devsim_san: $(grep -E 'ERROR SUMMARY' "$O/devsim_memcheck.log" | tail -n 1)"
    grep -E ':(F|E):' "$O/devsim.log" | head -n 10
    if [ -f "$O/timing.log" ]; then
        echo "== timings ($((T4 - T3)) s)"
        grep -E '^cuda_bench' "$O/timing.log" | sed -E 's/^cuda_bench //'
        grep -E ':(F|E):' "$O/timing.log" | head -n 3
    fi
} >>"$O/summary.txt"
cat "$O/summary.txt"
[ $rc_tests -eq 0 ] && [ $rc_scen -eq 0 ] && [ $rc_san -eq 0 ] && [ $rc_devsim -eq 0 ] && [ $rc_devsim_san -eq 0 ]
