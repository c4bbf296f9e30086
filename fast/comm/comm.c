/*
 * The generic part of the communicator: names, group colours, argument
 * checks, the per-rank trace, and dispatch to an implementation (sim.c).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/comm.h"
#include "fast/comm/comm_impl.h"
#include "core/err.h"
#include "core/grow.h"
#include "core/hash.h"

const char *dsv4_group_name(dsv4_group group)
{
    switch (group) {
    case DSV4_GROUP_WORLD: return "world";
    case DSV4_GROUP_TP: return "tp";
    case DSV4_GROUP_DP: return "dp";
    case DSV4_GROUP_EP: return "ep";
    case DSV4_GROUP_COUNT: break;
    }
    return "?";
}

const char *dsv4_coll_op_name(dsv4_coll_op op)
{
    switch (op) {
    case DSV4_COLL_ALL_REDUCE: return "all_reduce";
    case DSV4_COLL_ALL_GATHER: return "all_gather";
    case DSV4_COLL_ALL_TO_ALLV: return "all_to_allv";
    case DSV4_COLL_BARRIER: return "barrier";
    }
    return "?";
}

dsv4_status dsv4_comm_groups_init(dsv4_comm_groups *groups, int world, int tp, int dp, int ep, dsv4_error *err)
{
    if (!groups)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_comm_groups_init", "groups is NULL");
    memset(groups, 0, sizeof *groups);
    if (world < 1 || world > DSV4_COMM_MAX_RANKS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'world_size'",
                           "world_size %d is outside [1, %d]", world, DSV4_COMM_MAX_RANKS);
    if (tp < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'tp'", "tp %d must be >= 1", tp);
    if (dp < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'dp'", "dp %d must be >= 1", dp);
    if (ep < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'ep'", "ep %d must be >= 1", ep);
    if ((long long)tp * dp != world)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'tp'", "tp %d x dp %d = %lld is not world_size %d",
                           tp, dp, (long long)tp * dp, world);
    if (world % ep != 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'ep'", "ep %d does not divide world_size %d",
                           ep, world);
    groups->world = world;
    for (int r = 0; r < world; r++) {
        groups->color[DSV4_GROUP_WORLD][r] = 0;
        groups->color[DSV4_GROUP_TP][r] = r / tp;
        groups->color[DSV4_GROUP_DP][r] = r % tp;
        groups->color[DSV4_GROUP_EP][r] = r / ep;
    }
    return DSV4_OK;
}

/* ---------------- implementation helpers ---------------- */

void dsv4_comm_base_init(dsv4_comm *comm, const dsv4_comm_vtable *vt, int rank)
{
    memset(comm, 0, sizeof *comm);
    comm->vt = vt;
    comm->rank = rank;
    for (int g = 0; g < DSV4_GROUP_COUNT; g++) {
        comm->group_rank[g] = 0;
        comm->group_size[g] = 1;
    }
}

void dsv4_comm_base_fini(dsv4_comm *comm)
{
    if (!comm)
        return;
    free(comm->trace);
    comm->trace = NULL;
    comm->trace_len = comm->trace_cap = 0;
}

uint64_t dsv4_comm_counts_hash(const uint64_t *send_counts, const uint64_t *recv_counts, int n)
{
    uint64_t h = DSV4_FNV_OFFSET;
    for (int i = 0; i < n; i++)
        h = dsv4_fnv1a_u64(h, send_counts[i]);
    for (int i = 0; i < n; i++)
        h = dsv4_fnv1a_u64(h, recv_counts[i]);
    return h;
}

void dsv4_comm_describe(const dsv4_coll_record *rec, char *buf, size_t n)
{
    if (!buf || n == 0)
        return;
    if (rec->op == DSV4_COLL_BARRIER)
        snprintf(buf, n, "%s #%llu ('%s')", dsv4_coll_op_name(rec->op), (unsigned long long)rec->seq, rec->tag);
    else
        snprintf(buf, n, "%s #%llu (%s x %llu, '%s')", dsv4_coll_op_name(rec->op), (unsigned long long)rec->seq,
                 dsv4_dtype_name(rec->dtype), (unsigned long long)rec->count, rec->tag);
}

