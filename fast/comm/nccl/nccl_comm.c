/*
 * The NCCL communicator (include/dsv4moe/comm_nccl.h): one process per GPU,
 * the vtable of comm_impl.h over non-blocking NCCL communicators.
 *
 * Why the calling thread is the watchdog (no thread of our own): every wait
 * (bootstrap, the enqueue of a non-blocking call, the completion of the
 * stream) is a poll loop with a deadline in the thread that issued it, so a
 * timeout is reported by the very call that would have hung, with its record
 * at hand, and nothing survives dsv4_nccl_comm_free.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dsv4moe/comm_nccl.h"
#include "fast/comm/comm_impl.h"
#include "core/err.h"
#include "core/fileio.h"
#include "fast/comm/nccl/nccl_internal.h"

#define MSG_MAX DSV4_ERROR_MESSAGE_MAX

typedef struct nccl_group {
    ncclComm_t nc;        /* WORLD: the world communicator; others: its split */
    int n, me;
    int members[DSV4_COMM_MAX_RANKS]; /* world ranks, ascending */
    uint64_t *fp_dev;     /* n * FP_WORDS(n) */
    uint64_t *fp_host;    /* pinned, same size */
} nccl_group;

typedef struct nccl_comm {
    dsv4_comm base; /* first: a dsv4_comm * is an nccl_comm * */
    dsv4_nccl_options opt;
    int device;
    cudaStream_t stream;
    cudaEvent_t done;
    nccl_group g[DSV4_GROUP_COUNT];
    int32_t *barrier_dev;
    void *scratch;
    size_t scratch_bytes;
    bool poisoned;
    bool aborted;
    char poison_msg[MSG_MAX];
} nccl_comm;

static const dsv4_comm_vtable nccl_vtable;

/* ---------------- time ---------------- */

