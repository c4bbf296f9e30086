/*
 * dsv4moe: the NCCL communicator, one process per GPU, behind the same
 * dsv4_comm interface as `sim` (comm.h). Built only by `make nccl` (and the
 * CUDA build): the CPU-only library has no NCCL.
 *
 * Buffers are DEVICE buffers. Every collective is issued on the stream set
 * with dsv4_nccl_set_stream (default: the legacy default stream 0), so a
 * sequence of collectives can be captured into a CUDA graph and replayed.
 *
 * No hang, ever: the communicators are non-blocking (ncclConfig_t.blocking
 * = 0). After issuing, the calling thread is the watchdog: it polls
 * ncclCommGetAsyncError and the completion of the stream (an event recorded
 * after the collective) until both are done or `timeout_ms` passed; on a
 * timeout or an asynchronous NCCL error it calls ncclCommAbort on every
 * NCCL communicator of this rank and the collective returns DSV4_ERR_COMM
 * with a message naming the rank, the collective (op, group with its world
 * ranks, dtype, count, tag) and its sequence number. The endpoint is then
 * poisoned: every later collective fails at once, and dsv4_nccl_comm_free
 * releases everything (no thread of ours survives; we start none).
 * Bootstrap has its own timeout (`init_timeout_ms`): a rank that never joins
 * makes dsv4_nccl_comm_create return DSV4_ERR_COMM naming this rank, the
 * world size and the phase ("ncclCommInitRankConfig", "ncclCommSplit ep").
 *
 * Under CUDA graph capture (the stream is capturing) the collectives are only
 * enqueued: nothing can be waited on. dsv4_nccl_sync after cudaGraphLaunch is
 * the watchdog for the replay. Capture needs every size on the host at
 * capture time: all_to_allv counts are baked into the graph, so a captured
 * all_to_allv must use fixed counts; the planner's symmetric padded step
 * (every chunk, every rank: a fixed-size counts all_gather, then rows padded
 * to a per-peer capacity) gives exactly that (see docs/nccl.md).
 *
 * all_reduce: by default (`native_reduce` false) the group's buffers are
 * all_gathered and summed on the device in ascending group-rank order
 * (bf16 in fp32, rounded once, RNE), the contract of comm.h: the same bits
 * as `sim` and on every rank. `native_reduce` true uses ncclAllReduce(ncclSum):
 * the same bits on every rank of one call, but the order of the additions is
 * NCCL's (ring or tree position, per chunk), not ascending rank, and bf16 is
 * summed in bf16 with a rounding per addition (docs/nccl.md).
 *
 * Debug fingerprint mode (`fingerprint` true): before each eager collective
 * the group all_gathers every rank's record (seq, op, group, dtype, count,
 * counts_hash and, for all_to_allv, the send and receive counts) and every
 * rank compares them; a mismatch returns DSV4_ERR_COMM naming both ranks and
 * both collectives, with the same text as sim, before the real collective is
 * issued. Under capture the exchange is not possible (it needs the host) and
 * is skipped; capture the graph after an eager step of the same sequence.
 */
#ifndef DSV4MOE_COMM_NCCL_H
#define DSV4MOE_COMM_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/comm.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define DSV4_NCCL_ID_HEX_LEN (2 * DSV4_NCCL_ID_BYTES)

typedef struct dsv4_nccl_id {
    unsigned char bytes[DSV4_NCCL_ID_BYTES];
} dsv4_nccl_id;

typedef struct dsv4_nccl_options {
    uint32_t struct_size;  /* sizeof(dsv4_nccl_options), set by init */
    int timeout_ms;        /* collective watchdog (default 60000; DSV4_NCCL_TIMEOUT_MS overrides in _from_env) */
    int init_timeout_ms;   /* bootstrap: id file, init and splits (default 120000) */
    int device;            /* CUDA device; -1: local rank modulo the visible device count */
    bool fingerprint;      /* debug mode above (DSV4_NCCL_FINGERPRINT=1 in _from_env) */
    bool native_reduce;    /* all_reduce through ncclAllReduce instead of gather + ascending sum */
    bool wait;             /* eager collectives wait for completion (default true); false: enqueue only,
                              dsv4_nccl_sync is the watchdog */
} dsv4_nccl_options;

/* Defaults above. NULL is a no-op. */
DSV4_API void dsv4_nccl_options_init(dsv4_nccl_options *opt);

