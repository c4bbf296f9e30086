/*
 * dsv4moe: the backend interface. A backend executes a plan on one rank:
 * created from a config, a checkpoint and the plan (which decides the
 * layout; the backend only executes it), it runs forwards, reports its
 * workspace and statistics, and is freed. Implementations: "ref" (the
 * deterministic reference), "cpu" (OpenBLAS) and, in a library built with
 * DSV4_WITH_CUDA (`make cuda`: build/cuda/libdsv4moe.a), "cuda" (one sm_90 GPU,
 * docs/cuda.md). A build without CUDA answers DSV4_ERR_UNSUPPORTED for cuda. The registry
 * (dsv4_backend_count, dsv4_backend_info_*) says which backends a library holds and this
 * machine runs; the planner takes each backend's memory model from it.
 */
#ifndef DSV4MOE_BACKEND_H
#define DSV4MOE_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_backend dsv4_backend;

/* Outputs of one forward; the caller owns the buffers. y is required, the others may be NULL. */
typedef struct dsv4_forward_out {
    uint16_t *y;          /* bf16 [T, H] */
    int32_t *topk_ids;    /* [T, K] after pruning (pruned slots E) */
    float *topk_weights;  /* [T, K] after pruning (pruned slots 0) */
    int32_t *kept_counts; /* [T] */
} dsv4_forward_out;

typedef struct dsv4_backend_stats {
    uint64_t forwards;
    uint64_t tokens;
    uint64_t launches;          /* expert GEMM groups executed */
    uint64_t empty_skips;       /* experts or chunks with 0 rows that launched nothing */
    uint64_t nonfinite_rows;
    uint64_t routed_g_clamped, routed_u_clamped, shared_g_clamped, shared_u_clamped;
    uint64_t workspace_peak;    /* measured through the accounting allocator */
    uint64_t workspace_planned; /* dsv4_plan_workspace_max of the plan */
    /* Added for the cuda backend (0 elsewhere): */
    uint64_t graph_replays;       /* forwards that replayed a captured CUDA graph */
    uint64_t workspace_allocated; /* bytes of the one workspace allocated at creation */
    uint64_t device_allocated;    /* device memory taken at creation (weights + workspace),
                                     measured with cudaMemGetInfo before and after */
    uint64_t gemm_fp8;            /* 1 when large expert groups run on FP8 tensor cores (gemm fp8,
                                     SPEC.md section 9), 0 for the exact mode and for ref and cpu */
    uint64_t fp8_exact_experts;   /* gemm fp8: experts (the shared one included) kept on the exact
                                     kernels because an fp4 128-group's scales could not convert to
                                     e4m3 exactly (include/dsv4moe/formats.h, DSV4_FP4_TO_FP8_SPREAD) */
    uint64_t fp8_scale_rows;      /* gemm fp8: rows per weight scale of the FP8 GEMM's e4m3 weights,
                                     128 (one per 128x128 block: the faster kernel) or 1 (one per row
                                     and 128 of K, when a block would leave an expert that converts
                                     per row to the exact kernels); 0 otherwise */
    uint64_t weights_allocated;   /* device bytes of the weights bound at creation, as allocated: the
                                     router's and the plan's shard (its experts, its inter range);
                                     within dsv4_plan_weight_bytes */
    uint64_t fp8_direct;          /* gemm fp8 with params direct=b128|b64|q64: 1 when the routed fp4
                                     experts' tile groups read the fp4 weights on fp8 wgmma (k_tile8)
                                     instead of the grouped FP8 GEMM's e4m3 copies, which are then not
                                     made; 0 otherwise (not asked for, or a layer some routed expert of
                                     which does not convert exactly) */
} dsv4_backend_stats;

/* Options of dsv4_backend_create_with; versioned: fill with dsv4_backend_options_init. */
typedef struct dsv4_backend_options {
    uint32_t struct_size; /* sizeof(dsv4_backend_options), set by init. The layout of dsv4moe 0.1,
                             with the fields cpu_kernels and cuda_kernels (now params), is refused by
                             name (DSV4_ERR_INVALID_ARG). */
    int threads;          /* worker threads, [1, 256]; init: 1 */
    /* cuda backend: a device workspace the caller owns (NULL, the init value: the backend
       allocates its own). At least dsv4_backend_workspace_size(plan, n) bytes for some n >= 1,
       256-byte aligned, on the backend's device; it must outlive the backend. The backend then
       runs chunks of the largest token count whose layout fits (at least n), allocates no
       workspace of its own, and keeps nothing in it between calls: backends whose calls are
       ordered on one stream may share one workspace (a server's MoE layers). ref and cpu refuse a
       non-NULL workspace (DSV4_ERR_UNSUPPORTED): they have no device. */
    void *workspace;
    uint64_t workspace_bytes;
    /* The backend's own parameters, for measurements and A/B runs: a comma-separated list of
       key=value that the plan's backend parses at creation (NULL or "", the init value: its
       defaults). Each backend documents its keys: cpu, docs/cpu.md ("Parameters": the kernel
       table); cuda, docs/cuda.md ("Parameters": the kernel variants); ref takes none. An unknown
       key or value is refused (DSV4_ERR_INVALID_ARG, naming it and the keys the backend takes); a
       list given to a backend that takes no parameters is DSV4_ERR_UNSUPPORTED. */
    const char *params;
} dsv4_backend_options;