double dsv4_nccl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Spins briefly, then sleeps 20 us: latency for short collectives, no burnt core for long waits. */
static void poll_pause(unsigned *iter)
{
    if ((*iter)++ < 256)
        return;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* ---------------- naming ---------------- */

static void group_label(const nccl_comm *c, dsv4_group group, char *buf, size_t n)
{
    const nccl_group *g = &c->g[group];
    size_t len = (size_t)snprintf(buf, n, "%s", dsv4_group_name(group));
    if (group == DSV4_GROUP_WORLD || len >= n)
        return;
    len += (size_t)snprintf(buf + len, n - len, " [ranks ");
    for (int i = 0; i < g->n && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? ", " : "", g->members[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

static dsv4_status comm_fail(dsv4_error *err, const char *where, const char *msg)
{
    dsv4_seterr(err, DSV4_ERR_COMM, NULL, "%s", msg);
    if (err && where)
        snprintf(err->where, sizeof err->where, "%s", where);
    return DSV4_ERR_COMM;
}

/* ---------------- abort and poison ---------------- */

static bool capturing(const nccl_comm *c);

/*
 * Aborts every NCCL communicator of this rank (splits first), once; later collectives fail at once. While the
 * stream is capturing, ncclCommAbort's own CUDA calls would break the capture, so the endpoint is only poisoned
 * and dsv4_nccl_comm_free aborts.
 */
static void abort_all(nccl_comm *c, const char *reason)
{
    if (!c->poisoned) {
        c->poisoned = true;
        snprintf(c->poison_msg, sizeof c->poison_msg, "%s", reason);
    }
    if (c->aborted || capturing(c))
        return;
    c->aborted = true;
    /* Twice: aborting the world joins a split still in progress, which then stores its child into c. */
    for (int pass = 0; pass < 2; pass++)
        for (int g = DSV4_GROUP_COUNT - 1; g >= 0; g--) {
            ncclComm_t nc = __atomic_exchange_n(&c->g[g].nc, NULL, __ATOMIC_ACQ_REL);
            if (nc)
                ncclCommAbort(nc);
        }
}

static void nccl_abort_cb(dsv4_comm *comm, const char *reason)
{
    abort_all((nccl_comm *)comm, reason);
}

static dsv4_status poisoned_err(nccl_comm *c, const dsv4_coll_record *rec, dsv4_error *err)
{
    char d[160], msg[MSG_MAX];
    dsv4_comm_describe(rec, d, sizeof d);
    snprintf(msg, sizeof msg, "nccl rank %d: %s refused: the communicator was aborted by an earlier error: %.*s",
             c->base.rank, d, (int)(sizeof msg - 260), c->poison_msg);
    return comm_fail(err, "nccl communicator", msg);
}

/*
 * Waits until a non-blocking call on nc has been enqueued (ncclCommGetAsyncError leaves ncclInProgress) and,
 * with stream_too, until the stream has drained past an event recorded now, both within timeout_ms. On
 * failure aborts everything and fills err with "<what> <how>". rec may be NULL (bootstrap, sync).
 */
static dsv4_status watch(nccl_comm *c, ncclComm_t nc, ncclResult_t issued, bool stream_too, int timeout_ms,
                         const char *what, dsv4_error *err)
{
    char msg[MSG_MAX];
    if (issued != ncclSuccess && issued != ncclInProgress) {
        snprintf(msg, sizeof msg, "nccl rank %d: %s failed: %s (%s)", c->base.rank, what, ncclGetErrorString(issued),
                 ncclGetLastError(nc));
        abort_all(c, msg);
        return comm_fail(err, "nccl communicator", msg);
    }
    double deadline = dsv4_nccl_now_ms() + timeout_ms;
    bool event = false;
    if (stream_too) {
        cudaError_t ce = cudaEventRecord(c->done, c->stream);
        if (ce != cudaSuccess) {
            snprintf(msg, sizeof msg, "nccl rank %d: %s: cudaEventRecord failed: %s", c->base.rank, what,
                     cudaGetErrorString(ce));
            abort_all(c, msg);
            return comm_fail(err, "nccl communicator", msg);
        }
        event = true;
    }
    unsigned iter = 0;
    for (;;) {
        ncclResult_t as = ncclSuccess;
        if (nc) {
            ncclResult_t q = ncclCommGetAsyncError(nc, &as);
            if (q != ncclSuccess)
                as = q;
        }
        if (as != ncclSuccess && as != ncclInProgress) {
            snprintf(msg, sizeof msg, "nccl rank %d: %s failed: %s (%s); communicator aborted", c->base.rank, what,
                     ncclGetErrorString(as), ncclGetLastError(nc));
            abort_all(c, msg);
            return comm_fail(err, "nccl communicator", msg);
        }
        bool ready = as == ncclSuccess;
        if (ready && event) {
            cudaError_t q = cudaEventQuery(c->done);
            if (q == cudaSuccess)
                event = false;
            else if (q != cudaErrorNotReady) {
                snprintf(msg, sizeof msg, "nccl rank %d: %s: the stream failed: %s; communicator aborted",
                         c->base.rank, what, cudaGetErrorString(q));
                abort_all(c, msg);
                return comm_fail(err, "nccl communicator", msg);
            }
        }
        if (ready && !event)
            return DSV4_OK;
        if (dsv4_nccl_now_ms() > deadline) {
            snprintf(msg, sizeof msg,
                     "nccl rank %d: %s did not complete within %d ms (watchdog: %s); communicator aborted "
                     "(a peer never joined, or issued a different collective)",
                     c->base.rank, what, timeout_ms, !ready ? "NCCL still in progress" : "stream not drained");
            abort_all(c, msg);
            return comm_fail(err, "nccl communicator", msg);
        }
        poll_pause(&iter);
    }
}

static bool capturing(const nccl_comm *c)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess)
        return false;
    return cs != cudaStreamCaptureStatusNone;
}

/* "all_reduce #3 (F32 x 8, 'tag') in group ep [ranks 0, 1]" */
static void what_of(const nccl_comm *c, const dsv4_coll_record *rec, const char *prefix, char *buf, size_t n)
{
    char d[160], g[200];
    dsv4_comm_describe(rec, d, sizeof d);
    group_label(c, rec->group, g, sizeof g);
    snprintf(buf, n, "%s%s in group %s", prefix, d, g);
}

/* After the real collective was issued: the enqueue and, eager with wait, the completion. */
static dsv4_status finish(nccl_comm *c, const dsv4_coll_record *rec, ncclResult_t r, bool cap, dsv4_error *err)
{
    char what[400];
    what_of(c, rec, "", what, sizeof what);
    return watch(c, c->g[rec->group].nc, r, !cap && c->opt.wait, c->opt.timeout_ms, what, err);
}

/* ---------------- fingerprints ---------------- */

void dsv4_nccl_fp_encode(const dsv4_coll_record *rec, const uint64_t *send_counts, const uint64_t *recv_counts, int n,
                         uint64_t *words)
{
    memset(words, 0, DSV4_NCCL_FP_WORDS(n) * sizeof *words);
    words[0] = rec->seq;
    words[1] = (uint64_t)rec->op;
    words[2] = (uint64_t)rec->group;
    words[3] = (uint64_t)rec->dtype;
    words[4] = rec->count;
    words[5] = rec->counts_hash;
    memcpy(&words[6], rec->tag, DSV4_COMM_TAG_MAX < 48 ? DSV4_COMM_TAG_MAX : 48);
    if (rec->op == DSV4_COLL_ALL_TO_ALLV && send_counts && recv_counts) {
        memcpy(&words[DSV4_NCCL_FP_HEAD], send_counts, (size_t)n * sizeof *words);
        memcpy(&words[DSV4_NCCL_FP_HEAD + n], recv_counts, (size_t)n * sizeof *words);
    }
}

static void fp_decode(const uint64_t *w, dsv4_coll_record *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->seq = w[0];
    rec->op = (dsv4_coll_op)w[1];
    rec->group = (dsv4_group)w[2];
    rec->dtype = (dsv4_dtype)w[3];
    rec->count = w[4];
    rec->counts_hash = w[5];
    memcpy(rec->tag, &w[6], DSV4_COMM_TAG_MAX < 48 ? DSV4_COMM_TAG_MAX : 48);
    rec->tag[DSV4_COMM_TAG_MAX - 1] = '\0';
}

static void member_name(dsv4_group group, const int *members, int i, char *buf, size_t n)
{
    if (group == DSV4_GROUP_WORLD)
        snprintf(buf, n, "rank %d", members[i]);
    else
        snprintf(buf, n, "rank %d (%s rank %d)", members[i], dsv4_group_name(group), i);
}

int dsv4_nccl_fp_compare(const uint64_t *words, int n, dsv4_group group, const int *members, char *msg, size_t cap)
{
    size_t W = DSV4_NCCL_FP_WORDS(n);
    dsv4_coll_record a, b;
    char na[64], nb[64], da[160], db[160];
    fp_decode(words, &a);
    for (int i = 1; i < n; i++) {
        fp_decode(words + i * W, &b);
        bool same = a.op == b.op && a.seq == b.seq && a.dtype == b.dtype && a.group == b.group;
        if (same && (a.op == DSV4_COLL_ALL_REDUCE || a.op == DSV4_COLL_ALL_GATHER) && a.count != b.count)
            same = false;
        if (same)
            continue;
        member_name(group, members, 0, na, sizeof na);
        member_name(group, members, i, nb, sizeof nb);
        dsv4_comm_describe(&a, da, sizeof da);
        dsv4_comm_describe(&b, db, sizeof db);
        snprintf(msg, cap, "collective mismatch in group %s: %s issued %s but %s issued %s", dsv4_group_name(group),
                 na, da, nb, db);
        return 1;
    }
    if (a.op != DSV4_COLL_ALL_TO_ALLV)
        return 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            uint64_t s = words[i * W + DSV4_NCCL_FP_HEAD + j], r = words[j * W + DSV4_NCCL_FP_HEAD + n + i];
            if (s == r)
                continue;
            fp_decode(words + i * W, &b);
            member_name(group, members, i, na, sizeof na);
            member_name(group, members, j, nb, sizeof nb);
            snprintf(msg, cap,
                     "collective mismatch in group %s: all_to_allv #%llu (%s, '%s'): %s sends %llu to %s, %s expects "
                     "%llu from %s",
                     dsv4_group_name(group), (unsigned long long)b.seq, dsv4_dtype_name(b.dtype), b.tag, na,
                     (unsigned long long)s, nb, nb, (unsigned long long)r, na);
            return 1;
        }
    return 0;
}

/* The debug exchange before an eager collective: all_gather of the fingerprints over the group, compare. */
static dsv4_status fp_check(nccl_comm *c, const dsv4_coll_record *rec, const uint64_t *send_counts,
                            const uint64_t *recv_counts, dsv4_error *err)
{
    nccl_group *g = &c->g[rec->group];
    size_t W = DSV4_NCCL_FP_WORDS(g->n);
    char what[400], msg[MSG_MAX];
    what_of(c, rec, "fingerprint exchange before ", what, sizeof what);
    uint64_t *mine = g->fp_host + (size_t)g->me * W;
    dsv4_nccl_fp_encode(rec, send_counts, recv_counts, g->n, mine);
    cudaError_t ce = cudaMemcpyAsync(g->fp_dev + (size_t)g->me * W, mine, W * 8, cudaMemcpyHostToDevice, c->stream);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "nccl rank %d: %s: cudaMemcpyAsync failed: %s", c->base.rank, what,
                 cudaGetErrorString(ce));
        abort_all(c, msg);
        return comm_fail(err, "nccl communicator", msg);
    }
    ncclResult_t r = ncclAllGather(g->fp_dev + (size_t)g->me * W, g->fp_dev, W, ncclUint64, g->nc, c->stream);
    dsv4_status st = watch(c, g->nc, r, false, c->opt.timeout_ms, what, err);
    if (st != DSV4_OK)
        return st;
    ce = cudaMemcpyAsync(g->fp_host, g->fp_dev, (size_t)g->n * W * 8, cudaMemcpyDeviceToHost, c->stream);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "nccl rank %d: %s: cudaMemcpyAsync failed: %s", c->base.rank, what,
                 cudaGetErrorString(ce));
        abort_all(c, msg);
        return comm_fail(err, "nccl communicator", msg);
    }
    st = watch(c, g->nc, ncclSuccess, true, c->opt.timeout_ms, what, err);
    if (st != DSV4_OK)
        return st;
    if (dsv4_nccl_fp_compare(g->fp_host, g->n, rec->group, g->members, msg, sizeof msg)) {
        /* Every rank of the group saw the same words and reports the same text; peers do not hang. */
        abort_all(c, msg);
        char where[64];
        snprintf(where, sizeof where, "comm group %s", dsv4_group_name(rec->group));
        return comm_fail(err, where, msg);
    }
    return DSV4_OK;
}

