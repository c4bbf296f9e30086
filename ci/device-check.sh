#!/bin/sh
# The device machine's run in one call: build, tests, the CUDA checks, the engines and the benchmarks.
#
#   usage (on the GPU machine, from the repository root):  . ci/device-env.sh && sh ci/device-check.sh
#
# Steps (each with its own timeout, all inside one overall budget, DSV4_DEVCHECK_BUDGET seconds,
# default 480, so the whole run ends well under 9 minutes; a step that would start after the
# budget is spent is reported "skipped"):
#   build          make -j16 all, and the benchmark binaries (bench/ceilings.cu with nvcc, bench_cuda)
#   build-cuda     make cuda (fast/cuda -> build/cuda/libdsv4moe.a, build/cuda/dsv4moe, the CUDA tests)
#   link-bench     bench_cuda relinked against build/cuda/libdsv4moe.a when that exists
#   cpu-test       make -j16 PYTHON=python3 test (the Check suite and the CLI tests)
#   ceilings       copy bandwidth and cuBLASLt FP8 block-scaled / per-tensor / bf16 GEMM rates
#   torch-peer     bench/torch_peer.py: the same layer in plain PyTorch, per T
#   bench-cuda-fp8, bench-cuda-exact
#                  bench_cuda --gemm fp8 / --gemm exact: the CUDA backend per T in each numerics mode
#                  against the ceilings and the torch peer (when bench_cuda's usage names --gemm;
#                  otherwise one step "bench-cuda" without it)
#   hf-peer        bench/hf_peer.py: HF transformers' DeepseekV4SparseMoeBlock (grouped_mm, bf16), eager
#                  and CUDA-graph replay, per T (a transformers without DeepseekV4 is a JSON saying so)
#   gmm-peer       bench/scaled_gmm_peer.py: torch._scaled_grouped_mm on the routed experts' two GEMMs, per T
#   cuda-test-*    build/cuda/test_cuda (DSV4MOE_CUDA_REQUIRED=1: GPU cases may not skip), when built, a
#                  step per Tcase
#   devsim         build/cuda/test_devsim: the device sim communicator, ep 2/4/8 ranks as threads with
#                  their own streams on one GPU, and the skipped-metadata deadlock reported (not hung);
#                  then the same under compute-sanitizer memcheck (CK_FORK=no)
#   gpu-scenario   build/cuda/dsv4moe run scenarios/gpu.yaml --backend cuda, when both exist; when it
#                  fails, gpu-scenario-isolate (ci/scen-isolate.py, DSV4_DEVCHECK_ISOLATE_CAP seconds,
#                  default 150) reruns alone each case that failed from the first device fault on
#   nccl           tests/nccl/device-run.sh: the NCCL communicator's one-GPU tests and a world of every GPU
#   sanitizer      compute-sanitizer memcheck on the test program's "small" Tcase (CK_RUN_CASE=small,
#                  CK_FORK=no; DSV4_SANITIZER_ARGS adds arguments)
#   hf-engine, hf-engine-bf16
#                  ci/hf_engine_check.py: HF transformers' DeepseekV4SparseMoeBlock on exported bf16
#                  cases through dsv4moe check, clean and with each defect patched in (docs/engines.md),
#                  the block in float32 (held to the fp32 rounding profile) and in bfloat16 (bf16_ops)
#   torch-engine, torch-engine-fp8
#                  ci/torch_engine_check.py: a plain-PyTorch engine with quantized activations (e4m3,
#                  1x128 ue8m0 scales) on exported fp8 and fp4 cases, clean and with the weight-point
#                  and clamp defects; its GEMMs on the dequantized values, then (fp8) through
#                  torch._scaled_mm blockwise on FP8 tensor cores
#   flight-recorder ci/record_flight_recorder.py: a real NCCL flight-recorder dump (world of one) and
#                  divergent copies through dsv4moe symmetry
#   embed          ci/embed_check.py: the Python package in torch on the CUDA library: the
#                  layer captured in torch.cuda.graph between torch ops, two layers on one caller
#                  workspace, a bad id latched and polled, HF's block patched (bf16 vs the fp32 block,
#                  fp4/fp8 vs dsv4moe ref; hf_ckpt: a block holding fp4/fp8 checkpoint tensors patched
#                  with those bytes as they are) and timed next to the unpatched block (DSV4_EMBED_ARGS adds
#                  arguments, e.g. --quick or --experts 256); its JSON is engines.tar.gz's embed.json
# (make cuda-test runs the same three through ci/cuda-test.sh; this script runs them as separate
# steps with their own timeouts so one hang costs one row.)
# Absent pieces (the CUDA backend is not there yet) are "absent" rows, not failures.
# DSV4_DEVCHECK_SCEN_CAP (default 330) is gpu-scenario's cap in seconds: the whole of gpu.yaml (305
# cases) took 257 s on an H100 with a cold cache, so a call that runs it keeps DSV4_DEVCHECK_BUDGET
# for it and skips the steps it does not need. The CLI writes its report at the end: a run cut short
# leaves no per-case log.
# DSV4_DEVCHECK_FAULTS=1 adds the CUDA fault build and gpu.yaml's f01 cases under --faults (steps
# faults-build, faults-f01).
# DSV4_DEVCHECK_TESTS_FIRST=1 runs the CUDA tests, gpu.yaml and the sanitizer right after the CPU
# suite, before the measurements and profiles (a verifying call whose budget may run out).
# test_cuda runs a step per Tcase (cuda-test-small, cuda-test-fp8, ...: the whole of it no longer
# fits one call); DSV4_DEVCHECK_CUDA_CASES="variants small" runs only those, and "cuda-test" in
# DSV4_DEVCHECK_SKIP none. DSV4_DEVCHECK_CUDA_TEST_CAP (default 420) is each one's cap (on an H100:
# small 13 s, fp8 81 s, routing with routing_large 381 s, ring 40 s, variants about 180 s).
# DSV4_DEVCHECK_PAR=1 runs those Tcases and gpu-scenario at once (each a process of its own; most
# of their time is the host generating and uploading layers, and the machine has 16 cores), then
# devsim and the sanitizer.
# DSV4_DEVCHECK_SKIP="cpu-test torch-peer" skips steps by name (local trials); DSV4_BENCH_ARGS adds
# arguments to bench_cuda (e.g. --quick: fewer repetitions), DSV4_PEER_ARGS to the three peers (--quick).
# The bench JSONs of an earlier call in $WORK/bench are removed first (so a skipped or failed step
# cannot show old numbers), unless DSV4_DEVCHECK_KEEP=1 (reuse, e.g., the peers of an earlier call on
# the same machine: the table then shows them as they were).
#
# Output: at most 8 files under $OUT (the device tool brings back only that many): summary.txt,
# results.json (steps, the table's numbers per T and mode, the targets), bench_cuda.json (the
# fp8 mode's when there are two), logs.tar.gz (every step's log), gpu-report.tar.gz (the scenario
# report), bench.tar.gz (every JSON the steps wrote: ceilings.json, torch_peer.json, both modes'
# bench_cuda_*.json, hf_peer.json, gmm_peer.json, the A/B and profile runs'), engines.tar.gz
# (hf-engine's table and reports, the flight-recorder dumps, embed's embed.json). Large work files (the generated
# v4-flash layer, about 3.3 GB) go to $DSV4_DEVCHECK_WORK (default /tmp/dsv4-devcheck), never to $OUT.
# The short table is printed last. Exit status: 0 when no step failed (absent and skipped are not
# failures), 1 otherwise.
set -u
OUT=${OUT:-out/device}
WORK=${DSV4_DEVCHECK_WORK:-/tmp/dsv4-devcheck}
BUDGET=${DSV4_DEVCHECK_BUDGET:-480}
JOBS=${DSV4_DEVCHECK_JOBS:-16}
PY=${PYTHON:-python3}
LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS" "$WORK/bench"
[ "${DSV4_DEVCHECK_KEEP:-0}" = 1 ] || rm -f "$WORK"/bench/*.json "$WORK/bench/variants.tsv"
# DSV4_DEVCHECK_PROFILE holds one profile name or several, space-separated ("route ring")
profile() {
    case " ${DSV4_DEVCHECK_PROFILE:-0} " in *" $1 "*) return 0 ;; esac
    return 1
}
: >"$WORK/steps.tsv"
T_START=$(date +%s)

# step NAME CAP_SECONDS COMMAND: runs COMMAND (sh -c) under min(CAP, budget left), logs to $LOGS/NAME.log
step() {
    name=$1 cap=$2
    shift 2
    case " ${DSV4_DEVCHECK_SKIP:-} " in
    *" $name "*)
        printf '%s\tskipped\t0\tDSV4_DEVCHECK_SKIP\n' "$name" >>"$WORK/steps.tsv"
        echo "== $name: skipped (DSV4_DEVCHECK_SKIP)"
        return 2
        ;;
    esac
    now=$(date +%s)
    left=$((T_START + BUDGET - now))
    if [ "$left" -lt 15 ]; then
        printf '%s\tskipped\t0\tout of time (budget %ss)\n' "$name" "$BUDGET" >>"$WORK/steps.tsv"
        echo "== $name: skipped (budget spent)"
        return 2
    fi
    t=$cap
    [ "$left" -lt "$t" ] && t=$left
    echo "== $name (timeout ${t}s): $*"
    t0=$(date +%s)
    timeout -k 5 "$t" sh -c "$*" >"$LOGS/$name.log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        st=pass note=""
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        st=fail note="timed out after ${t}s"
    else
        st=fail note="exit $rc: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-110 | tr '\t' ' ')"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$st" "$dt" "$note" >>"$WORK/steps.tsv"
    echo "   $st in ${dt}s $note"
    tail -n 4 "$LOGS/$name.log" | sed 's/^/   | /'
    return $rc
}

absent() {
    printf '%s\tabsent\t0\t%s\n' "$1" "$2" >>"$WORK/steps.tsv"
    echo "== $1: absent ($2)"
}

{
    echo "device-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${BUDGET}s, work $WORK, out $OUT"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
        --format=csv 2>&1 || true
    nvcc --version 2>&1 | tail -n 1 || true
    $PY -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 || true
} | tee "$LOGS/environment.log"

# ---- build ----
step build 150 "make -j$JOBS all && make -j$JOBS bench-cuda-build"
step build-cuda 240 "make cuda"
# what the tensor-core kernels compiled to (registers, spills, matrix instructions), for docs/cuda.md:
# each in its own translation unit (k_dec, k_dec_mix, k_tile, k_tileh)
step sass 120 "for u in dec dec_mix tile tileh; do echo \"== fast/cuda/\$u.cu\"; nvcc -std=c++17 -O3 -I. -Iinclude \
    -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c fast/cuda/\$u.cu -o $WORK/sass_\$u.o 2>&1 | grep -A2 -E 'k_dec|k_tile' ; \
    cuobjdump -sass $WORK/sass_\$u.o | grep -oE '[A-Z]+MMA[.A-Z0-9_]*' | sort | uniq -c; done"

BENCH=build/bench/bench_cuda
if [ -x build/cuda/bench_cuda ]; then
    # make cuda's build: the CUDA backend, and device-resident buffers for dsv4_backend_forward_device
    BENCH=build/cuda/bench_cuda
    absent link-bench "not needed: make cuda built build/cuda/bench_cuda"
else
    absent link-bench "build/cuda/bench_cuda not built: bench_cuda uses the normal library"
fi

# ---- CPU suite ----
step cpu-test 150 "make -j$JOBS PYTHON=$PY test"

# ---- CUDA tests, scenarios, sanitizer: a function, run here with DSV4_DEVCHECK_TESTS_FIRST=1 (before
# the measurements, so a call cut short by its budget has verified before it measured), else after
# the measurements and profiles ----
# test_cuda's Tcases (tests/cuda/test_cuda.c), the order a call without DSV4_DEVCHECK_CUDA_CASES runs them
CUDA_TCASES="small fp8 graphs flash exact pdl routing routing_large ring variants early device embed timing host"
cuda_tests() {
    CUDA_TEST=""
    for c in build/cuda/test_cuda build/cuda/tests/test_cuda; do
        [ -x "$c" ] && CUDA_TEST=$c && break
    done
    # the CUDA tests skip GPU cases without DSV4MOE_CUDA_REQUIRED=1; their scratch goes to $WORK
    CUDA_ENV="DSV4MOE_CUDA_REQUIRED=1 DSV4MOE_TMP=$WORK/cuda-tmp DSV4MOE_SRC=\$(pwd) DSV4MOE_PYTHON=$PY"
    if [ -n "$CUDA_TEST" ]; then
        # each Tcase a step of its own (the whole of test_cuda takes longer than one call: routing
        # alone took 242 s on an H100), so a cap or the budget costs one Tcase's row, not the rest;
        # DSV4_DEVCHECK_CUDA_CASES names fewer (e.g. "variants small"); "cuda-test" in
        # DSV4_DEVCHECK_SKIP skips them all
        case " ${DSV4_DEVCHECK_SKIP:-} " in
        *" cuda-test "*) step cuda-test 0 true ;;
        *)
            for ckc in ${DSV4_DEVCHECK_CUDA_CASES:-$CUDA_TCASES}; do
                if [ "${DSV4_DEVCHECK_PAR:-0}" = 1 ]; then
                    step "cuda-test-$ckc" "${DSV4_DEVCHECK_CUDA_TEST_CAP:-420}" "CK_RUN_CASE=$ckc $CUDA_ENV $CUDA_TEST" &
                else
                    step "cuda-test-$ckc" "${DSV4_DEVCHECK_CUDA_TEST_CAP:-420}" "CK_RUN_CASE=$ckc $CUDA_ENV $CUDA_TEST"
                fi
            done
            ;;
        esac
    else
        absent cuda-test "no build/cuda/test_cuda (make cuda builds it with the CUDA backend)"
    fi
    if [ "${DSV4_DEVCHECK_PAR:-0}" = 1 ]; then
        gpu_scenario &
        wait
    fi
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x build/cuda/test_devsim ]; then
        step devsim 60 "$CUDA_ENV build/cuda/test_devsim"
        [ -x "$SAN" ] && step devsim-sanitizer 90 "$CUDA_ENV CK_FORK=no $SAN --tool memcheck --leak-check full \
            --error-exitcode 9 build/cuda/test_devsim"
    else
        absent devsim "no build/cuda/test_devsim (make cuda builds it)"
    fi
    [ "${DSV4_DEVCHECK_PAR:-0}" = 1 ] || gpu_scenario
    if [ -n "$CUDA_TEST" ] && [ -x "$SAN" ]; then
        # the test program's "small" Tcase, in one process (CK_FORK=no) so memcheck sees every kernel
        step sanitizer 150 "$CUDA_ENV CK_FORK=no CK_RUN_CASE=small $SAN --tool memcheck --leak-check full \
            --error-exitcode 9 $CUDA_TEST ${DSV4_SANITIZER_ARGS:-}"
    elif [ -z "$CUDA_TEST" ]; then
        absent sanitizer "no CUDA test binary to run under memcheck"
    else
        absent sanitizer "compute-sanitizer not found"
    fi
}

# gpu.yaml on the CUDA CLI (and, with DSV4_DEVCHECK_FAULTS=1, its f01 cases under --faults)
gpu_scenario() {
    if [ -x build/cuda/dsv4moe ] && [ -f scenarios/gpu.yaml ]; then
        SCEN_CMD="build/cuda/dsv4moe run scenarios/gpu.yaml --backend cuda --threads $JOBS --cache $WORK/cuda-tmp/scen-cache"
        # a case that faults on the device fails every later case of the process (the error stays on
        # the CUDA context): then each case that failed from the first fault on reruns alone
        # (ci/scen-isolate.py), so the log names the faulting case and says how the others fare alone
        step gpu-scenario "${DSV4_DEVCHECK_SCEN_CAP:-330}" "$CUDA_ENV $SCEN_CMD --report $WORK/gpu" ||
            step gpu-scenario-isolate "${DSV4_DEVCHECK_ISOLATE_CAP:-150}" "$CUDA_ENV $PY ci/scen-isolate.py $WORK/gpu \
                $((${DSV4_DEVCHECK_ISOLATE_CAP:-150} - 10)) $SCEN_CMD"
    else
        absent gpu-scenario "build/cuda/dsv4moe or scenarios/gpu.yaml not there"
    fi
    # DSV4_DEVCHECK_FAULTS=1: the CUDA fault build (make cuda FAULTS=1) and gpu.yaml's f01 cases run
    # with the clamp dropped (dsv4moe run --faults --filter f01: each must pass clean and fail injected)
    if [ "${DSV4_DEVCHECK_FAULTS:-0}" = 1 ] && [ -f scenarios/gpu.yaml ]; then
        step faults-build 240 "make cuda FAULTS=1 BUILD=build/faults -j$JOBS"
        [ -x build/faults/cuda/dsv4moe ] && step faults-f01 150 "$CUDA_ENV build/faults/cuda/dsv4moe run --faults \
            --filter f01 scenarios/gpu.yaml --backend cuda --threads $JOBS --report $WORK/faults \
            --cache $WORK/cuda-tmp/scen-cache"
    fi
}
[ "${DSV4_DEVCHECK_TESTS_FIRST:-0}" = 1 ] && cuda_tests

# ---- measurements ----
step ceilings 90 "build/bench/ceilings $WORK/bench/ceilings.json"
step torch-peer 180 "PYTHONUNBUFFERED=1 $PY bench/torch_peer.py --json $WORK/bench/torch_peer.json ${DSV4_PEER_ARGS:-}"
# both numerics modes when bench_cuda takes --gemm (its usage, printed for an unknown argument, says so)
GEMM_MODES=""
if [ -x "$BENCH" ] && timeout 20 "$BENCH" --help 2>&1 | grep -q -e '--gemm'; then
    GEMM_MODES="fp8 exact"
fi
if [ -x "$BENCH" ] && [ -n "$GEMM_MODES" ]; then
    for m in $GEMM_MODES; do
        step "bench-cuda-$m" 240 "$BENCH --gemm $m --ceilings $WORK/bench/ceilings.json --peer $WORK/bench/torch_peer.json \
            --json $WORK/bench/bench_cuda_$m.json --dir $WORK/bench --threads $JOBS ${DSV4_BENCH_ARGS:-}"
    done
elif [ -x "$BENCH" ]; then
    step bench-cuda 240 "$BENCH --ceilings $WORK/bench/ceilings.json --peer $WORK/bench/torch_peer.json \
        --json $WORK/bench/bench_cuda.json --dir $WORK/bench --threads $JOBS ${DSV4_BENCH_ARGS:-}"
else
    absent bench-cuda "$BENCH not built"
fi
# the peers: HF's own block (bf16, grouped_mm, CUDA graph) and torch's FP8 grouped GEMM alone
step hf-peer 200 "PYTHONUNBUFFERED=1 $PY bench/hf_peer.py --json $WORK/bench/hf_peer.json ${DSV4_PEER_ARGS:-}"
step gmm-peer 120 "PYTHONUNBUFFERED=1 $PY bench/scaled_gmm_peer.py --json $WORK/bench/gmm_peer.json ${DSV4_PEER_ARGS:-}"

# ---- optional: the same benchmark on the mma.sync kernels, on the k_tileh variants and on the
# decode kernel's dec_b variants (DSV4_DEVCHECK_AB=1), and per-kernel device times from Nsight Compute (DSV4_DEVCHECK_PROFILE=1:
# T = 1, 128 and 4096, every kernel's duration, then k_dec and k_tileh in detail; the clocks are
# left alone) ----
if [ "${DSV4_DEVCHECK_AB:-0}" = 1 ] && [ -x "$BENCH" ]; then
    step bench-mma 180 "DSV4MOE_CUDA_TILE=mma $BENCH --ceilings $WORK/bench/ceilings.json \
        --peer $WORK/bench/torch_peer.json --json $WORK/bench/bench_cuda_mma.json --dir $WORK/bench --threads $JOBS --quick"
    # the large-group kernel's variants (fast/cuda/cuda.cu, tileh_big / tileh_mid) at the T they serve
    for v in s64x2 p64 s64 p128; do
        step "bench-tileh-$v" 90 "DSV4MOE_CUDA_TILEH=$v $BENCH --tokens 1024,4096,16384 --ceilings $WORK/bench/ceilings.json \
            --json $WORK/bench/bench_tileh_$v.json --dir $WORK/bench --threads $JOBS --quick"
    done
    for v in p32 s32; do
        step "bench-mid-$v" 60 "DSV4MOE_CUDA_MID=$v $BENCH --tokens 256,1024 --ceilings $WORK/bench/ceilings.json \
            --json $WORK/bench/bench_mid_$v.json --dir $WORK/bench --threads $JOBS --quick"
    done
    # the decode kernel's B rows in shared memory against L1 (the default), alternating, two passes each
    for p in 1 2; do
        for v in l1 smem; do
            step "bench-dec-$v-$p" 60 "$BENCH --gemm fp8 --cuda-kernels dec_b=$v --tokens 1,8,16,32,128,256 \
                --ceilings $WORK/bench/ceilings.json --json $WORK/bench/bench_dec_${v}_$p.json --dir $WORK/bench \
                --threads $JOBS --quick"
        done
    done
fi
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# DSV4_DEVCHECK_PROFILE=route: the decode step's routing kernels (k_logits_small, k_router_count;
# k_router and k_count2 where the chunk takes them) at T = 1, 8 and 32, fp8 mode: their durations
# with Nsight Compute's cache flush before each kernel (its default) and without it (closer to a
# replayed graph, whose weights and buffers stay in L2), then k_router_count at T = 1 in detail:
# warp states, memory, and the per-instruction stall samples of its SASS (the source page, CSV,
# after its summary by ci/ncu-stall-regions.py: the samples between block barriers);
# the logits kernel with params logits_tg=1 (one token's x loaded at a time; four, the default),
# logits_loop=on (its tokens in a loop, not unrolled) and both, the routing weights on the selecting warp (params
# weights=warp) and the three lean variants together (group=warp,weights=warp,logits_loop=on), and
# the one-launch router
# (params route=one, k_route_small) at the same T, warm; the grouping by one warp (params
# group=warp) at T 1 and 4, warm; then the step's routed decode GEMMs at T = 1 and k_logits_small
# at T = 32 (unrolled and logits_loop=on) in detail.
if profile route && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    RK="regex:k_router_count|k_logits_small|k_router\$|k_count2|k_route_small"
    for rt in 1 8 32; do # (not t or cc: step uses those)
        for rcc in all none; do
            step "profile-route-t$rt-$rcc" 90 "$NCU --clock-control none --cache-control $rcc -k '$RK' --launch-skip 30 \
                --launch-count 8 --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
                --tokens $rt --quick --json $WORK/bench/route_$rt.json --dir $WORK/bench --threads $JOBS"
        done
    done
    # the routing kernels warm on a params variant: route_warm TAG PARAMS T... (steps profile-route-tT-TAG)
    route_warm() {
        rtag=$1 rkv=$2
        shift 2
        for rt in "$@"; do
            step "profile-route-t$rt-$rtag" 90 "$NCU --clock-control none --cache-control none -k '$RK' --launch-skip 30 \
                --launch-count 8 --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
                --cuda-kernels $rkv --tokens $rt --quick --json $WORK/bench/route_${rtag}_$rt.json --dir $WORK/bench \
                --threads $JOBS"
        done
    }
    route_warm tg1 logits_tg=1 1 8 32 # the logits kernel with one token's x loaded at a time
    route_warm loop logits_loop=on 1 8 32              # its tokens in a loop, not unrolled
    route_warm loop1 logits_loop=on,logits_tg=1 1 8 32 # both
    route_warm gw group=warp 1 4      # the grouping by one warp: chunks of at most 32 slots, T <= 5 on v4-flash
    route_warm ww weights=warp 1 8 32 # the routing weights on the selecting warp
    route_warm lean group=warp,weights=warp,logits_loop=on 1 4 # the three together
    route_warm one route=one 1 8 32   # the one-launch router (k_route_small)
    step profile-route-detail 150 "$NCU --clock-control none --cache-control none -k regex:k_router_count \
        --launch-skip 30 --launch-count 1 --set full --warp-sampling-interval 0 --import-source yes \
        -f -o $WORK/route_t1 $BENCH --gemm fp8 \
        --tokens 1 --quick --json $WORK/bench/route_d.json --dir $WORK/bench --threads $JOBS >/dev/null && $NCU -i $WORK/route_t1.ncu-rep \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SpeedOfLight && \
        $NCU -i $WORK/route_t1.ncu-rep --page source --csv --print-source sass >$WORK/route_t1_sass.csv && \
        $PY ci/ncu-stall-regions.py $WORK/route_t1_sass.csv && cat $WORK/route_t1_sass.csv"
    # the decode GEMMs of the same step in detail: routed gate/up (k_dec<fp4, EPI_NONE>) and the
    # routed down projection with the combine folded in (k_dec<fp4, EPI_COMBINE>), by their
    # demangled names (WF_FP4 = 2); their stall regions (the K split's reduction, the epilogue, the
    # folded combine) say what a block does beside streaming its weights
    for dk in gu:0 down:1; do
        dn=${dk%%:*} de=${dk#*:}
        step "profile-dec-$dn-detail" 120 "$NCU --clock-control none --cache-control none --kernel-name-base demangled \
            -k 'regex:k_dec<2, $de,' --launch-skip 8 --launch-count 1 --set full --import-source yes \
            -f -o $WORK/dec_${dn}_t1 $BENCH --gemm fp8 --tokens 1 --quick --json $WORK/bench/dec_${dn}_d.json \
            --dir $WORK/bench --threads $JOBS >/dev/null && $NCU -i $WORK/dec_${dn}_t1.ncu-rep --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SpeedOfLight && \
            $NCU -i $WORK/dec_${dn}_t1.ncu-rep --page source --csv --print-source sass >$WORK/dec_${dn}_t1_sass.csv && \
            $PY ci/ncu-stall-regions.py $WORK/dec_${dn}_t1_sass.csv"
    done
    # k_logits_small at T = 32 in detail, unrolled (the default) and with logits_loop=on: the share
    # of its warp samples waiting on instruction fetch, and where
    for lv in unrolled:'' loop:logits_loop=on; do
        ln=${lv%%:*} lk=${lv#*:}
        [ -z "$lk" ] && lk="''"
        step "profile-logits-$ln-detail" 120 "$NCU --clock-control none --cache-control none -k regex:k_logits_small \
            --launch-skip 8 --launch-count 1 --set full --import-source yes -f -o $WORK/logits_${ln}_t32 $BENCH --gemm fp8 \
            --cuda-kernels $lk --tokens 32 --quick --json $WORK/bench/logits_${ln}_d.json --dir $WORK/bench \
            --threads $JOBS >/dev/null && $NCU -i $WORK/logits_${ln}_t32.ncu-rep --section WarpStateStats \
            --section LaunchStats --section SpeedOfLight && $NCU -i $WORK/logits_${ln}_t32.ncu-rep --page source --csv \
            --print-source sass >$WORK/logits_${ln}_t32_sass.csv && $PY ci/ncu-stall-regions.py $WORK/logits_${ln}_t32_sass.csv"
    done
fi
# DSV4_DEVCHECK_PROFILE=route-opt: k_router_count's code size against its speed. Its one block
# runs the step's routing and grouping code once, through instruction caches that hold none of it
# (most of its warp samples wait on instruction fetch, docs/cuda.md), so fewer SASS lines may beat
# better-scheduled ones: router_count.cu alone rebuilt with NVVM and ptxas at -O1 (106 -> 54 KB of
# SASS) in build/ro, its k_router_count timed against the default build's at T 1, 8 and 32 (warm,
# Nsight Compute, alternating), then test_cuda's small and fp8 Tcases from that build (the same
# ids and clamp counters as the reference: the routing may not change).
if profile route-opt && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    step build-route-o1 240 "make cuda BUILD=build/ro NVCC_ROUTER_FLAGS='-Xcicc -O1 -Xptxas -O1' -j$JOBS"
    for rt in 1 8 32; do
        for rv in default o1; do
            rb=$BENCH
            [ "$rv" = o1 ] && rb=build/ro/cuda/bench_cuda
            step "profile-routeopt-t$rt-$rv" 90 "$NCU --clock-control none --cache-control none -k regex:k_router_count \
                --launch-skip 30 --launch-count 8 --metrics gpu__time_duration.sum --print-summary per-kernel $rb \
                --gemm fp8 --tokens $rt --quick --json $WORK/bench/routeopt_${rv}_$rt.json --dir $WORK/bench \
                --threads $JOBS"
        done
    done
    for rc in small fp8; do
        step "cuda-test-routeopt-$rc" 200 "CK_RUN_CASE=$rc DSV4MOE_CUDA_REQUIRED=1 DSV4MOE_TMP=$WORK/cuda-tmp \
            DSV4MOE_SRC=\$(pwd) DSV4MOE_PYTHON=$PY build/ro/cuda/test_cuda"
    done
fi
# DSV4_DEVCHECK_PROFILE=decode: the decode step's kernel variants (params route=one: the one-launch
# router; shared_dec=one: the shared expert in the routed decode launches; quant=fold: h quantized
# in gate/up's launch, so three launches a step; dec_pf=l2: each decode block's weights prefetched
# into L2 at its start; dec_regs=128: the decode kernels without spills): the whole layer at T = 1,
# 8, 32 and 128 for the default, route=one, the three-launch step, it with dec_pf=l2, with both and
# with persistent decode blocks (dec_sched=persist)
# (bench_cuda --quick, fp8 mode, alternating; DSV4_DEVCHECK_PASSES passes, default 1), every kernel's time at T = 1 with
# all of them (warm, Nsight Compute), and their decode GEMMs at T = 1 in detail (throughput,
# occupancy, warp states).
# bench_variants PREFIX TOKENS PASS PARAMS...: the whole layer (bench_cuda --quick, fp8 mode) at
# TOKENS for each --cuda-kernels PARAMS ("default": none), steps PREFIX-TAG-PASS, JSONs
# PREFIX_TAG_PASS.json (TAG: PARAMS with ',' and '=' as '-' and '_'); BV_EXTRA: more arguments;
# BV_CAP: each step's cap in seconds (60)
BV_EXTRA=
bench_variants() {
    bprefix=$1 btok=$2 bpass=$3
    shift 3
    for v in "$@"; do
        tag=$(echo "$v" | tr ',=' '-_')
        kv=$v
        [ "$v" = default ] && kv="''"
        # 60 s a step (BV_CAP), 240 while bench_cuda's v4-flash layer is not generated yet (about a
        # minute on the device; bench-cuda-fp8 generates it first unless skipped)
        bcap=${BV_CAP:-60}
        [ -f "$WORK/bench/cuda_v4-flash_l5.safetensors" ] || bcap=240
        step "$bprefix-$tag-$bpass" "$bcap" "$BENCH --gemm fp8 --cuda-kernels $kv --tokens $btok --quick $BV_EXTRA \
            --json $WORK/bench/${bprefix}_${tag}_$bpass.json --dir $WORK/bench --threads $JOBS"
        # the run in the manifest that ci/variant-table.py reads (step "variant-table", at the end)
        printf '%s\t%s\t%s\t%s\n' "$bprefix" "$v" "$bpass" "${bprefix}_${tag}_$bpass.json" >>"$WORK/bench/variants.tsv"
    done
}
DEC_3="route=one,shared_dec=one,quant=fold"
DEC_ALL="$DEC_3,dec_pf=l2,dec_regs=128"
if profile decode && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    for p in $(seq 1 "${DSV4_DEVCHECK_PASSES:-1}"); do
        bench_variants decode 1,8,32,128 "$p" default route=one $DEC_3 $DEC_3,dec_pf=l2 $DEC_ALL \
            $DEC_ALL,dec_sched=persist
    done
    step profile-decode-t1 120 "$NCU --clock-control none --cache-control none --launch-skip 60 --launch-count 60 \
        --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 --cuda-kernels $DEC_ALL \
        --tokens 1 --quick --json $WORK/bench/decode_p.json --dir $WORK/bench --threads $JOBS"
    step profile-decode-dec 150 "$NCU --clock-control none --cache-control none -k regex:k_dec --launch-skip 16 \
        --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section LaunchStats $BENCH --gemm fp8 --cuda-kernels $DEC_ALL --tokens 1 \
        --quick --json $WORK/bench/decode_d.json --dir $WORK/bench --threads $JOBS"
fi
# DSV4_DEVCHECK_PROFILE=fill: the decode step at small T against two changes: the decode
# launches' K split (params dec_fill: K is split until a launch has that many blocks per
# multiprocessor; 3 by default, 1 splits nothing at T = 1 on v4-flash, so each warp streams all
# of its tile's K blocks) and the one-launch router (route=one). The whole layer at T 1, 2, 4, 8 and 16 for each (bench_cuda --quick, fp8 mode, two
# alternating passes); every kernel's time at T = 1 for each (warm, Nsight Compute); then
# k_route_small at T = 1 in detail: warp states, memory, launch and the per-instruction stall
# samples of its SASS (the source page as CSV, in the step's log).
if profile fill && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    for p in 1 2; do
        bench_variants fill 1,2,4,8,16 "$p" default dec_fill=1 dec_fill=2 route=one
    done
    for f in default dec_fill=1 route=one; do
        tag=$(echo "$f" | tr ',=' '-_')
        kv=$f
        [ "$f" = default ] && kv="''"
        step "profile-fill-$tag" 90 "$NCU --clock-control none --cache-control none --launch-skip 60 \
            --launch-count 40 --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
            --cuda-kernels $kv --tokens 1 --quick --json $WORK/bench/fill_p_$tag.json --dir $WORK/bench \
            --threads $JOBS"
    done
    step profile-route-one-detail 150 "$NCU --clock-control none --cache-control none -k regex:k_route_small \
        --launch-skip 30 --launch-count 1 --set full --import-source yes -f -o $WORK/route_one_t1 $BENCH --gemm fp8 \
        --cuda-kernels route=one --tokens 1 --quick --json $WORK/bench/route_one_d.json --dir $WORK/bench \
        --threads $JOBS >/dev/null && $NCU -i $WORK/route_one_t1.ncu-rep --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section LaunchStats --section SpeedOfLight && \
        $NCU -i $WORK/route_one_t1.ncu-rep --page source --csv --print-source sass >$WORK/route_one_t1_sass.csv && \
        $PY ci/ncu-stall-regions.py $WORK/route_one_t1_sass.csv && cat $WORK/route_one_t1_sass.csv"
fi
# DSV4_DEVCHECK_PROFILE=ring: the decode launches' deep rings (params dec_ring=deep: about 7 KB of
# each warp's weights in flight instead of 3-4, two blocks per multiprocessor), alone and with the
# K split off (dec_fill=1: each warp streams its tile's whole K, so no partial sums and one wave of
# blocks at T = 1) or lighter (dec_fill=2); dec_fill=1 on the default rings; deep unsplit with the
# combine in its own kernel (combine=kernel); the bulk copies into the deep rings (dec_ring=bulk),
# split and not, and evict-first in L2 (dec_ring=bulk_ef): the whole layer at T 1, 8, 32, 128 and
# 256 for each and the default (bench_cuda
# --quick, fp8 mode, two alternating passes), then every kernel's time at T = 1 and 8 for the
# default and dec_ring=deep|bulk,dec_fill=1 (warm, Nsight Compute).
if profile ring && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    for p in 1 2; do
        bench_variants ring 1,8,32,128,256 "$p" default dec_ring=deep dec_ring=deep,dec_fill=1 dec_ring=deep,dec_fill=2 \
            dec_fill=1 dec_ring=deep,dec_fill=1,combine=kernel dec_ring=bulk dec_ring=bulk,dec_fill=1 \
            dec_ring=bulk_ef,dec_fill=1
    done
    for v in default dec_ring=deep,dec_fill=1 dec_ring=bulk,dec_fill=1; do
        tag=$(echo "$v" | tr ',=' '-_')
        kv=$v
        [ "$v" = default ] && kv="''"
        for rt in 1 8; do
            step "profile-ring-$tag-t$rt" 90 "$NCU --clock-control none --cache-control none --launch-skip 60 \
                --launch-count 40 --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
                --cuda-kernels $kv --tokens $rt --quick --json $WORK/bench/ring_p_${tag}_$rt.json --dir $WORK/bench \
                --threads $JOBS"
        done
    done
fi
# DSV4_DEVCHECK_PROFILE=early: the decode step's overlaps of DRAM streaming with its
# latency-bound kernels, which Nsight Compute's one-kernel replays cannot show: the routed decode
# launches' first-wave blocks prefetching their weights during the routing chain and k_quant
# (dec_pf=early), the shared expert's gate/up forked beside the router (shared_gu=early), both,
# and both with quant=auto: the whole layer at T 1, 4, 8, 32 and 128 (bench_cuda --quick, fp8
# mode, DSV4_DEVCHECK_PASSES alternating passes, default 2), then a replayed step's kernels as
# the GPU ran them (bench_cuda --timeline 20) at T 1 and 8 for the default and both.
if profile early && [ -x "$BENCH" ]; then
    EARLY_BOTH="dec_pf=early,shared_gu=early"
    for p in $(seq 1 "${DSV4_DEVCHECK_PASSES:-2}"); do
        bench_variants early 1,4,8,32,128 "$p" default dec_pf=early shared_gu=early $EARLY_BOTH \
            $EARLY_BOTH,quant=auto
    done
    BV_EXTRA="--timeline 20"
    bench_variants early-tl 1,8 1 default $EARLY_BOTH
    BV_EXTRA=
fi
# DSV4_DEVCHECK_PROFILE=latency: the decode step's launch and code-fetch latencies: h quantized in
# the down projection, no k_quant (quant=down), alone, with dec_pf=early,shared_gu=early and in the
# three-launch step (route=one,shared_dec=one); k_router_count compiled for the decode configuration
# (route_code=lean) and with its dry pass before the wait (route_code=warm), alone and with
# quant=down; every one of them at once: the whole layer at T 1, 4, 8, 32 and 128 (bench_cuda
# --quick, fp8 mode, DSV4_DEVCHECK_PASSES alternating passes, default 2), then a replayed step's
# kernels as the GPU ran them (bench_cuda --timeline 20) at T 1 and 8 for the default and all at once.
if profile latency && [ -x "$BENCH" ]; then
    LAT_ALL="dec_pf=early,shared_gu=early,quant=down,route_code=warm"
    for p in $(seq 1 "${DSV4_DEVCHECK_PASSES:-2}"); do
        bench_variants latency 1,4,8,32,128 "$p" default quant=down dec_pf=early,shared_gu=early,quant=down \
            route=one,shared_dec=one,quant=down route_code=lean route_code=warm route_code=warm,quant=down $LAT_ALL
    done
    BV_EXTRA="--timeline 20"
    bench_variants latency-tl 1,8 1 default $LAT_ALL
    BV_EXTRA=
fi
# DSV4_DEVCHECK_PROFILE=timeline: the decode step's kernels as a replayed graph runs them
# (bench_cuda --timeline 20: CUPTI's kernel records of 20 more calls after the timed ones; per
# kernel the medians of its start, duration and the GPU's idle before it, and the step's span and
# busy time, in the step's log and each row's "timeline" in the JSON) at T 1, 8 and 32, fp8 mode,
# io stream, graph off and on, for the default and each of DSV4_DEVCHECK_TIMELINE_VARIANTS (default:
# the decode launches' deep unsplit rings, the same fed by evict-first bulk copies, the lean
# router: group=warp,weights=warp,logits_loop=on, and every decode variant at once in its two
# forms, gpu.yaml's decode-all cases: the three-launch step on the lean router, and the bulk-copy
# rings unsplit with quant=fold on it).
LEAN_ROUTER="group=warp,weights=warp,logits_loop=on"
if profile timeline && [ -x "$BENCH" ]; then
    BV_EXTRA="--timeline 20"
    bench_variants timeline 1,8,32 1 default \
        ${DSV4_DEVCHECK_TIMELINE_VARIANTS:-dec_ring=deep,dec_fill=1 dec_ring=bulk_ef,dec_fill=1 $LEAN_ROUTER \
        $DEC_3,$LEAN_ROUTER dec_ring=bulk,dec_fill=1,quant=fold,$LEAN_ROUTER}
    BV_EXTRA=
fi
# DSV4_DEVCHECK_PROFILE=prefill: every kernel's time at T = 4096 and 16384 in fp8 mode (Nsight
# Compute, its default cache flush; the grouped FP8 GEMMs and every kernel around them), the
# kernel lists a prefill step is judged by; then the prefill variants against the default: the
# large chunks' router logits on cuBLASLt (logits=blas), with x quantized once after the grouping
# and gathered there (gather=quant), and with the router a warp a token (router=warp, which implies
# gather=quant): the whole layer at T 1024, 4096 and 16384 (bench_cuda --quick, fp8 mode, two
# alternating passes) and the last one's kernels at T = 4096.
if profile prefill && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    for pt in 4096 16384; do # (not t or cc: step uses those)
        step "profile-prefill-t$pt" 200 "$NCU --clock-control none --launch-skip 40 --launch-count 40 \
            --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 --tokens $pt --quick \
            --json $WORK/bench/prefill_$pt.json --dir $WORK/bench --threads $JOBS"
    done
    BV_CAP=120 # three prefill sizes a step, T = 16384's input generated by the first
    for p in 1 2; do
        bench_variants prefill 1024,4096,16384 "$p" default logits=blas logits=blas,gather=quant \
            logits=blas,router=warp
    done
    BV_CAP=
    step "profile-prefill-blas-t4096" 200 "$NCU --clock-control none --launch-skip 40 --launch-count 40 \
        --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
        --cuda-kernels logits=blas,router=warp --tokens 4096 --quick --json $WORK/bench/prefill_blas_4096.json \
        --dir $WORK/bench --threads $JOBS"
fi
# DSV4_DEVCHECK_PROFILE=flip: the variants whose identity tests have passed on a device but which
# are not the default, and the former defaults, timed as whole layers only (no profiler, a few
# minutes): the decode step at T 1, 8, 32, 128 and 256 with k_router_count's grouping and weights
# by one warp (group=warp,weights=warp) and each alone, the decode launches' deep rings unsplit
# (dec_ring=deep / bulk / bulk_ef with dec_fill=1), the small chunks' unrolled logits
# (logits_loop=off), and the three-launch step's parts alone (route=one, shared_dec=one,
# quant=fold; quant=auto, fold but at T = 1), the decode launches' first-wave prefetch during the
# routing chain (dec_pf=early) alone and with quant=auto, the shared gate/up forked beside the
# router (shared_gu=early) alone and with dec_pf=early; the prefill at T 1024, 4096 and 16384 with the
# former defaults (the logits on k_tiles, logits=tiles; the block router, router=block; both), x
# gathered by k_gather8 (gather=copy, on the block router) and k_quant8's former instructions
# (quant8=std);
# DSV4_DEVCHECK_PASSES alternating passes (default 2). The step "variant-table" then puts each
# against the default of its pass (ci/variant-table.py).
if profile flip && [ -x "$BENCH" ]; then
    for p in $(seq 1 "${DSV4_DEVCHECK_PASSES:-2}"); do
        bench_variants flipd 1,8,32,128,256 "$p" default group=warp,weights=warp weights=warp group=warp \
            dec_ring=deep,dec_fill=1 dec_ring=bulk,dec_fill=1 dec_ring=bulk_ef,dec_fill=1 logits_loop=off \
            route=one shared_dec=one quant=fold quant=auto dec_pf=early dec_pf=early,quant=auto \
            shared_gu=early shared_gu=early,dec_pf=early
        BV_CAP=120
        bench_variants flipp 1024,4096,16384 "$p" default logits=tiles router=block logits=tiles,router=block \
            gather=copy quant8=std
        BV_CAP=
    done
fi
# DSV4_DEVCHECK_PROFILE=direct: the routed fp4 experts' tile groups on k_tile8 (params direct=b128,
# b64, q64: fp8 wgmma from the fp4 weights, the SwiGLU in its epilogue, with q64 the quantization of
# h too) against the default's grouped
# FP8 GEMM on the e4m3 copies: the whole layer at T 1024, 4096 and 16384 (bench_cuda --quick, fp8
# mode; DSV4_DEVCHECK_PASSES alternating passes, default 1), then every kernel's time at T = 4096
# with direct=q64 (Nsight Compute).
if profile direct && [ -x "$BENCH" ]; then
    BV_CAP=120
    for p in $(seq 1 "${DSV4_DEVCHECK_PASSES:-1}"); do
        bench_variants direct 1024,4096,16384 "$p" default direct=b128 direct=b64 direct=q64
    done
    BV_CAP=
    if [ -x "$NCU" ]; then
        step "profile-direct-t4096" 200 "$NCU --clock-control none --launch-skip 40 --launch-count 40 \
            --metrics gpu__time_duration.sum --print-summary per-kernel $BENCH --gemm fp8 \
            --cuda-kernels direct=q64 --tokens 4096 --quick --json $WORK/bench/direct_4096.json \
            --dir $WORK/bench --threads $JOBS"
    fi
fi
if profile 1 && [ -x "$BENCH" ] && [ -x "$NCU" ]; then
    for t in 1 128 4096; do
        step "profile-t$t" 150 "$NCU --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
            $BENCH --tokens $t --quick --ceilings $WORK/bench/ceilings.json --json $WORK/bench/prof_$t.json \
            --dir $WORK/bench --threads $JOBS"
    done
    # one decode GEMM (T = 128) and one large-group GEMM (T = 4096) in detail: throughput, occupancy, stalls
    SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section LaunchStats --section ComputeWorkloadAnalysis"
    step profile-dec 150 "$NCU --clock-control none -k regex:k_dec --launch-skip 8 --launch-count 2 $SECT \
        $BENCH --tokens 128 --quick --ceilings $WORK/bench/ceilings.json \
        --json $WORK/bench/prof_d.json --dir $WORK/bench --threads $JOBS"
    step profile-tileh 150 "$NCU --clock-control none -k regex:k_tileh --launch-skip 2 --launch-count 2 $SECT \
        $BENCH --tokens 4096 --quick --ceilings $WORK/bench/ceilings.json \
        --json $WORK/bench/prof_h.json --dir $WORK/bench --threads $JOBS"
fi

# ---- CUDA tests, scenarios, sanitizer (cuda_tests above, unless DSV4_DEVCHECK_TESTS_FIRST=1 ran them) ----
[ "${DSV4_DEVCHECK_TESTS_FIRST:-0}" = 1 ] || cuda_tests
# ---- the NCCL communicator on one GPU (docs/nccl.md; several GPUs are not lent) ----
if [ -f tests/nccl/device-run.sh ]; then
    step nccl 150 "OUT=$WORK bash tests/nccl/device-run.sh"
else
    absent nccl "tests/nccl/device-run.sh not there"
fi

# ---- outside engines (docs/engines.md): HF transformers' block held by dsv4moe check with the
# defect table; a real NCCL flight-recorder dump (world of one) and divergent copies through symmetry ----
mkdir -p "$WORK/engines"
if $PY -c 'import torch, transformers' 2>/dev/null; then
    step hf-engine 240 "PYTHONUNBUFFERED=1 $PY ci/hf_engine_check.py --cli build/dsv4moe --work $WORK/hf-engine \
        --json $WORK/engines/hf_engine.json"
    step hf-engine-bf16 240 "PYTHONUNBUFFERED=1 $PY ci/hf_engine_check.py --cli build/dsv4moe --dtype bfloat16 \
        --work $WORK/hf-engine-bf16 --json $WORK/engines/hf_engine_bf16.json"
    step flight-recorder 90 "$PY ci/record_flight_recorder.py $WORK/engines/flight-recorder --cli build/dsv4moe"
else
    absent hf-engine "no torch or transformers for $PY"
    absent flight-recorder "no torch for $PY"
fi
if $PY -c 'import torch' 2>/dev/null; then
    step torch-engine 180 "PYTHONUNBUFFERED=1 $PY ci/torch_engine_check.py --cli build/dsv4moe --work $WORK/torch-engine \
        --json $WORK/engines/torch_engine.json"
    step torch-engine-fp8 180 "PYTHONUNBUFFERED=1 $PY ci/torch_engine_check.py --cli build/dsv4moe --gemm fp8 \
        --work $WORK/torch-engine-fp8 --json $WORK/engines/torch_engine_fp8.json"
else
    absent torch-engine "no torch for $PY"
fi

# ---- embedding (docs/embedding.md): the Python package over build/cuda/libdsv4moe.so in
# torch: graph capture between torch ops, a shared caller workspace, a latched bad id, HF's block
# patched (bf16 and fp4/fp8) and timed next to the unpatched one; embed.json goes into engines.tar.gz ----
if [ -f build/cuda/libdsv4moe.so ] && [ -x build/cuda/dsv4moe ] && \
    $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    step embed 240 "PYTHONUNBUFFERED=1 $PY ci/embed_check.py --cli build/cuda/dsv4moe --lib build/cuda/libdsv4moe.so \
        --work $WORK/embed --json $WORK/engines/embed.json ${DSV4_EMBED_ARGS:-}"
else
    absent embed "no build/cuda/libdsv4moe.so and build/cuda/dsv4moe, or no torch with CUDA for $PY"
fi

# every params variant timed in this call against the default of its pass
if [ -s "$WORK/bench/variants.tsv" ]; then
    step variant-table 30 "$PY ci/variant-table.py $WORK/bench/variants.tsv"
    cp "$WORK/bench/variants.tsv" "$LOGS/variants.tsv"
fi

# ---- bundle (at most 8 files under $OUT) ----
[ -f "$WORK/bench/bench_cuda.json" ] && cp "$WORK/bench/bench_cuda.json" "$OUT/bench_cuda.json"
[ -f "$WORK/bench/bench_cuda_fp8.json" ] && cp "$WORK/bench/bench_cuda_fp8.json" "$OUT/bench_cuda.json"
if ls "$WORK"/bench/*.json >/dev/null 2>&1; then
    (cd "$WORK" && tar -czf - bench/*.json) >"$OUT/bench.tar.gz"
fi
cp "$WORK/steps.tsv" "$LOGS/steps.tsv"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
# the scenario report without a large HTML page (the JSON and JUnit hold every number)
find "$WORK/gpu" -name report.html -size +8M -delete 2>/dev/null
[ -d "$WORK/gpu" ] && tar -czf "$OUT/gpu-report.tar.gz" -C "$WORK" gpu 2>/dev/null
# the HF table (JSON) and the flight-recorder dumps, with the HF check reports
cp -r "$WORK/hf-engine"/report-* "$WORK/engines/" 2>/dev/null
for d in hf-engine-bf16 torch-engine torch-engine-fp8; do
    mkdir -p "$WORK/engines/$d" && cp -r "$WORK/$d"/report-* "$WORK/engines/$d/" 2>/dev/null
done
[ -n "$(ls -A "$WORK/engines" 2>/dev/null)" ] && tar -czf "$OUT/engines.tar.gz" -C "$WORK" engines 2>/dev/null

# ---- the short table, last ----
T_TOTAL=$(($(date +%s) - T_START))
$PY ci/device-table.py --steps "$WORK/steps.tsv" --bench "$WORK/bench" --out "$OUT" --seconds "$T_TOTAL" \
    2>&1 | tee "$OUT/summary.txt"
[ -f "$LOGS/variant-table.log" ] && tee -a "$OUT/summary.txt" <"$LOGS/variant-table.log"
grep -q "$(printf '\tfail\t')" "$WORK/steps.tsv" && exit 1
exit 0
