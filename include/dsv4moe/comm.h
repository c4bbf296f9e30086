/*
 * dsv4moe: the communicator interface, and `sim`, N ranks as threads of one
 * process moving real data.
 *
 * A communicator is one rank's endpoint. Collectives run over named groups
 * (world, tp, dp, ep) whose membership is fixed at creation by a colour per
 * rank: ranks of the same colour form the group, ordered by rank.
 *
 * Before every collective the ranks of the group compare fingerprints
 * (per-group sequence number, op, group, dtype, element count; for
 * all_to_allv the send/receive count matrix), as PyTorch's
 * TORCH_DISTRIBUTED_DEBUG=DETAIL does. A mismatch returns DSV4_ERR_COMM on
 * every participating rank with a message naming both ranks and both
 * collectives. A rank that does not arrive within the timeout produces a
 * deadlock report (which ranks wait in which collective, which never came),
 * never a hang. After any such error the world is poisoned: every later
 * collective on any rank fails at once, so threads can shut down.
 *
 * Every rank keeps a trace of its collectives (dsv4_comm_trace) that reports
 * can show and tests compare across ranks.
 */
#ifndef DSV4MOE_COMM_H
#define DSV4MOE_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/dtype.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_COMM_MAX_RANKS 64
#define DSV4_COMM_TAG_MAX 48

typedef enum dsv4_group {
    DSV4_GROUP_WORLD = 0,
    DSV4_GROUP_TP = 1,
    DSV4_GROUP_DP = 2,
    DSV4_GROUP_EP = 3,
    DSV4_GROUP_COUNT
} dsv4_group;

typedef enum dsv4_coll_op {
    DSV4_COLL_ALL_REDUCE = 0, /* sum, reduced in ascending rank order: identical bits on every rank */
    DSV4_COLL_ALL_GATHER = 1,
    DSV4_COLL_ALL_TO_ALLV = 2,
    DSV4_COLL_BARRIER = 3
} dsv4_coll_op;

DSV4_API const char *dsv4_group_name(dsv4_group group);
DSV4_API const char *dsv4_coll_op_name(dsv4_coll_op op);

/* One collective as a rank issued it: its fingerprint and trace entry. */
typedef struct dsv4_coll_record {
    uint64_t seq;        /* per-group sequence number on this rank, from 0 */
    dsv4_coll_op op;
    dsv4_group group;
    dsv4_dtype dtype;    /* U8 for barrier */
    uint64_t count;      /* elements: per rank (all_reduce, all_gather), sent in total (all_to_allv), 0 (barrier) */
    uint64_t counts_hash;/* all_to_allv: FNV-1a of this rank's send counts then recv counts; else 0 */
    char tag[DSV4_COMM_TAG_MAX]; /* the caller's label, e.g. "step 3 meta", "chunk 1 dispatch" */
} dsv4_coll_record;

/* Group membership: color[g][r] for every group g and rank r (WORLD's colours are ignored). */
typedef struct dsv4_comm_groups {
    int world;
    int color[DSV4_GROUP_COUNT][DSV4_COMM_MAX_RANKS];
} dsv4_comm_groups;

/* Colours for world = tp x dp: tp groups are blocks of tp consecutive ranks, dp groups the
   ranks with the same index inside their tp block, ep groups blocks of ep consecutive ranks
   (ep divides world). Returns DSV4_ERR_INVALID_ARG naming the field otherwise. */
DSV4_API dsv4_status dsv4_comm_groups_init(dsv4_comm_groups *groups, int world, int tp, int dp, int ep,
                                           dsv4_error *err);

typedef struct dsv4_comm dsv4_comm;

/*
 * Argument errors (NULL buffer with elements, invalid dtype or group, sizes
 * that overflow) return DSV4_ERR_INVALID_ARG before the collective is issued
 * (no trace record, no sequence number) and poison the world, since the peers
 * would otherwise wait for this rank until the timeout. A NULL comm only
 * returns DSV4_ERR_INVALID_ARG. err is left untouched on success.
 */

/* This rank's id in the world, and its index and the size of one of its groups (-1 for NULL or a bad group). */
DSV4_API int dsv4_comm_rank(const dsv4_comm *comm);
DSV4_API int dsv4_comm_group_rank(const dsv4_comm *comm, dsv4_group group);
DSV4_API int dsv4_comm_group_size(const dsv4_comm *comm, dsv4_group group);

/* Sum of `count` elements of buf over the group, in place. dtype F32, F64, I32, I64 or BF16
   (bf16 summed in fp32 in ascending rank order, rounded once). */
DSV4_API dsv4_status dsv4_comm_all_reduce(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, void *buf,
                                          uint64_t count, const char *tag, dsv4_error *err);
/* recv[group_size * count] = concatenation of every group rank's send[count], in group order.
   send may be this rank's own block of recv (recv + group_rank * count elements); no other overlap. */
DSV4_API dsv4_status dsv4_comm_all_gather(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, const void *send,
                                          uint64_t count, void *recv, const char *tag, dsv4_error *err);
/*
 * send_counts[j] elements go to group rank j (packed in j order in send);
 * recv_counts[i] elements come from group rank i (packed in i order in recv).
 * The fingerprint check verifies that every send count matches the peer's
 * receive count before any data moves.
 */
DSV4_API dsv4_status dsv4_comm_all_to_allv(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, const void *send,
                                           const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                                           const char *tag, dsv4_error *err);
DSV4_API dsv4_status dsv4_comm_barrier(dsv4_comm *comm, dsv4_group group, const char *tag, dsv4_error *err);

/* This rank's collectives so far, oldest first (valid until the next collective or free). */
DSV4_API const dsv4_coll_record *dsv4_comm_trace(const dsv4_comm *comm, size_t *count);

/* ---------------- sim: ranks as threads of one process ---------------- */

typedef struct dsv4_sim_world dsv4_sim_world;

typedef struct dsv4_sim_options {
    uint32_t struct_size; /* sizeof(dsv4_sim_options), set by init */
    int timeout_ms;       /* how long arrived ranks wait for the others before the deadlock report */
} dsv4_sim_options;

/* timeout 5000 ms. NULL is a no-op. */
DSV4_API void dsv4_sim_options_init(dsv4_sim_options *opt);

/* A world of groups->world ranks (1 .. DSV4_COMM_MAX_RANKS). opt may be NULL (defaults). */
DSV4_API dsv4_status dsv4_sim_world_create(const dsv4_comm_groups *groups, const dsv4_sim_options *opt,
                                           dsv4_sim_world **out, dsv4_error *err);
/* NULL is a no-op. Every rank's thread must have returned from its collectives. */
DSV4_API void dsv4_sim_world_free(dsv4_sim_world *world);
/* Rank r's endpoint, owned by the world. Each endpoint is used by one thread at a time. */
DSV4_API dsv4_comm *dsv4_sim_world_comm(dsv4_sim_world *world, int rank);

#ifdef __cplusplus
}
#endif
#endif