/* ---------------- the collectives ---------------- */

static dsv4_status prologue(nccl_comm *c, const dsv4_coll_record *rec, const uint64_t *sc, const uint64_t *rc,
                            bool *cap, dsv4_error *err)
{
    if (c->poisoned)
        return poisoned_err(c, rec, err);
    *cap = capturing(c);
    if (c->opt.fingerprint && !*cap)
        return fp_check(c, rec, sc, rc, err);
    return DSV4_OK;
}

static ncclDataType_t nccl_type(dsv4_dtype dt)
{
    switch (dt) {
    case DSV4_DTYPE_F32: return ncclFloat32;
    case DSV4_DTYPE_F64: return ncclFloat64;
    case DSV4_DTYPE_I32: return ncclInt32;
    case DSV4_DTYPE_I64: return ncclInt64;
    case DSV4_DTYPE_BF16: return ncclBfloat16;
    default: return ncclUint8;
    }
}

static dsv4_status local_error(nccl_comm *c, const dsv4_coll_record *rec, const char *text, dsv4_error *err)
{
    char what[400], msg[MSG_MAX];
    what_of(c, rec, "", what, sizeof what);
    snprintf(msg, sizeof msg, "nccl rank %d: %s: %s; communicator aborted", c->base.rank, what, text);
    abort_all(c, msg);
    return comm_fail(err, "nccl communicator", msg);
}

