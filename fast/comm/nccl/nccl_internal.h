/*
 * Internal: the NCCL communicator's pieces shared by nccl_comm.c, nccl_ep.c,
 * the kernels (nccl_kernels.cu) and tests/nccl. Not installed.
 */
#ifndef DSV4MOE_FAST_COMM_NCCL_INTERNAL_H
#define DSV4MOE_FAST_COMM_NCCL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4moe/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels (nccl_kernels.cu); each returns a cudaError_t as int, 0 on success ---- */

/* out[e] = sum over r ascending of gathered[r * count + e]; BF16 summed in fp32, rounded once (RNE, NaN kept
   quiet), F32/F64 in their type, I32/I64 wrapping. dtype is a dsv4_dtype. count > 0. */
int dsv4_nccl_k_sum(int dtype, const void *gathered, void *out, int n, uint64_t count, void *stream);

/*
 * One block. For every slot s < slots: its destination d = the rank whose [begin[d], begin[d + 1]) holds
 * ids[s] (none when ids[s] is outside [0, begin[ep])); pos[s] its row in the send buffer (-1: none):
 * eager (cap 0) destinations packed ascending, padded d * cap + its index inside d; inside d slots ascend.
 * counts[d]: the slots to d (padded: at most cap; the rest is dropped and added to *overflow).
 */
int dsv4_nccl_k_route(const int32_t *ids, int64_t slots, const int *begin, int ep, int64_t cap, int32_t *pos,
                      int64_t *counts, int32_t *overflow, void *stream);
/* For slot s with pos[s] >= 0: rows[pos] = x[s / k] (row_bytes), rids[pos] = ids[s], rw[pos] = w[s]. */
int dsv4_nccl_k_pack(int64_t slots, int k, const int32_t *pos, const void *x, size_t row_bytes, const int32_t *ids,
                     const float *w, void *rows, int32_t *rids, float *rw, void *stream);
/* For slot s with pos[s] >= 0: out[s] = back[pos[s]] (row_bytes). */
int dsv4_nccl_k_unpack(int64_t slots, const int32_t *pos, const void *back, size_t row_bytes, void *out,
                       void *stream);

/* ---- fingerprints ---- */

/* Words of one rank's fingerprint in a group of n: seq, op, group, dtype, count, counts_hash, the tag
   (6 words), then for all_to_allv n send counts and n receive counts (else zeros). */
#define DSV4_NCCL_FP_HEAD 12
#define DSV4_NCCL_FP_WORDS(n) ((size_t)DSV4_NCCL_FP_HEAD + 2 * (size_t)(n))

void dsv4_nccl_fp_encode(const dsv4_coll_record *rec, const uint64_t *send_counts, const uint64_t *recv_counts, int n,
                         uint64_t *words);
/*
 * Compares n gathered fingerprints (n * DSV4_NCCL_FP_WORDS(n) words) as sim does: rank 0's record against every
 * other, then for all_to_allv every send count against the peer's receive count. members: the world rank of
 * each group rank. Returns 0 when consistent, else 1 with the sim-style message in msg.
 */
int dsv4_nccl_fp_compare(const uint64_t *words, int n, dsv4_group group, const int *members, char *msg, size_t cap);

/* A monotonic clock in milliseconds (the deadlines of every wait; nccl_comm.c). */
double dsv4_nccl_now_ms(void);

#ifdef __cplusplus
}
#endif
#endif
