/*
 * Internal: test control of the library, for test builds only (SQLite's sqlite3_test_control and
 * testcase() are the model). Not installed; nothing of it reaches the release library.
 *
 * A hook is a place in the library that can be made to behave as a known defect does, named by
 * that behaviour. Each call site is one line, `if (DSV4_TESTHOOK(DROP_ROUTED_CLAMP)) ...`. Hooks
 * are compiled in only with -DDSV4_FAULTS (`make faults`, objects under build/faults/); in the
 * release build DSV4_TESTHOOK is the constant 0, every hook folds away, and
 * `nm build/libdsv4moe.a | grep -i -e fault -e testctl -e hook` is empty. The reference (ref/) has no hook:
 * it must never carry a defect.
 *
 * Which review finding a hook reproduces is not written here: scenarios/seed-review.yaml maps
 * the findings (f01 .. f14, no f07) to hooks, and the fault run (harness/fault_runs.h) reads it.
 *
 * A hook's value is a 64-bit word, 0 when off. Most hooks are on or off (any nonzero value is on);
 * SKIP_METADATA_COLLECTIVE is a mask of ranks (bit r: rank r skips; all ones: every rank).
 * The state is process-wide: set it while no forward runs.
 */
#ifndef DSV4MOE_CORE_TESTCTL_H
#define DSV4MOE_CORE_TESTCTL_H

#include <stdint.h>

typedef enum dsv4_test_hook {
    DSV4_HOOK_NONE = 0,
    /* the fp8 per-block executor family runs the routed experts without the SwiGLU clamp
       (fast/cpu/ffn.c dsv4_cpu_ffn(), fast/cuda/cuda.cu) */
    DSV4_HOOK_DROP_ROUTED_CLAMP,
    /* one rank with dispatch all_gather is refused, the message naming the quantization, ep and
       parallelism instead of the dispatch (fast/plan/plan.c check_topology()) */
    DSV4_HOOK_REFUSE_SINGLE_RANK_ALL_GATHER,
    /* ranks that could replay a graph skip the step's metadata collective, a mask of ranks
       (fast/multirank/driver.c rank_main()) */
    DSV4_HOOK_SKIP_METADATA_COLLECTIVE,
    /* cuda_graph on sm 10x falls back to the masked executor, never validated under replay there
       (fast/plan/plan.c check_topology(), plan_graph()) */
    DSV4_HOOK_MASKED_GRAPH_ON_SM10X,
    /* the stacked-layout flag is decided by the last file alone (core/checkpoint.c detect_layout()) */
    DSV4_HOOK_LAYOUT_FROM_LAST_FILE,
    /* non-e8m0 online quantization delivers the shared expert's 2D weights as [K, N]
       (core/weights.c matrix_stacked()) */
    DSV4_HOOK_TRANSPOSE_SHARED_2D,
    /* long prefills run unchunked: the workspace grows with T beyond the plan's bound
       (fast/cpu/cpu.c dsv4_cpu_backend_create()) */
    DSV4_HOOK_UNCHUNKED_PREFILL,
    /* the refusal of fp8 + ep > 1 + cuda_graph does not name cuda_graph (fast/plan/plan.c) */
    DSV4_HOOK_REFUSAL_OMITS_CUDA_GRAPH,
    /* a step where every rank is empty still runs a zero-size chunk (fast/multirank/driver.c rank_main()) */
    DSV4_HOOK_ZERO_SIZE_CHUNK,
    /* the router builds its sanitised ids, weights and mask on every forward, an empty one too
       (fast/cpu/cpu.c cpu_forward()) */
    DSV4_HOOK_ROUTER_WORK_ON_EMPTY,
    /* the top-p sentinel id (= n_routed_experts) reaches an executor unsanitised
       (fast/multirank/driver.c run_chunk()) */
    DSV4_HOOK_KEEP_SENTINEL_IDS,
    /* eager prefill of a graph-enabled single rank enters the masked layout with no token bound
       (fast/plan/plan.c dsv4_plan_create()) */
    DSV4_HOOK_UNBOUNDED_MASKED_PREFILL,
    /* low-latency dispatch is accepted on a non-decode role (fast/plan/plan.c check_topology()) */
    DSV4_HOOK_LOW_LATENCY_ANY_ROLE,
    DSV4_HOOK_COUNT
} dsv4_test_hook;

/* The operations of dsv4_test_control. */
enum {
    DSV4_TESTCTRL_HOOK_SET = 1, /* (dsv4_test_hook, uint64_t value): sets a hook; returns 0, -1 for no such hook */
    DSV4_TESTCTRL_RESET = 2     /* (): every hook off; returns 0 */
};

#ifdef DSV4_FAULTS

/* The one entry point of test control: op and its arguments as above; -1 for an unknown op. */
int dsv4_test_control(int op, ...);
/* A hook's value (0: off). */
uint64_t dsv4_test_hook_value(dsv4_test_hook h);
/* The hook's name, its enumerator's in lower case ("drop_routed_clamp"); NULL for NONE and out of range. */
const char *dsv4_test_hook_name(dsv4_test_hook h);
/* The hook of a name, DSV4_HOOK_NONE for anything else. */
dsv4_test_hook dsv4_test_hook_parse(const char *name);

#define DSV4_TESTHOOK(h) (dsv4_test_hook_value(DSV4_HOOK_##h) != 0)
#define DSV4_TESTHOOK_RANK(h, r) (((dsv4_test_hook_value(DSV4_HOOK_##h) >> ((r) & 63)) & 1u) != 0)

#else

#define DSV4_TESTHOOK(h) 0
#define DSV4_TESTHOOK_RANK(h, r) 0

#endif
#endif