/* Drains the stream under the watchdog (an enqueued kernel may still read the old scratch), then replaces the
   scratch by one of `bytes`. DSV4_ERR_NOMEM leaves no scratch (the next all_reduce grows it again). */
static dsv4_status scratch_realloc(nccl_comm *c, ncclComm_t nc, size_t bytes, const char *what, dsv4_error *err)
{
    dsv4_status st = watch(c, nc, ncclSuccess, true, c->opt.timeout_ms, what, err);
    if (st != DSV4_OK)
        return st;
    cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (cudaMalloc(&c->scratch, bytes) != cudaSuccess) {
        c->scratch = NULL;
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "nccl all_reduce scratch", "rank %d: cudaMalloc of %zu bytes failed "
                           "(%s)", c->base.rank, bytes, what);
    }
    c->scratch_bytes = bytes;
    return DSV4_OK;
}

static dsv4_status grow_scratch(nccl_comm *c, size_t bytes, bool cap, const dsv4_coll_record *rec, dsv4_error *err)
{
    if (bytes <= c->scratch_bytes)
        return DSV4_OK;
    if (cap) {
        char t[200];
        snprintf(t, sizeof t, "the all_reduce scratch (%zu bytes) is too small for %zu bytes during graph capture; "
                 "call dsv4_nccl_reserve before capturing", c->scratch_bytes, bytes);
        return local_error(c, rec, t, err);
    }
    char what[400];
    what_of(c, rec, "growing the scratch for ", what, sizeof what);
    dsv4_status st = scratch_realloc(c, c->g[rec->group].nc, bytes, what, err);
    if (st == DSV4_ERR_NOMEM) /* the record is issued: peers would wait for us */
        return local_error(c, rec, "cudaMalloc of the all_reduce scratch failed", err);
    return st;
}