int dsv4_comm_reducible(dsv4_dtype dtype)
{
    return dtype == DSV4_DTYPE_F32 || dtype == DSV4_DTYPE_F64 || dtype == DSV4_DTYPE_I32 ||
           dtype == DSV4_DTYPE_I64 || dtype == DSV4_DTYPE_BF16;
}

/* ---------------- public accessors ---------------- */

int dsv4_comm_rank(const dsv4_comm *comm)
{
    return comm ? comm->rank : -1;
}

int dsv4_comm_group_rank(const dsv4_comm *comm, dsv4_group group)
{
    if (!comm || (unsigned)group >= DSV4_GROUP_COUNT)
        return -1;
    return comm->group_rank[group];
}

int dsv4_comm_group_size(const dsv4_comm *comm, dsv4_group group)
{
    if (!comm || (unsigned)group >= DSV4_GROUP_COUNT)
        return -1;
    return comm->group_size[group];
}

const dsv4_coll_record *dsv4_comm_trace(const dsv4_comm *comm, size_t *count)
{
    if (count)
        *count = comm ? comm->trace_len : 0;
    return comm ? comm->trace : NULL;
}

/* ---------------- argument checks and issuing ---------------- */

/* A local error on a valid comm: fill err and tell the implementation, so peers do not wait for us. */
static dsv4_status local_fail(dsv4_comm *comm, dsv4_error *err, dsv4_status st, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static dsv4_status local_fail(dsv4_comm *comm, dsv4_error *err, dsv4_status st, const char *fn, const char *fmt, ...)
{
    char text[DSV4_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    dsv4_error local;
    dsv4_seterr(&local, st, fn, "rank %d: %s", comm->rank, text);
    if (err)
        *err = local;
    if (comm->vt && comm->vt->abort)
        comm->vt->abort(comm, local.message);
    return st;
}

static dsv4_status check_comm(dsv4_comm *comm, dsv4_group group, const char *fn, dsv4_error *err)
{
    if (!comm || !comm->vt)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "comm is NULL");
    if ((unsigned)group >= DSV4_GROUP_COUNT)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "group %d is not a valid group", (int)group);
    return DSV4_OK;
}

static dsv4_status check_dtype(dsv4_comm *comm, dsv4_dtype dtype, const char *fn, dsv4_error *err)
{
    if (dsv4_dtype_size(dtype) == 0)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "dtype %d is not a valid dtype", (int)dtype);
    return DSV4_OK;
}

/* Builds the record, assigns its sequence number and appends it to the trace. */
static dsv4_status issue(dsv4_comm *comm, dsv4_coll_op op, dsv4_group group, dsv4_dtype dtype, uint64_t count,
                         uint64_t counts_hash, const char *tag, const char *fn, dsv4_coll_record *rec,
                         dsv4_error *err)
{
    dsv4_coll_record *t = dsv4_grow(comm->trace, &comm->trace_cap, comm->trace_len + 1, sizeof *t, 16);
    if (!t)
        return local_fail(comm, err, DSV4_ERR_NOMEM, fn, "out of memory growing the trace past %zu records",
                          comm->trace_cap);
    comm->trace = t;
    memset(rec, 0, sizeof *rec);
    rec->seq = comm->seq[group]++;
    rec->op = op;
    rec->group = group;
    rec->dtype = dtype;
    rec->count = count;
    rec->counts_hash = counts_hash;
    if (tag) {
        size_t n = strlen(tag);
        if (n > DSV4_COMM_TAG_MAX - 1)
            n = DSV4_COMM_TAG_MAX - 1;
        memcpy(rec->tag, tag, n);
        rec->tag[n] = '\0';
    }
    comm->trace[comm->trace_len++] = *rec;
    return DSV4_OK;
}

dsv4_status dsv4_comm_all_reduce(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, void *buf, uint64_t count,
                                 const char *tag, dsv4_error *err)
{
    static const char fn[] = "dsv4_comm_all_reduce";
    dsv4_status st = check_comm(comm, group, fn, err);
    if (st != DSV4_OK)
        return st;
    if (!dsv4_comm_reducible(dtype))
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "dtype %s cannot be summed (F32, F64, I32, I64, BF16)",
                          dsv4_dtype_name(dtype));
    uint64_t bytes;
    if (__builtin_mul_overflow(count, (uint64_t)dsv4_dtype_size(dtype), &bytes) || bytes > SIZE_MAX)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "count %llu is too large",
                          (unsigned long long)count);
    if (!buf && count > 0)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "buf is NULL with count %llu",
                          (unsigned long long)count);
    dsv4_coll_record rec;
    st = issue(comm, DSV4_COLL_ALL_REDUCE, group, dtype, count, 0, tag, fn, &rec, err);
    if (st != DSV4_OK)
        return st;
    return comm->vt->all_reduce(comm, &rec, buf, err);
}