/* ncclGetUniqueId (rank 0, once per world). NCCL starts its bootstrap root thread here. */
DSV4_API dsv4_status dsv4_nccl_unique_id(dsv4_nccl_id *id, dsv4_error *err);
/* 256 lowercase hex digits and a NUL into buf (n >= DSV4_NCCL_ID_HEX_LEN + 1). */
DSV4_API dsv4_status dsv4_nccl_id_to_hex(const dsv4_nccl_id *id, char *buf, size_t n, dsv4_error *err);
/* Exactly 256 hex digits (surrounding whitespace allowed); DSV4_ERR_FORMAT naming the offset otherwise. */
DSV4_API dsv4_status dsv4_nccl_id_from_hex(const char *hex, dsv4_nccl_id *id, dsv4_error *err);
/* Writes the id as hex to path atomically (temporary file + rename), so readers never see half. */
DSV4_API dsv4_status dsv4_nccl_id_write_file(const char *path, const dsv4_nccl_id *id, dsv4_error *err);
/* Waits up to timeout_ms for path to exist, then reads it; DSV4_ERR_COMM naming the path on timeout. */
DSV4_API dsv4_status dsv4_nccl_id_read_file(const char *path, int timeout_ms, dsv4_nccl_id *id, dsv4_error *err);

/*
 * Rank, world size and local rank from the launcher's environment, first
 * found wins: DSV4_RANK / DSV4_WORLD_SIZE / DSV4_LOCAL_RANK; torchrun RANK /
 * WORLD_SIZE / LOCAL_RANK; Open MPI OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK;
 * MPICH and Intel MPI (Hydra) PMI_RANK / PMI_SIZE / MPI_LOCALRANKID; Slurm
 * SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID. local_rank is -1 when no
 * variable gives it. DSV4_ERR_CONFIG naming the variable for a missing or
 * malformed value or rank outside [0, world).
 */
typedef struct dsv4_nccl_env {
    int rank, world, local_rank;
    char rank_var[32], world_var[32]; /* the variables used */
} dsv4_nccl_env;
DSV4_API dsv4_status dsv4_nccl_env_read(dsv4_nccl_env *env, dsv4_error *err);

/*
 * One rank's endpoint of a world of groups->world ranks: ncclCommInitRankConfig
 * on the world, then one ncclCommSplit per group (tp, dp, ep) with the colours
 * of groups (key = world rank, so group ranks ascend with world ranks). Every
 * rank must call it with the same id and groups. Sets the CUDA device first.
 * opt may be NULL (defaults). The result is freed with dsv4_nccl_comm_free.
 */
DSV4_API dsv4_status dsv4_nccl_comm_create(const dsv4_comm_groups *groups, int rank, const dsv4_nccl_id *id,
                                           const dsv4_nccl_options *opt, dsv4_comm **out, dsv4_error *err);
/*
 * The same, with rank and world size from dsv4_nccl_env_read (groups->world
 * must equal the world size) and the id from DSV4_NCCL_ID (hex) or else
 * DSV4_NCCL_ID_FILE: rank 0 creates the id and writes the file, the others
 * wait for it (init_timeout_ms). Neither set: DSV4_ERR_CONFIG.
 */
DSV4_API dsv4_status dsv4_nccl_comm_create_from_env(const dsv4_comm_groups *groups, const dsv4_nccl_options *opt,
                                                    dsv4_comm **out, dsv4_error *err);
/* Finalizes (or, after an error, has aborted) the NCCL communicators and frees everything. NULL is a no-op.
   A comm that is not an NCCL endpoint is ignored. */
DSV4_API void dsv4_nccl_comm_free(dsv4_comm *comm);
/* true when comm is an NCCL endpoint. */
DSV4_API bool dsv4_nccl_is_nccl(const dsv4_comm *comm);

/* The stream (a cudaStream_t) for the following collectives; NULL is the legacy default stream. */
DSV4_API dsv4_status dsv4_nccl_set_stream(dsv4_comm *comm, void *stream, dsv4_error *err);
DSV4_API void *dsv4_nccl_stream(const dsv4_comm *comm);
/* The CUDA device of this endpoint. */
DSV4_API int dsv4_nccl_device(const dsv4_comm *comm);
/* Waits for the stream with the watchdog (after a graph replay or with wait = false). `what` labels
   the message ("graph replay step 7"). DSV4_ERR_COMM and abort on timeout or an NCCL error. */
DSV4_API dsv4_status dsv4_nccl_sync(dsv4_comm *comm, const char *what, dsv4_error *err);
/* Grows the device scratch of exact all_reduce to hold all_reduce of `bytes` per rank, so that it
   can be captured (the scratch cannot grow during capture: DSV4_ERR_INVALID_ARG naming it). */
DSV4_API dsv4_status dsv4_nccl_reserve(dsv4_comm *comm, size_t bytes, dsv4_error *err);
/* The NCCL error or abort reason that poisoned the endpoint, "" when healthy. */
DSV4_API const char *dsv4_nccl_poison_reason(const dsv4_comm *comm);

/* ---------------- EP dispatch and combine (docs/nccl.md) ---------------- */