static dsv4_status nccl_all_reduce(dsv4_comm *comm, const dsv4_coll_record *rec, void *buf, dsv4_error *err)
{
    nccl_comm *c = (nccl_comm *)comm;
    bool cap;
    dsv4_status st = prologue(c, rec, NULL, NULL, &cap, err);
    if (st != DSV4_OK)
        return st;
    nccl_group *g = &c->g[rec->group];
    size_t bytes = (size_t)rec->count * dsv4_dtype_size(rec->dtype);
    if (rec->count == 0) /* still issued (peers join it), on a valid dummy buffer: NULL may be refused */
        return finish(c, rec, ncclAllReduce(c->barrier_dev, c->barrier_dev, 0, nccl_type(rec->dtype), ncclSum, g->nc,
                                            c->stream), cap, err);
    if (c->opt.native_reduce)
        return finish(c, rec, ncclAllReduce(buf, buf, (size_t)rec->count, nccl_type(rec->dtype), ncclSum, g->nc,
                                            c->stream), cap, err);
    st = grow_scratch(c, bytes * (size_t)g->n, cap, rec, err);
    if (st != DSV4_OK)
        return st;
    ncclResult_t r = ncclAllGather(buf, c->scratch, bytes, ncclUint8, g->nc, c->stream);
    if (r == ncclSuccess || r == ncclInProgress) {
        /* The kernel must be enqueued after NCCL's: wait for the enqueue only. */
        char what[400];
        what_of(c, rec, "", what, sizeof what);
        st = watch(c, g->nc, r, false, c->opt.timeout_ms, what, err);
        if (st != DSV4_OK)
            return st;
        int ke = dsv4_nccl_k_sum((int)rec->dtype, c->scratch, buf, g->n, rec->count, c->stream);
        if (ke != 0)
            return local_error(c, rec, cudaGetErrorString((cudaError_t)ke), err);
        r = ncclSuccess;
    }
    return finish(c, rec, r, cap, err);
}

static dsv4_status nccl_all_gather(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send, void *recv,
                                   dsv4_error *err)
{
    nccl_comm *c = (nccl_comm *)comm;
    bool cap;
    dsv4_status st = prologue(c, rec, NULL, NULL, &cap, err);
    if (st != DSV4_OK)
        return st;
    size_t bytes = (size_t)rec->count * dsv4_dtype_size(rec->dtype);
    if (bytes == 0)
        send = recv = c->barrier_dev;
    return finish(c, rec, ncclAllGather(send, recv, bytes, ncclUint8, c->g[rec->group].nc, c->stream), cap, err);
}

static dsv4_status nccl_all_to_allv(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send,
                                    const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                                    dsv4_error *err)
{
    nccl_comm *c = (nccl_comm *)comm;
    bool cap;
    dsv4_status st = prologue(c, rec, send_counts, recv_counts, &cap, err);
    if (st != DSV4_OK)
        return st;
    nccl_group *g = &c->g[rec->group];
    size_t dsz = dsv4_dtype_size(rec->dtype);
    const char *s = send;
    char *r = recv;
    size_t so = 0, ro = 0;
    ncclResult_t res = ncclGroupStart();
    /* Zero counts issue nothing: both sides agree on them (the fingerprint mode checks that they do). */
    for (int j = 0; j < g->n && (res == ncclSuccess || res == ncclInProgress); j++) {
        size_t sb = (size_t)send_counts[j] * dsz, rb = (size_t)recv_counts[j] * dsz;
        if (sb)
            res = ncclSend(s + so, sb, ncclUint8, j, g->nc, c->stream);
        if (rb && (res == ncclSuccess || res == ncclInProgress))
            res = ncclRecv(r + ro, rb, ncclUint8, j, g->nc, c->stream);
        so += sb;
        ro += rb;
    }
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess || res == ncclInProgress)
        res = end;
    return finish(c, rec, res, cap, err);
}

static dsv4_status nccl_barrier(dsv4_comm *comm, const dsv4_coll_record *rec, dsv4_error *err)
{
    nccl_comm *c = (nccl_comm *)comm;
    bool cap;
    dsv4_status st = prologue(c, rec, NULL, NULL, &cap, err);
    if (st != DSV4_OK)
        return st;
    /* NCCL has no barrier: a one-element all_reduce, always waited for when eager. */
    ncclResult_t r = ncclAllReduce(c->barrier_dev, c->barrier_dev, 1, ncclInt32, ncclSum, c->g[rec->group].nc,
                                   c->stream);
    char what[400];
    what_of(c, rec, "", what, sizeof what);
    return watch(c, c->g[rec->group].nc, r, !cap, c->opt.timeout_ms, what, err);
}

static const dsv4_comm_vtable nccl_vtable = {
    "nccl", nccl_all_reduce, nccl_all_gather, nccl_all_to_allv, nccl_barrier, nccl_abort_cb,
};

