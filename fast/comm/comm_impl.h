/*
 * Internal: the communicator's implementation interface. Not installed.
 *
 * The public dsv4_comm_* functions (comm.c) check arguments, build the
 * collective's record (fingerprint), append it to the rank's trace and then
 * call the implementation through the vtable. An implementation (sim.c, a
 * later NCCL one) embeds `struct dsv4_comm` as its first member, fills the
 * group ranks and sizes, and implements the five entry points below.
 */
#ifndef DSV4MOE_FAST_COMM_IMPL_H
#define DSV4MOE_FAST_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4moe/comm.h"

typedef struct dsv4_comm_vtable {
    const char *name; /* "sim", "nccl" */
    /*
     * The collectives. `rec` is the record the generic layer built and
     * appended to the trace (seq already assigned). Arguments are already
     * checked: group valid, dtype valid (and reducible for all_reduce), byte
     * sizes fit size_t, buffers non-NULL wherever they hold elements,
     * all_to_allv count arrays non-NULL with group_size entries.
     * Every failure must leave the world in a state where no peer hangs.
     */
    dsv4_status (*all_reduce)(dsv4_comm *comm, const dsv4_coll_record *rec, void *buf, dsv4_error *err);
    dsv4_status (*all_gather)(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send, void *recv,
                              dsv4_error *err);
    dsv4_status (*all_to_allv)(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send,
                               const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                               dsv4_error *err);
    dsv4_status (*barrier)(dsv4_comm *comm, const dsv4_coll_record *rec, dsv4_error *err);
    /*
     * A local failure on this rank before it could issue a collective
     * (invalid argument, out of memory): the implementation poisons the world
     * so that peers waiting for this rank fail now instead of at the timeout.
     * May be NULL.
     */
    void (*abort)(dsv4_comm *comm, const char *reason);
} dsv4_comm_vtable;

struct dsv4_comm {
    const dsv4_comm_vtable *vt;
    int rank;                             /* world rank */
    int group_rank[DSV4_GROUP_COUNT];     /* filled by the implementation */
    int group_size[DSV4_GROUP_COUNT];
    uint64_t seq[DSV4_GROUP_COUNT];       /* next sequence number per group */
    dsv4_coll_record *trace;              /* owned; grows by doubling */
    size_t trace_len, trace_cap;
};

/* Sets the generic fields: vt, rank, sequence numbers 0, empty trace, every group {rank} of size 1. */
void dsv4_comm_base_init(dsv4_comm *comm, const dsv4_comm_vtable *vt, int rank);
/* Frees the trace. */
void dsv4_comm_base_fini(dsv4_comm *comm);

/* FNV-1a 64 over send[0..n) then recv[0..n), each value as 8 little-endian bytes. */
uint64_t dsv4_comm_counts_hash(const uint64_t *send_counts, const uint64_t *recv_counts, int n);

/* "all_reduce #3 (F32 x 1024, 'step 2 meta')", "barrier #0 ('x')" into buf (always terminated). */
void dsv4_comm_describe(const dsv4_coll_record *rec, char *buf, size_t n);

/* The dtypes all_reduce can sum. */
int dsv4_comm_reducible(dsv4_dtype dtype);

#endif