dsv4_status dsv4_comm_all_gather(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, const void *send,
                                 uint64_t count, void *recv, const char *tag, dsv4_error *err)
{
    static const char fn[] = "dsv4_comm_all_gather";
    dsv4_status st = check_comm(comm, group, fn, err);
    if (st == DSV4_OK)
        st = check_dtype(comm, dtype, fn, err);
    if (st != DSV4_OK)
        return st;
    uint64_t bytes, total;
    if (__builtin_mul_overflow(count, (uint64_t)dsv4_dtype_size(dtype), &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)comm->group_size[group], &total) || total > SIZE_MAX)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "count %llu is too large",
                          (unsigned long long)count);
    if ((!send || !recv) && count > 0)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "%s is NULL with count %llu", !send ? "send" : "recv",
                          (unsigned long long)count);
    dsv4_coll_record rec;
    st = issue(comm, DSV4_COLL_ALL_GATHER, group, dtype, count, 0, tag, fn, &rec, err);
    if (st != DSV4_OK)
        return st;
    return comm->vt->all_gather(comm, &rec, send, recv, err);
}

dsv4_status dsv4_comm_all_to_allv(dsv4_comm *comm, dsv4_group group, dsv4_dtype dtype, const void *send,
                                  const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                                  const char *tag, dsv4_error *err)
{
    static const char fn[] = "dsv4_comm_all_to_allv";
    dsv4_status st = check_comm(comm, group, fn, err);
    if (st == DSV4_OK)
        st = check_dtype(comm, dtype, fn, err);
    if (st != DSV4_OK)
        return st;
    if (!send_counts || !recv_counts)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "%s is NULL",
                          !send_counts ? "send_counts" : "recv_counts");
    int n = comm->group_size[group];
    uint64_t nsend = 0, nrecv = 0, b;
    for (int i = 0; i < n; i++) {
        if (__builtin_add_overflow(nsend, send_counts[i], &nsend) ||
            __builtin_add_overflow(nrecv, recv_counts[i], &nrecv))
            return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "the counts overflow 64 bits");
    }
    uint64_t dsz = (uint64_t)dsv4_dtype_size(dtype);
    if (__builtin_mul_overflow(nsend, dsz, &b) || b > SIZE_MAX || __builtin_mul_overflow(nrecv, dsz, &b) ||
        b > SIZE_MAX)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "the counts (%llu sent, %llu received) are too large",
                          (unsigned long long)nsend, (unsigned long long)nrecv);
    if (!send && nsend > 0)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "send is NULL with %llu elements to send",
                          (unsigned long long)nsend);
    if (!recv && nrecv > 0)
        return local_fail(comm, err, DSV4_ERR_INVALID_ARG, fn, "recv is NULL with %llu elements to receive",
                          (unsigned long long)nrecv);
    dsv4_coll_record rec;
    st = issue(comm, DSV4_COLL_ALL_TO_ALLV, group, dtype, nsend, dsv4_comm_counts_hash(send_counts, recv_counts, n),
               tag, fn, &rec, err);
    if (st != DSV4_OK)
        return st;
    return comm->vt->all_to_allv(comm, &rec, send, send_counts, recv, recv_counts, err);
}

dsv4_status dsv4_comm_barrier(dsv4_comm *comm, dsv4_group group, const char *tag, dsv4_error *err)
{
    static const char fn[] = "dsv4_comm_barrier";
    dsv4_status st = check_comm(comm, group, fn, err);
    if (st != DSV4_OK)
        return st;
    dsv4_coll_record rec;
    st = issue(comm, DSV4_COLL_BARRIER, group, DSV4_DTYPE_U8, 0, 0, tag, fn, &rec, err);
    if (st != DSV4_OK)
        return st;
    return comm->vt->barrier(comm, &rec, err);
}