DSV4_API void dsv4_backend_options_init(dsv4_backend_options *opt);

/* dsv4_backend_create with options (opt NULL: the defaults of dsv4_backend_options_init). */
DSV4_API dsv4_status dsv4_backend_create_with(const dsv4_plan *plan, const dsv4_checkpoint *ckpt,
                                              const dsv4_backend_options *opt, dsv4_backend **out, dsv4_error *err);

/*
 * Creates the backend named by plan's topology (ref, cpu or cuda). The config must
 * be the plan's; the checkpoint must outlive the backend (cuda copies the weights to
 * the device at creation). threads >= 1. cuda: topology.cuda_graph on captures one
 * graph per bucket on first use and replays it for every T up to that bucket
 * (bit-identical to an eager forward); creating two plans (graph on and off) gives both.
 */
DSV4_API dsv4_status dsv4_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt, int threads,
                                         dsv4_backend **out, dsv4_error *err);
/* Whether this build holds the backend (cuda only in a CUDA build), and the list as text. */
DSV4_API bool dsv4_backend_available(dsv4_backend_kind kind);
DSV4_API const char *dsv4_backends_available(void);

/* NULL is a no-op. */
DSV4_API void dsv4_backend_free(dsv4_backend *backend);
DSV4_API const char *dsv4_backend_name(const dsv4_backend *backend);
/* The kernels a backend runs: the cpu backend's table ("ref", "avx2", "avx512", "avx512-bf16" or
   "avx512-vbmi": the one its parameter kernels= chose, never "auto"); the backend's name for the
   others. */
DSV4_API const char *dsv4_backend_kernels(const dsv4_backend *backend);
/* One forward of T tokens on this rank (T >= 0, at most the plan's max_tokens_per_rank). */
DSV4_API dsv4_status dsv4_backend_forward(dsv4_backend *backend, int64_t tokens, const uint16_t *x,
                                          const int32_t *input_ids, dsv4_forward_out *out, dsv4_error *err);
DSV4_API dsv4_backend_stats dsv4_backend_get_stats(const dsv4_backend *backend);

/*
 * One forward on device-resident tensors, as a serving engine holds them (cuda backend only;
 * ref and cpu answer DSV4_ERR_UNSUPPORTED). x is bf16 [T, H], input_ids int32 [T] (hash layers;
 * may be NULL otherwise), and out's pointers (y required, the others optional, as in
 * dsv4_forward_out) are all device memory of the backend's GPU; nothing travels through the
 * host but a few counters. Synchronous: dsv4_backend_enqueue on the backend's own stream (its
 * bucket graphs when the plan has cuda_graph on), then the wait and the poll. Hash-layer ids
 * are checked on the device: an id outside [0, vocab_size) or a tid2eid entry outside [0, E)
 * gives DSV4_ERR_RANGE naming the first such token, and the outputs are then unspecified.
 */
DSV4_API dsv4_status dsv4_backend_forward_device(dsv4_backend *backend, int64_t tokens, const void *x,
                                                 const int32_t *input_ids, const dsv4_forward_out *out,
                                                 dsv4_error *err);

/* ---------------- embedding in a server (docs/embedding.md) ---------------- */

/*
 * The device workspace a backend of this plan needs for calls of up to max_tokens tokens
 * (1 <= max_tokens; above the plan's chunk the chunk's bytes: longer calls run in chunks):
 * *bytes, an upper bound for every checkpoint of the plan's config on the current device
 * (the layout depends on its SM count). 0 for ref and cpu, which use host memory they allocate
 * themselves. DSV4_ERR_INVALID_ARG for NULL arguments or max_tokens < 1.
 */
DSV4_API dsv4_status dsv4_backend_workspace_size(const dsv4_plan *plan, int64_t max_tokens, uint64_t *bytes,
                                                 dsv4_error *err);