/* ---------------- create, free ---------------- */

static void comm_release(nccl_comm *c)
{
    if (!c)
        return;
    if (c->poisoned && !c->aborted)
        abort_all(c, c->poison_msg); /* poisoned under capture: abort now */
    if (!c->aborted) {
        /* Healthy: finalize (flush) each communicator, bounded; abort on timeout or error. */
        for (int g = DSV4_GROUP_COUNT - 1; g >= 0 && !c->aborted; g--) {
            if (!c->g[g].nc)
                continue;
            dsv4_status st = watch(c, c->g[g].nc, ncclCommFinalize(c->g[g].nc), false, c->opt.timeout_ms,
                                   "ncclCommFinalize", NULL);
            if (st == DSV4_OK) {
                ncclCommDestroy(c->g[g].nc);
                c->g[g].nc = NULL;
            }
        }
    }
    if (!c->aborted)
        for (int g = 0; g < DSV4_GROUP_COUNT; g++)
            if (c->g[g].nc)
                ncclCommAbort(c->g[g].nc);
    for (int g = 0; g < DSV4_GROUP_COUNT; g++) {
        c->g[g].nc = NULL;
        cudaFree(c->g[g].fp_dev);
        cudaFreeHost(c->g[g].fp_host);
    }
    cudaFree(c->barrier_dev);
    cudaFree(c->scratch);
    if (c->done)
        cudaEventDestroy(c->done);
    dsv4_comm_base_fini(&c->base);
    free(c);
}

static dsv4_status create_impl(const dsv4_comm_groups *groups, int rank, int local_rank, const dsv4_nccl_id *id,
                               const dsv4_nccl_options *opt, dsv4_comm **out, dsv4_error *err)
{
    static const char fn[] = "dsv4_nccl_comm_create";
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "out is NULL");
    *out = NULL;
    if (!groups || !id)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "%s is NULL", !groups ? "groups" : "id");
    int n = groups->world;
    if (n < 1 || n > DSV4_COMM_MAX_RANKS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "world %d is outside [1, %d]", n, DSV4_COMM_MAX_RANKS);
    if (rank < 0 || rank >= n)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "rank %d is outside [0, %d)", rank, n);
    for (int g = 1; g < DSV4_GROUP_COUNT; g++)
        for (int r = 0; r < n; r++)
            if (groups->color[g][r] < 0)
                return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "group %s colour of rank %d is negative (%d)",
                                   dsv4_group_name((dsv4_group)g), r, groups->color[g][r]);
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    if (opt) {
        if (opt->struct_size != sizeof o)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "options struct_size %u, expected %zu (call "
                               "dsv4_nccl_options_init)", opt->struct_size, sizeof o);
        o = *opt;
    }
    if (o.timeout_ms < 1 || o.init_timeout_ms < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "option %s %d must be >= 1 ms",
                           o.timeout_ms < 1 ? "timeout_ms" : "init_timeout_ms",
                           o.timeout_ms < 1 ? o.timeout_ms : o.init_timeout_ms);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, fn, "rank %d: no CUDA device (%s)", rank,
                           ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    int dev = o.device >= 0 ? o.device : (local_rank >= 0 ? local_rank : rank) % ndev;
    if (dev >= ndev)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "option device %d: only %d devices", dev, ndev);
    ce = cudaSetDevice(dev);
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, fn, "rank %d: cudaSetDevice(%d): %s", rank, dev,
                           cudaGetErrorString(ce));

    nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory");
    dsv4_comm_base_init(&c->base, &nccl_vtable, rank);
    c->opt = o;
    c->device = dev;
    c->stream = NULL;
    for (int g = 0; g < DSV4_GROUP_COUNT; g++) {
        nccl_group *gr = &c->g[g];
        gr->n = 0;
        for (int r = 0; r < n; r++)
            if (g == DSV4_GROUP_WORLD || groups->color[g][r] == groups->color[g][rank]) {
                if (r == rank)
                    gr->me = gr->n;
                gr->members[gr->n++] = r;
            }
        c->base.group_rank[g] = gr->me;
        c->base.group_size[g] = gr->n;
        size_t fpb = (size_t)gr->n * DSV4_NCCL_FP_WORDS(gr->n) * 8;
        if (cudaMalloc((void **)&gr->fp_dev, fpb) != cudaSuccess || cudaMallocHost((void **)&gr->fp_host, fpb) !=
            cudaSuccess) {
            c->aborted = true;
            comm_release(c);
            return dsv4_seterr(err, DSV4_ERR_DEVICE, fn, "rank %d: cannot allocate the fingerprint buffers", rank);
        }
    }
    if (cudaMalloc((void **)&c->barrier_dev, 16) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming) != cudaSuccess) {
        c->aborted = true;
        comm_release(c);
        return dsv4_seterr(err, DSV4_ERR_DEVICE, fn, "rank %d: cannot allocate the barrier word or event", rank);
    }
    cudaMemset(c->barrier_dev, 0, 16);

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId uid;
    memcpy(uid.internal, id->bytes, DSV4_NCCL_ID_BYTES);
    char what[200];
    snprintf(what, sizeof what, "bootstrap (ncclCommInitRankConfig, world of %d, device %d)", n, dev);
    ncclComm_t wc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&wc, n, uid, rank, &cfg);
    c->g[DSV4_GROUP_WORLD].nc = wc;
    dsv4_status st = watch(c, wc, r, false, o.init_timeout_ms, what, err);
    if (st == DSV4_OK) {
        for (int g = 1; g < DSV4_GROUP_COUNT && st == DSV4_OK; g++) {
            ncclConfig_t scfg = NCCL_CONFIG_INITIALIZER;
            scfg.blocking = 0;
            snprintf(what, sizeof what, "bootstrap (ncclCommSplit %s, colour %d)", dsv4_group_name((dsv4_group)g),
                     groups->color[g][rank]);
            /*
             * Non-blocking split: NCCL keeps *newcomm NULL until the split is complete and then stores the child
             * from its init thread, so it must point into c (never at a local), and the split's progress is the
             * parent's: its async error stays ncclInProgress until the job has ended.
             */
            r = ncclCommSplit(c->g[DSV4_GROUP_WORLD].nc, groups->color[g][rank], rank, &c->g[g].nc, &scfg);
            st = watch(c, c->g[DSV4_GROUP_WORLD].nc, r, false, o.init_timeout_ms, what, err);
            if (st == DSV4_OK && !__atomic_load_n(&c->g[g].nc, __ATOMIC_ACQUIRE)) {
                char msg[MSG_MAX];
                snprintf(msg, sizeof msg, "nccl rank %d: %s completed without a communicator (%s)", rank, what,
                         ncclGetLastError(NULL));
                abort_all(c, msg);
                st = comm_fail(err, "nccl communicator", msg);
            }
            if (st == DSV4_OK)
                st = watch(c, c->g[g].nc, ncclSuccess, false, o.init_timeout_ms, what, err);
        }
    }
    if (st != DSV4_OK) {
        if (err)
            snprintf(err->where, sizeof err->where, "nccl bootstrap, rank %d of %d", rank, n);
        comm_release(c);
        return st;
    }
    *out = &c->base;
    return DSV4_OK;
}