/*
 * Token-slots travel to the ranks holding their experts and back, over the
 * ep group of an NCCL endpoint. Rank d of the ep group holds experts
 * [expert_begin[d], expert_begin[d + 1]) (the plan's ranges, ascending,
 * expert_begin[0] = 0, expert_begin[ep] = n_experts). One row per token-slot
 * (not per token), as the planner's memory model counts them.
 *
 * Dispatch, all on the endpoint's stream:
 *   1. a kernel counts, for every destination, the slots of this rank's
 *      tokens (topk_ids[t, k] in [0, n_experts); a pruned slot holds
 *      n_experts or any value outside and goes nowhere) and gives each slot its
 *      position: destinations ascending, inside one destination (t, k)
 *      ascending;
 *   2. a fixed-size all_gather of the per-destination counts over ep (int64
 *      [ep] per rank): after it every rank knows the whole count matrix on
 *      the device;
 *   3. a kernel packs rows (row_bytes_in each), expert ids (int32) and
 *      weights (fp32) into the send buffers;
 *   4. all_to_allv of rows, ids and weights.
 * Eager mode (padded false): the count matrix is copied to the host (one
 * wait) and the all_to_allv moves exactly the slots; received slots are
 * packed by source rank ascending. Padded mode (padded true, the planner's
 * symmetric step): every source sends every destination `cap_per_peer` slot
 * rows (max_tokens * min(K, experts of that rank)), the valid ones first;
 * nothing is read on the host, so dispatch and combine can be captured; the
 * receiver reads the valid counts from recv_counts on the device.
 *
 * Combine sends the experts' output rows (row_bytes_out each, laid out as the
 * received slots) back along the reverse route and writes each to
 * out_slots[t * K + k] (row_bytes_out bytes each) of its home rank; pruned
 * slots' rows are left untouched. Accumulating the K rows of a token (in
 * ascending expert id, as the reference does) is the backend's step.
 */
typedef struct dsv4_nccl_ep_config {
    uint32_t struct_size;      /* sizeof(dsv4_nccl_ep_config), set by init */
    int n_experts;
    int topk;                  /* K */
    const int *expert_begin;   /* host, ep + 1 entries */
    int64_t max_tokens;        /* tokens per rank per call (the chunk) */
    size_t row_bytes_in;       /* dispatched row (activation + scales), a multiple of 16 */
    size_t row_bytes_out;      /* combined row, a multiple of 16 */
    bool padded;
} dsv4_nccl_ep_config;

DSV4_API void dsv4_nccl_ep_config_init(dsv4_nccl_ep_config *cfg);

typedef struct dsv4_nccl_ep dsv4_nccl_ep;

/* Checks cfg against the endpoint's ep group and allocates the device buffers for max_tokens. */
DSV4_API dsv4_status dsv4_nccl_ep_create(dsv4_comm *comm, const dsv4_nccl_ep_config *cfg, dsv4_nccl_ep **out,
                                         dsv4_error *err);
DSV4_API void dsv4_nccl_ep_free(dsv4_nccl_ep *ep);
/* Device bytes held by the buffers. */
DSV4_API size_t dsv4_nccl_ep_device_bytes(const dsv4_nccl_ep *ep);

/* What dispatch delivered (device pointers owned by ep, valid until the next dispatch). */
typedef struct dsv4_nccl_ep_recv {
    const void *rows;            /* [slots] x row_bytes_in */
    const int32_t *expert_ids;   /* [slots], global expert ids of this rank's range */
    const float *weights;        /* [slots] */
    const int64_t *count_matrix; /* device [ep][ep]: count_matrix[s * ep + d] slots from s to d */
    int64_t slots;               /* rows of the buffers: received slots (eager), ep * cap_per_peer (padded) */
    int64_t cap_per_peer;        /* padded: rows per source; eager: 0 */
    int64_t recv_offset[DSV4_COMM_MAX_RANKS]; /* first row from each source (eager: packed; padded: s * cap) */
    int64_t recv_count[DSV4_COMM_MAX_RANKS];  /* eager only: valid rows from each source (host) */
} dsv4_nccl_ep_recv;

/*
 * tokens in [0, max_tokens]; x: device [tokens] x row_bytes_in, topk_ids device int32 [tokens, K],
 * topk_weights device fp32 [tokens, K]. Every rank of the ep group calls it, also with 0 tokens.
 * The tag labels the collectives ("chunk 2": "chunk 2 counts", "chunk 2 rows", ...).
 */
DSV4_API dsv4_status dsv4_nccl_ep_dispatch(dsv4_nccl_ep *ep, int64_t tokens, const void *x, const int32_t *topk_ids,
                                           const float *topk_weights, const char *tag, dsv4_nccl_ep_recv *recv,
                                           dsv4_error *err);
/* expert_out: device, laid out as the last dispatch's recv rows ([recv.slots] x row_bytes_out);
   out_slots: device [tokens, K] x row_bytes_out of the last dispatch's tokens. */
DSV4_API dsv4_status dsv4_nccl_ep_combine(dsv4_nccl_ep *ep, const void *expert_out, void *out_slots, const char *tag,
                                          dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