/*
 * Enqueues one forward on the caller's stream (a cudaStream_t passed as void *; NULL is the
 * legacy default stream) and returns at once: no host synchronisation, no allocation, no copy
 * through the host and no host read of a device value, so the call may run inside the caller's
 * own stream capture (cudaStreamBeginCapture, torch.cuda.graph) between the caller's kernels;
 * the graph then replays it with whatever the pointed-to buffers hold at replay time.
 * tokens: the rows of x (a host value, [0, max_tokens_per_rank]; a server captures one graph
 * per bucket). valid_tokens: NULL, or a device int32 read at run time: rows [valid, tokens) are
 * padding (no router, no expert work; their outputs are written as zeros: y 0, ids 0, weights 0,
 * kept 0); a value outside [0, tokens] is clamped. x bf16 [tokens, H], input_ids int32 [tokens]
 * (hash layers, required there), out's pointers as dsv4_forward_out: all device memory.
 * Input checks run on the device and are latched, never reported here: an input id outside
 * [0, vocab_size) (or its tid2eid row outside [0, E)) routes that row to experts 0 .. K-1 and is
 * counted; a non-finite router row takes SPEC.md's fallback routing (the reference's outputs)
 * and is counted. dsv4_backend_poll_error reports them. The return value covers only what the
 * host sees: arguments (DSV4_ERR_INVALID_ARG), a launch error (DSV4_ERR_DEVICE), and ref and cpu,
 * which answer DSV4_ERR_UNSUPPORTED (they have no device; use dsv4_backend_forward).
 * Stats: forwards, tokens and launches-of-shared are counted at enqueue; the device counters
 * (clamps, non-finite rows, active groups) are folded in by the next poll or synchronous call.
 */
DSV4_API dsv4_status dsv4_backend_enqueue(dsv4_backend *backend, void *stream, int64_t tokens,
                                          const int32_t *valid_tokens, const void *x, const int32_t *input_ids,
                                          const dsv4_forward_out *out, dsv4_error *err);

/* What the device latched since the last poll (dsv4_backend_poll_error); versioned. */
typedef struct dsv4_device_errors {
    uint32_t struct_size;      /* sizeof(dsv4_device_errors): the caller sets it */
    uint64_t bad_input_ids;    /* rows whose input id (or its tid2eid row) was out of range */
    int64_t first_bad_input;   /* the lowest such row index within its call, -1 when none */
    uint64_t nonfinite_rows;   /* router rows with a non-finite logit or score (fallback routed) */
    uint64_t bad_expert_ids;   /* slots that held an expert id outside [0, E]: a library bug */
} dsv4_device_errors;

/*
 * Reads and clears the device error word of enqueued calls, like cudaGetLastError. stream: the
 * caller's stream the calls ran on, synchronised first (NULL: the whole device is); this is the
 * only call that waits. Returns DSV4_ERR_RANGE naming the first bad input id, else
 * DSV4_ERR_INTERNAL for bad expert ids, else DSV4_ERR_NUMERIC when rows were non-finite (their
 * outputs are still the reference's), else DSV4_OK; DSV4_ERR_DEVICE when the synchronisation
 * reports a device error. out (may be NULL) gets the counts. ref and cpu: DSV4_OK, zero counts
 * (their forwards report errors themselves). Synchronous calls read and clear the word too.
 */
DSV4_API dsv4_status dsv4_backend_poll_error(dsv4_backend *backend, void *stream, dsv4_device_errors *out,
                                             dsv4_error *err);

/*
 * Thread safety. Creation, the registry and dsv4_backend_workspace_size may run on any threads
 * at once. One backend is used by one thread at a time: forward, forward_device, enqueue, poll
 * and get_stats on the same backend must not overlap (the backend's per-call state, its forked
 * streams and events, its fp8 GEMM argument arrays and its counters are shared), and its
 * enqueued calls must be ordered on one stream at a time. Different backends are independent
 * and may run on different threads and streams, except that backends sharing one caller
 * workspace must have their calls ordered on one stream.
 */

/* ---------------- the backend registry ---------------- */

/* What the registry knows of one backend. */
typedef struct dsv4_backend_info {
    uint32_t struct_size;   /* sizeof(dsv4_backend_info), set by the library */
    const char *name;       /* "ref", "cpu", "cuda" (static storage) */
    dsv4_backend_kind kind;
    bool built;             /* compiled into this library (cuda: `make cuda`) */
    bool available;         /* built, and this machine can run it (cuda: a device) */
    bool sharded;           /* runs ranks of sharded plans (ep > 1, tp > 1) through its stages */
    char why[160];          /* why it is not available; "" when it is */
} dsv4_backend_info;

/* The number of registered backends (every kind, built or not). */
DSV4_API int dsv4_backend_count(void);
/* Their names in kind order as text for a message: "ref, cpu or cuda" (static storage). */
DSV4_API const char *dsv4_backends_registered(void);
/* The index-th backend (0 .. count - 1), in dsv4_backend_kind order; DSV4_ERR_RANGE outside. */
DSV4_API dsv4_status dsv4_backend_info_at(int index, dsv4_backend_info *out, dsv4_error *err);
/* The backend of a kind; DSV4_ERR_INVALID_ARG for an unknown kind. */
DSV4_API dsv4_status dsv4_backend_info_of(dsv4_backend_kind kind, dsv4_backend_info *out, dsv4_error *err);
/*
 * Whether the plan's backend can execute the plan here: DSV4_OK, or DSV4_ERR_UNSUPPORTED with a
 * message naming what is missing (not built, no device on this machine, a sharded plan for a
 * backend without stages). dsv4_backend_create asks this first.
 */
DSV4_API dsv4_status dsv4_backend_plan_supported(const dsv4_plan *plan, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