dsv4_status dsv4_nccl_comm_create(const dsv4_comm_groups *groups, int rank, const dsv4_nccl_id *id,
                                  const dsv4_nccl_options *opt, dsv4_comm **out, dsv4_error *err)
{
    dsv4_nccl_env env;
    int local = -1;
    if (dsv4_nccl_env_read(&env, NULL) == DSV4_OK)
        local = env.local_rank;
    return create_impl(groups, rank, local, id, opt, out, err);
}

dsv4_status dsv4_nccl_comm_create_from_env(const dsv4_comm_groups *groups, const dsv4_nccl_options *opt,
                                           dsv4_comm **out, dsv4_error *err)
{
    static const char fn[] = "dsv4_nccl_comm_create_from_env";
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "out is NULL");
    *out = NULL;
    if (!groups)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "groups is NULL");
    dsv4_nccl_env env;
    dsv4_status st = dsv4_nccl_env_read(&env, err);
    if (st != DSV4_OK)
        return st;
    if (groups->world != env.world)
        return dsv4_seterr(err, DSV4_ERR_CONFIG, fn, "groups are for a world of %d but %s says %d", groups->world,
                           env.world_var, env.world);
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    if (opt)
        o = *opt;
    const char *t = getenv("DSV4_NCCL_TIMEOUT_MS");
    if (t && *t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 1 || v > 86400000)
            return dsv4_seterr(err, DSV4_ERR_CONFIG, "environment variable DSV4_NCCL_TIMEOUT_MS",
                               "'%s' is not a timeout in [1, 86400000] ms", t);
        o.timeout_ms = (int)v;
    }
    const char *fp = getenv("DSV4_NCCL_FINGERPRINT");
    if (fp && *fp)
        o.fingerprint = strcmp(fp, "0") != 0;
    dsv4_nccl_id id;
    const char *hex = getenv("DSV4_NCCL_ID");
    const char *file = getenv("DSV4_NCCL_ID_FILE");
    if (hex && *hex) {
        st = dsv4_nccl_id_from_hex(hex, &id, err);
        if (st != DSV4_OK) {
            if (err)
                snprintf(err->where, sizeof err->where, "environment variable DSV4_NCCL_ID");
            return st;
        }
    } else if (file && *file) {
        if (env.rank == 0) {
            st = dsv4_nccl_unique_id(&id, err);
            if (st == DSV4_OK)
                st = dsv4_nccl_id_write_file(file, &id, err);
        } else {
            st = dsv4_nccl_id_read_file(file, o.init_timeout_ms, &id, err);
        }
        if (st != DSV4_OK)
            return st;
    } else {
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "environment variable DSV4_NCCL_ID_FILE",
                           "neither DSV4_NCCL_ID (hex) nor DSV4_NCCL_ID_FILE (a path all ranks see) is set");
    }
    return create_impl(groups, env.rank, env.local_rank, &id, &o, out, err);
}

bool dsv4_nccl_is_nccl(const dsv4_comm *comm)
{
    return comm && comm->vt == &nccl_vtable;
}

void dsv4_nccl_comm_free(dsv4_comm *comm)
{
    if (!dsv4_nccl_is_nccl(comm))
        return;
    comm_release((nccl_comm *)comm);
}

dsv4_status dsv4_nccl_set_stream(dsv4_comm *comm, void *stream, dsv4_error *err)
{
    if (!dsv4_nccl_is_nccl(comm))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_set_stream", "comm is not an NCCL endpoint");
    ((nccl_comm *)comm)->stream = (cudaStream_t)stream;
    return DSV4_OK;
}

void *dsv4_nccl_stream(const dsv4_comm *comm)
{
    return dsv4_nccl_is_nccl(comm) ? (void *)((const nccl_comm *)comm)->stream : NULL;
}

int dsv4_nccl_device(const dsv4_comm *comm)
{
    return dsv4_nccl_is_nccl(comm) ? ((const nccl_comm *)comm)->device : -1;
}

const char *dsv4_nccl_poison_reason(const dsv4_comm *comm)
{
    return dsv4_nccl_is_nccl(comm) ? ((const nccl_comm *)comm)->poison_msg : "";
}

dsv4_status dsv4_nccl_sync(dsv4_comm *comm, const char *what, dsv4_error *err)
{
    if (!dsv4_nccl_is_nccl(comm))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_sync", "comm is not an NCCL endpoint");
    nccl_comm *c = (nccl_comm *)comm;
    char msg[MSG_MAX], w[300];
    if (c->poisoned) {
        snprintf(msg, sizeof msg, "nccl rank %d: sync '%s' refused: the communicator was aborted by an earlier "
                 "error: %.*s", c->base.rank, what ? what : "", 600, c->poison_msg);
        return comm_fail(err, "nccl communicator", msg);
    }
    if (capturing(c))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_sync", "the stream is capturing a graph: sync "
                           "after cudaGraphLaunch, not inside the capture");
    snprintf(w, sizeof w, "sync '%s' (last collectives: %zu in the trace)", what ? what : "", c->base.trace_len);
    /* Watch every group's communicator for asynchronous errors while the stream drains. */
    dsv4_status st = DSV4_OK;
    for (int g = 0; g < DSV4_GROUP_COUNT && st == DSV4_OK; g++)
        st = watch(c, c->g[g].nc, ncclSuccess, g == DSV4_GROUP_WORLD, c->opt.timeout_ms, w, err);
    return st;
}

dsv4_status dsv4_nccl_reserve(dsv4_comm *comm, size_t bytes, dsv4_error *err)
{
    if (!dsv4_nccl_is_nccl(comm))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_reserve", "comm is not an NCCL endpoint");
    nccl_comm *c = (nccl_comm *)comm;
    size_t nmax = 1;
    for (int g = 0; g < DSV4_GROUP_COUNT; g++)
        if ((size_t)c->g[g].n > nmax)
            nmax = (size_t)c->g[g].n;
    if (bytes > SIZE_MAX / nmax)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_reserve", "%zu bytes overflow", bytes);
    if (capturing(c))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_reserve", "the stream is capturing a graph");
    size_t need = bytes * nmax;
    if (need <= c->scratch_bytes)
        return DSV4_OK;
    if (c->poisoned)
        return dsv4_seterr(err, DSV4_ERR_COMM, "dsv4_nccl_reserve", "the communicator was aborted: %.600s",
                           c->poison_msg);
    return scratch_realloc(c, c->g[DSV4_GROUP_WORLD].nc, need, "dsv4_nccl_reserve", err);
}

