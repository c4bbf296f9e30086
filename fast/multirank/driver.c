/* The multi-rank driver (fast/multirank/; its API is include/dsv4moe/dist.h, dsv4_dist_*): one
   step over simulated ranks, each rank composing the stages of its plan's backend
   (fast/backend/backend_impl.h) around the collectives, over the host sim communicator, or, for a
   backend whose rows live on a device (cuda), over its device communicator with the rows as device
   buffers; one step sequence (run_chunk) for both. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/alloc.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/weights.h"
#include "fast/backend/backend_impl.h"
#include "fast/multirank/driver_impl.h"
#include "core/err.h"
#include "core/testctl.h"

void dsv4_dist_options_init(dsv4_dist_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->timeout_ms = 5000;
    o->compute_backend = -1;
}

/* The range checks of every rank's input ids on hash layers, before any thread starts. */
static dsv4_status check_input_ids(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, int world,
                                   const dsv4_dist_rank *ranks, dsv4_error *err)
{
    if (!dsv4_config_is_hash_layer(cfg))
        return DSV4_OK;
    dsv4_allocator *a = NULL;
    dsv4_router_tensors rt;
    memset(&rt, 0, sizeof rt);
    dsv4_status st = dsv4_allocator_create(0, &a, err);
    if (!st)
        st = dsv4_router_tensors_load(ckpt, cfg, a, &rt, err);
    for (int r = 0; r < world && !st; r++)
        if ((st = dsv4_router_check_input_ids(cfg, rt.tid2eid, ranks[r].tokens, ranks[r].input_ids, "dist", err))) {
            char msg[DSV4_ERROR_MESSAGE_MAX];
            snprintf(msg, sizeof msg, "%s", err ? err->message : "");
            dsv4_seterr(err, st, "dist", "rank %d: %s", r, msg);
        }
    if (a)
        dsv4_router_tensors_release(&rt, a);
    dsv4_allocator_free(a);
    return st;
}

void dsv4_dist_rank_release(dsv4_dist_rank *r)
{
    if (!r)
        return;
    free(r->trace);
    r->trace = NULL;
    r->trace_len = 0;
}

typedef struct {
    const dsv4_config *cfg;
    const dsv4_plan *plan;            /* the step's protocol and shard */
    const dsv4_plan *cplan;           /* the computing backend's plan (plan, or the stand-in's) */
    dsv4_backend *be;                 /* this rank's backend (the plan's kind) */
    const dsv4_backend_stages *stage; /* its stages */
    void *impl;
    dsv4_comm *comm;
    dsv4_dist_rank *io;
    int rank;
    const dsv4_dist_options *opt;
    dsv4_allocator *acct; /* the driver's buffers of this rank, measured against the plan */
    const dsv4_backend_device *dev; /* the rows on the backend's device (fast/backend/backend_impl.h), or NULL */
    uint64_t dev_cur, dev_peak;     /* the driver's device buffers live now and at their peak */
} rank_ctx;

/* A token-slot of this rank's chunk: token (chunk-relative), slot, expert, weight. */
typedef struct {
    int64_t t;
    int32_t k, e;
    float w;
} slot;

/* The sorts' comparators: a's order against b, -1, 0 or 1. */
#define CMP(a, b) (((a) > (b)) - ((a) < (b)))

static int cmp_slot_expert(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    return x->e != y->e ? CMP(x->e, y->e) : x->t != y->t ? CMP(x->t, y->t) : CMP(x->k, y->k);
}

#define TRY(expr)                                                                                           \
    do {                                                                                                    \
        if ((st = (expr)))                                                                                  \
            goto done;                                                                                      \
    } while (0)

/* A chunk's slot bookkeeping, on the host through the rank's accounting allocator wherever its
   rows live. */
typedef struct {
    int32_t *ids, *tok, *ge, *sende, *recve, *shid;
    float *w, *sw, *gw, *sendw, *recvw;
    slot *sl, *rs;
} chunk_bufs;

static void release_bufs(dsv4_allocator *a, chunk_bufs *b)
{
    void *all[] = {b->ids, b->tok, b->ge, b->sende, b->recve, b->shid, b->w,
                   b->sw,  b->gw,  b->sendw, b->recvw, b->sl,   b->rs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dsv4_release(a, all[i]);
    memset(b, 0, sizeof *b);
}

static void *zalloc(dsv4_allocator *a, uint64_t n, size_t size, bool *oom)
{
    void *p = dsv4_alloc(a, (size_t)(n + 1) * size);
    *oom |= p == NULL;
    return p;
}

/* ---------------- where a rank's rows live ----------------
   A chunk's rows (token rows, dispatched rows, expert outputs, the shared rows) live on the host
   (the rank's accounting allocator) or, where the backend has a device (rank_ctx.dev), on it. The
   step sequence (run_chunk) is one; these helpers are the only places that tell the two apart. */

#define ROW_BUFS 16

/* The row buffers of one chunk (or of one exchange through the device), counted into the rank's
   peaks: the accounting allocator's on the host, dev_peak on a device. */
typedef struct {
    void *p[ROW_BUFS];
    size_t n[ROW_BUFS];
    int k;
} row_bufs;

static void *rows_alloc(rank_ctx *rc, row_bufs *d, uint64_t count, size_t size, bool *oom)
{
    size_t bytes = (size_t)(count + 1) * size;
    void *p = d->k >= ROW_BUFS ? NULL : rc->dev ? rc->dev->alloc(rc->impl, bytes) : dsv4_alloc(rc->acct, bytes);
    if (!p) {
        *oom = true;
        return NULL;
    }
    d->p[d->k] = p;
    d->n[d->k++] = bytes;
    if (rc->dev) {
        rc->dev_cur += bytes;
        rc->dev_peak = rc->dev_cur > rc->dev_peak ? rc->dev_cur : rc->dev_peak;
    }
    return p;
}

static void rows_release(rank_ctx *rc, row_bufs *d)
{
    for (int i = 0; i < d->k; i++) {
        if (!rc->dev) {
            dsv4_release(rc->acct, d->p[i]);
            continue;
        }
        if (rc->dev->release)
            rc->dev->release(rc->impl, d->p[i]);
        rc->dev_cur -= d->n[i];
    }
    d->k = 0;
}

/* dst[i] = src[idx[i]] for i < n: bf16 rows of H; idx on the host. */
static dsv4_status rows_gather(rank_ctx *rc, int64_t n, int64_t H, const uint16_t *src, const int32_t *idx,
                               uint16_t *dst, dsv4_error *err)
{
    if (rc->dev)
        return rc->dev->gather(rc->impl, n, H, src, idx, dst, err);
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * H, src + (int64_t)idx[i] * H, (size_t)H * sizeof *dst);
    return DSV4_OK;
}

static void round_bf16(const float *in, uint16_t *out, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = dsv4_f32_to_bf16(in[i]);
}

/* dst[idx ? idx[i] : i] = bf16(src[i]) for i < n: fp32 rows of H rounded to bf16. */
static dsv4_status rows_round(rank_ctx *rc, int64_t n, int64_t H, const float *src, const int32_t *idx, uint16_t *dst,
                              dsv4_error *err)
{
    if (rc->dev)
        return rc->dev->round(rc->impl, n, H, src, idx, dst, err);
    for (int64_t i = 0; i < n; i++)
        round_bf16(src + i * H, dst + (idx ? (int64_t)idx[i] : i) * H, (uint64_t)H);
    return DSV4_OK;
}

/* An all_to_allv over the ep group of small host arrays (counts, expert ids, weights): directly on
   the host communicator; through device buffers on a device one (it moves only device memory). */
static dsv4_status meta_all_to_allv(rank_ctx *rc, dsv4_dtype dt, const void *send, const uint64_t *sc, void *recv,
                                    const uint64_t *rcn, const char *tag, dsv4_error *err)
{
    if (!rc->dev)
        return dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, dt, send, sc, recv, rcn, tag, err);
    int P = dsv4_comm_group_size(rc->comm, DSV4_GROUP_EP);
    uint64_t ns = 0, nr = 0;
    for (int j = 0; j < P; j++) {
        ns += sc[j];
        nr += rcn[j];
    }
    size_t sz = dsv4_dtype_size(dt);
    row_bufs d = {0};
    bool oom = false;
    void *ds = rows_alloc(rc, &d, ns, sz, &oom), *dr = rows_alloc(rc, &d, nr, sz, &oom);
    dsv4_status st = oom ? dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of device memory for '%s'", tag) : DSV4_OK;
    if (!st)
        st = rc->dev->copy(rc->impl, ds, send, (size_t)ns * sz, err);
    if (!st)
        st = dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, dt, ds, sc, dr, rcn, tag, err);
    if (!st)
        st = rc->dev->copy(rc->impl, recv, dr, (size_t)nr * sz, err);
    rows_release(rc, &d);
    return st;
}

/* The step's metadata all_gather over the world, through device buffers where the rows are on a device. */
static dsv4_status step_meta(rank_ctx *rc, const int64_t meta[2], int64_t *all, int world, dsv4_error *err)
{
    if (!rc->dev)
        return dsv4_comm_all_gather(rc->comm, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, meta, 2, all, "step meta", err);
    row_bufs d = {0};
    bool oom = false;
    void *dm = rows_alloc(rc, &d, 2, sizeof(int64_t), &oom);
    void *da = rows_alloc(rc, &d, 2 * (uint64_t)world, sizeof(int64_t), &oom);
    dsv4_status st = oom ? dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of device memory for the step meta") : DSV4_OK;
    if (!st)
        st = rc->dev->copy(rc->impl, dm, meta, 2 * sizeof(int64_t), err);
    if (!st)
        st = dsv4_comm_all_gather(rc->comm, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, dm, 2, da, "step meta", err);
    if (!st)
        st = rc->dev->copy(rc->impl, all, da, (size_t)world * 2 * sizeof(int64_t), err);
    rows_release(rc, &d);
    return st;
}

/* ---------------- the step sequence of a chunk ---------------- */

/* The kept slots of n routed tokens (b->ids, b->w) in b->sl sorted by (expert, token, slot), their
   tokens and weights in b->tok, b->sw; returns their count. The sentinel E is no expert and is
   never sent or computed. */
static int64_t kept_slots(const dsv4_config *c, int64_t n, chunk_bufs *b)
{
    int64_t K = c->n_activated, E = c->n_routed_experts, ns = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            if (b->ids[t * K + k] != (int32_t)E || DSV4_TESTHOOK(KEEP_SENTINEL_IDS)) /* test hook: sentinel unsanitised */
                b->sl[ns++] = (slot){t, (int32_t)k, b->ids[t * K + k], b->w[t * K + k]};
    qsort(b->sl, (size_t)ns, sizeof *b->sl, cmp_slot_expert);
    for (int64_t s = 0; s < ns; s++) {
        b->tok[s] = (int32_t)b->sl[s].t;
        b->sw[s] = b->sl[s].w;
    }
    return ns;
}

/* The shared expert's rows of the chunk's n tokens (rows x) on this rank (partial under tp), fp32 into out. */
static dsv4_status shared_rows(rank_ctx *rc, int64_t n, const uint16_t *x, int64_t i0, int64_t ni, chunk_bufs *b,
                               float *out, dsv4_error *err)
{
    for (int64_t t = 0; t < n; t++)
        b->shid[t] = DSV4_SHARED_EXPERT;
    return n ? rc->stage->experts(rc->impl, n, x, b->shid, NULL, i0, ni, out, err) : DSV4_OK;
}

/* A chunk's routing buffers for nk = n K slots: ids, weights, slot records, their tokens and weights. */
static void slot_bufs(dsv4_allocator *A, chunk_bufs *b, uint64_t nk, bool *oom)
{
    b->ids = zalloc(A, nk, sizeof *b->ids, oom);
    b->w = zalloc(A, nk, sizeof *b->w, oom);
    b->sl = zalloc(A, nk, sizeof *b->sl, oom);
    b->tok = zalloc(A, nk, sizeof *b->tok, oom);
    b->sw = zalloc(A, nk, sizeof *b->sw, oom);
}

/* ep: a chunk's counts per rank of the ep group (P ranks), each way (dispatch_counts, row_counts). */
typedef struct {
    int P;
    uint64_t sc[DSV4_COMM_MAX_RANKS], rcn[DSV4_COMM_MAX_RANKS], ones[DSV4_COMM_MAX_RANKS];
    uint64_t scH[DSV4_COMM_MAX_RANKS], rcH[DSV4_COMM_MAX_RANKS];
    int64_t scount[DSV4_COMM_MAX_RANKS], rcount[DSV4_COMM_MAX_RANKS];
} ep_counts;

/* ep: the slots received from each rank (rcount from the counts' exchange) as rcn, the rows' element
   counts each way (scH, rcH: H values a slot); returns the slots received. */
static uint64_t row_counts(ep_counts *x, uint64_t H)
{
    uint64_t nr = 0;
    for (int j = 0; j < x->P; j++) {
        x->rcn[j] = (uint64_t)x->rcount[j];
        nr += x->rcn[j];
        x->scH[j] = x->sc[j] * H;
        x->rcH[j] = x->rcn[j] * H;
    }
    return nr;
}

/* The chunk [c0, c0 + n) of the rank's tokens (rows x) through the route stage into b->ids and
   b->w (and the caller's topk outputs), then its kept slots (*ns, kept_slots). */
static dsv4_status route_chunk(rank_ctx *rc, int64_t c0, int64_t n, const uint16_t *x, chunk_bufs *b, int64_t *ns,
                               dsv4_error *err)
{
    dsv4_dist_rank *io = rc->io;
    int64_t K = rc->cfg->n_activated;
    dsv4_status st = n ? rc->stage->route(rc->impl, n, x, io->input_ids ? io->input_ids + c0 : NULL, b->ids, b->w,
                                          NULL, err)
                       : DSV4_OK;
    if (st)
        return st;
    if (io->topk_ids)
        memcpy(io->topk_ids + c0 * K, b->ids, (size_t)(n * K) * sizeof *b->ids);
    if (io->topk_weights)
        memcpy(io->topk_weights + c0 * K, b->w, (size_t)(n * K) * sizeof *b->w);
    *ns = kept_slots(rc->cfg, n, b);
    return DSV4_OK;
}

/* ep: each slot's destination rank, counted (sc, and as int64 for the counts' exchange; ones: one
   count to and from every rank). sl is sorted by expert, so it is grouped by destination. */
static void dispatch_counts(const rank_ctx *rc, const chunk_bufs *b, int64_t ns, ep_counts *x)
{
    int P = x->P = dsv4_comm_group_size(rc->comm, DSV4_GROUP_EP);
    int64_t per = rc->cfg->n_routed_experts / P;
    for (int j = 0; j < P; j++)
        x->sc[j] = 0;
    for (int64_t s = 0; s < ns; s++)
        x->sc[b->sl[s].e / per < P ? b->sl[s].e / per : P - 1]++; /* (F12's sentinel goes to the last rank) */
    for (int j = 0; j < P; j++) {
        x->ones[j] = 1;
        x->scount[j] = (int64_t)x->sc[j];
    }
}

/* ep: the received slots (recve, recvw) checked against this rank's experts and grouped in rs by
   ascending id (received order inside a group: source rank, then its token order). */
static dsv4_status received_groups(const rank_ctx *rc, chunk_bufs *b, uint64_t nr, dsv4_error *err)
{
    int64_t first = dsv4_plan_expert_first(rc->plan), cnt = dsv4_plan_expert_count(rc->plan);
    for (uint64_t q = 0; q < nr; q++) {
        if (b->recve[q] < first || b->recve[q] >= first + cnt)
            return dsv4_seterr(err, DSV4_ERR_INTERNAL, "dist", "rank %d received expert %d outside its [%lld, %lld)",
                               rc->rank, b->recve[q], (long long)first, (long long)(first + cnt));
        b->rs[q] = (slot){(int64_t)q, 0, b->recve[q], b->recvw[q]};
    }
    qsort(b->rs, (size_t)nr, sizeof *b->rs, cmp_slot_expert);
    return DSV4_OK;
}

/* Without ep: every slot names an expert of this rank. */
static dsv4_status local_slots(const rank_ctx *rc, const chunk_bufs *b, int64_t ns, dsv4_error *err)
{
    int64_t first = dsv4_plan_expert_first(rc->plan), cnt = dsv4_plan_expert_count(rc->plan);
    for (int64_t s = 0; s < ns; s++)
        if (b->sl[s].e < first || b->sl[s].e >= first + cnt)
            return dsv4_seterr(err, DSV4_ERR_INTERNAL, "dist", "rank %d: a slot names expert %d outside [%lld, %lld)",
                               rc->rank, b->sl[s].e, (long long)first, (long long)(first + cnt));
    return DSV4_OK;
}

/*
 * One chunk [c0, c0 + n) of the rank's tokens: route, (ep) dispatch, the rank's experts, (ep) the
 * way back or (tp) the reduce, combine. The rows live where the rank's backend keeps them (the
 * helpers above): on a device, the chunk's token rows are copied there once, route reads them
 * there, the dispatched rows are gathered, exchanged, regrouped, computed, rounded and sent back
 * as device buffers, and combine reads the outputs there and writes the rank's y. The slot
 * bookkeeping stays on the host either way. The collectives, their order and tags are the same
 * wherever the rows live, so are the fingerprint traces. A 0-row chunk computes nothing but joins
 * every collective.
 */
static dsv4_status run_chunk(rank_ctx *rc, int64_t c0, int64_t n, dsv4_error *err)
{
    const dsv4_config *c = rc->cfg;
    const dsv4_topology *tp = dsv4_plan_topology(rc->plan);
    int64_t H = c->dim, K = c->n_activated;
    int64_t i0 = dsv4_plan_inter_first(rc->plan), ni = dsv4_plan_inter_count(rc->plan);
    dsv4_dist_rank *io = rc->io;
    bool has_shared = c->n_shared_experts > 0, oom = false;
    dsv4_status st = DSV4_OK;
    dsv4_allocator *A = rc->acct;
    chunk_bufs b;
    memset(&b, 0, sizeof b);
    row_bufs d = {0};
    uint64_t uH = (uint64_t)H;
    slot_bufs(A, &b, (uint64_t)(n * K), &oom);
    b.shid = has_shared ? zalloc(A, (uint64_t)n, sizeof *b.shid, &oom) : NULL;
    /* the chunk's token rows: the caller's on the host, a copy on a device */
    const uint16_t *x = io->x ? io->x + c0 * H : NULL;
    uint16_t *dx = rc->dev ? rows_alloc(rc, &d, (uint64_t)n * uH, sizeof *dx, &oom) : NULL;
    uint16_t *ob = NULL, *shb = NULL; /* the slots' outputs and the shared rows, bf16, for combine */
    if (oom) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for a chunk of %lld tokens", (long long)n);
        goto done;
    }
    if (dx) {
        if (n)
            TRY(rc->dev->copy(rc->impl, dx, x, (size_t)(n * H) * sizeof *dx, err));
        x = dx;
    }
    /* 1: route */
    int64_t ns = 0;
    TRY(route_chunk(rc, c0, n, x, &b, &ns, err));

    if (tp->ep > 1) {
        /* 2: dispatch the slots to the ranks holding their experts (sl is sorted by expert, so it is
           grouped by destination in rank order) */
        ep_counts ec;
        dispatch_counts(rc, &b, ns, &ec);
        TRY(meta_all_to_allv(rc, DSV4_DTYPE_I64, ec.scount, ec.ones, ec.rcount, ec.ones, "dispatch counts", err));
        uint64_t nr = row_counts(&ec, uH);
        b.sende = zalloc(A, (uint64_t)ns, sizeof *b.sende, &oom);
        b.sendw = zalloc(A, (uint64_t)ns, sizeof *b.sendw, &oom);
        b.recve = zalloc(A, nr, sizeof *b.recve, &oom);
        b.recvw = zalloc(A, nr, sizeof *b.recvw, &oom);
        b.rs = zalloc(A, nr, sizeof *b.rs, &oom);
        b.ge = zalloc(A, nr, sizeof *b.ge, &oom);
        b.gw = zalloc(A, nr, sizeof *b.gw, &oom);
        uint16_t *sendx = rows_alloc(rc, &d, (uint64_t)ns * uH, sizeof *sendx, &oom);
        uint16_t *recvx = rows_alloc(rc, &d, nr * uH, sizeof *recvx, &oom);
        uint16_t *gx = rows_alloc(rc, &d, nr * uH, sizeof *gx, &oom);
        float *go = rows_alloc(rc, &d, nr * uH, sizeof *go, &oom);
        uint16_t *sendo = rows_alloc(rc, &d, nr * uH, sizeof *sendo, &oom);
        ob = rows_alloc(rc, &d, (uint64_t)ns * uH, sizeof *ob, &oom);
        if (oom) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for %llu received slots",
                             (unsigned long long)nr);
            goto done;
        }
        for (int64_t s = 0; s < ns; s++) {
            b.sende[s] = b.sl[s].e;
            b.sendw[s] = b.sl[s].w;
        }
        TRY(rows_gather(rc, ns, H, x, b.tok, sendx, err));
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_BF16, sendx, ec.scH, recvx, ec.rcH,
                                  "dispatch rows", err));
        TRY(meta_all_to_allv(rc, DSV4_DTYPE_I32, b.sende, ec.sc, b.recve, ec.rcn, "dispatch experts", err));
        TRY(meta_all_to_allv(rc, DSV4_DTYPE_F32, b.sendw, ec.sc, b.recvw, ec.rcn, "dispatch weights", err));
        /* 3: this rank's experts, grouped in ascending id (received order inside a group: source
           rank, then its token order); the received order is kept for the way back, in the
           received expert ids' buffer (read into rs, free again) */
        TRY(received_groups(rc, &b, nr, err));
        int32_t *gidx = b.recve;
        for (uint64_t q = 0; q < nr; q++) {
            gidx[q] = (int32_t)b.rs[q].t;
            b.ge[q] = b.rs[q].e;
            b.gw[q] = b.rs[q].w;
        }
        TRY(rows_gather(rc, (int64_t)nr, H, recvx, gidx, gx, err));
        if (nr)
            TRY(rc->stage->experts(rc->impl, (int64_t)nr, gx, b.ge, b.gw, i0, ni, go, err));
        /* 4: the outputs back to the home ranks, in the order they were sent (expert row q is row
           gidx[q] of the send buffer) */
        TRY(rows_round(rc, (int64_t)nr, H, go, gidx, sendo, err));
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_BF16, sendo, ec.rcH, ob, ec.scH,
                                  "combine rows", err));
        if (has_shared) {
            float *shf = rows_alloc(rc, &d, (uint64_t)n * uH, sizeof *shf, &oom);
            shb = rows_alloc(rc, &d, (uint64_t)n * uH, sizeof *shb, &oom);
            if (oom) {
                st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for the shared rows of %lld tokens",
                                 (long long)n);
                goto done;
            }
            TRY(shared_rows(rc, n, x, i0, ni, &b, shf, err));
            TRY(rows_round(rc, n, H, shf, NULL, shb, err));
        }
    } else {
        /* every expert here; under tp, this rank's share of moe_inter_dim */
        TRY(local_slots(rc, &b, ns, err));
        uint64_t len = (uint64_t)(ns * H) + (has_shared ? (uint64_t)(n * H) : 0);
        b.ge = zalloc(A, (uint64_t)ns, sizeof *b.ge, &oom);
        uint16_t *gx = rows_alloc(rc, &d, (uint64_t)ns * uH, sizeof *gx, &oom);
        float *go = rows_alloc(rc, &d, len, sizeof *go, &oom); /* slots' rows, then the shared rows (one all_reduce) */
        ob = rows_alloc(rc, &d, (uint64_t)ns * uH, sizeof *ob, &oom);
        shb = has_shared ? rows_alloc(rc, &d, (uint64_t)n * uH, sizeof *shb, &oom) : NULL;
        if (oom) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for %lld slots", (long long)ns);
            goto done;
        }
        for (int64_t s = 0; s < ns; s++)
            b.ge[s] = b.sl[s].e;
        TRY(rows_gather(rc, ns, H, x, b.tok, gx, err));
        if (ns)
            TRY(rc->stage->experts(rc->impl, ns, gx, b.ge, b.sw, i0, ni, go, err));
        if (has_shared)
            TRY(shared_rows(rc, n, x, i0, ni, &b, go + ns * H, err));
        /* tp: one all_reduce of the partial down projections, slots then shared rows */
        if (tp->tp > 1)
            TRY(dsv4_comm_all_reduce(rc->comm, DSV4_GROUP_TP, DSV4_DTYPE_F32, go, len, "tp reduce", err));
        TRY(rows_round(rc, ns, H, go, NULL, ob, err));
        if (has_shared)
            TRY(rows_round(rc, n, H, go + ns * H, NULL, shb, err));
    }
    /* 5: combine on the home rank, each token's slots in ascending expert id */
    if (n)
        TRY(rc->stage->combine(rc->impl, n, ns, b.tok, b.sw, ob, shb, io->y + c0 * H, err));
done:
    rows_release(rc, &d);
    release_bufs(A, &b);
    return st;
}

static void *rank_main(void *p)
{
    rank_ctx *rc = p;
    dsv4_dist_rank *io = rc->io;
    dsv4_error *err = &io->error;
    dsv4_status st = DSV4_OK;
    int world = dsv4_comm_group_size(rc->comm, DSV4_GROUP_WORLD);
    int64_t T = io->tokens, maxT = T;
    bool replay_ok = io->can_replay && dsv4_plan_can_replay(rc->plan, T);
    bool all_replay = replay_ok;
    if (DSV4_TESTHOOK_RANK(SKIP_METADATA_COLLECTIVE, rc->rank) && replay_ok) {
        /* The review's defect: a graph-replaying rank skips the plan collective. */
    } else {
        int64_t meta[2] = {T, replay_ok ? 1 : 0}, all[2 * DSV4_COMM_MAX_RANKS];
        if ((st = step_meta(rc, meta, all, world, err)))
            goto out;
        for (int r = 0; r < world; r++) {
            maxT = all[2 * r] > maxT ? all[2 * r] : maxT;
            all_replay = all_replay && all[2 * r + 1];
        }
    }
    io->step_max_tokens = maxT;
    io->replayed = all_replay && dsv4_plan_can_replay(rc->plan, maxT);
    if (rc->stage->graphs && (st = rc->stage->graphs(rc->impl, false, io->replayed, &io->graphs_held, err)))
        goto out;
    int64_t nch = dsv4_plan_chunks(rc->plan, maxT), ct = dsv4_plan_chunk_tokens(rc->plan);
    nch += DSV4_TESTHOOK(ZERO_SIZE_CHUNK) && maxT == 0; /* test hook: a zero-size chunk when every rank is empty */
    io->chunks = nch;
    io->workspace_planned = rc->cplan == rc->plan ? dsv4_plan_workspace_bytes(rc->plan, maxT, io->replayed)
                                                  : dsv4_plan_workspace_bytes(rc->cplan, maxT, false);
    for (int64_t ch = 0; ch < nch; ch++) {
        int64_t b = ch * ct, e = b + ct < T ? b + ct : T;
        if ((st = run_chunk(rc, b < T ? b : T, e > b ? e - b : 0, err)))
            goto out;
    }
out:
    io->status = st;
    /* The driver's buffers (host and device) and the backend's workspace are live together. */
    dsv4_backend_stats bs = dsv4_backend_get_stats(rc->be);
    io->workspace_peak = dsv4_allocator_stats(rc->acct).peak + rc->dev_peak + bs.workspace_peak;
    io->weights_planned = dsv4_plan_weight_bytes(rc->cplan), io->weights_bound = bs.weights_allocated;
    io->graph_replays = bs.graph_replays;
    size_t n = 0;
    const dsv4_coll_record *tr = dsv4_comm_trace(rc->comm, &n);
    io->trace = n ? malloc(n * sizeof *io->trace) : NULL;
    if (io->trace) {
        memcpy(io->trace, tr, n * sizeof *io->trace);
        io->trace_len = n;
    }
    return NULL;
}

/* The layer as a stand-in computes it: gemm fp8 is a cuda mode, so another backend runs its own
   (auto) numerics. */
static dsv4_config standin_config(const dsv4_config *cfg, bool standin)
{
    dsv4_config c = *cfg;
    if (standin && c.gemm == DSV4_GEMM_FP8)
        c.gemm = DSV4_GEMM_AUTO;
    return c;
}

dsv4_status dsv4_dist_forward(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                              const dsv4_budget *budget, const dsv4_dist_options *opt, dsv4_dist_rank *ranks,
                              dsv4_error *err)
{
    return dsv4_dist_forward_on(cfg, ckpt, topo, budget, opt, NULL, ranks, err);
}

dsv4_status dsv4_dist_forward_on(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                                 const dsv4_budget *budget, const dsv4_dist_options *opt,
                                 const dsv4_backend_device *device, dsv4_dist_rank *ranks, dsv4_error *err)
{
    if (!cfg || !ckpt || !topo || !budget || !ranks)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist", "arguments must not be NULL");
    dsv4_dist_options defaults;
    dsv4_dist_options_init(&defaults);
    if (!opt)
        opt = &defaults;
    if (opt->struct_size != sizeof *opt)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist options", "struct_size %u is not %zu", opt->struct_size,
                           sizeof *opt);
    dsv4_status vst = dsv4_config_validate(cfg, err);
    if (vst)
        return vst;
    int world = topo->world_size;
    if (world < 1 || world > DSV4_COMM_MAX_RANKS)
        return dsv4_seterr(err, DSV4_ERR_REFUSED, "plan", "world_size %d is outside [1, %d]", world,
                           DSV4_COMM_MAX_RANKS);
    int64_t H = cfg->dim;
    dsv4_plan *plans[DSV4_COMM_MAX_RANKS] = {0}, *cplans[DSV4_COMM_MAX_RANKS] = {0};
    dsv4_allocator *acct[DSV4_COMM_MAX_RANKS] = {0};
    rank_ctx ctx[DSV4_COMM_MAX_RANKS];
    pthread_t th[DSV4_COMM_MAX_RANKS];
    bool started[DSV4_COMM_MAX_RANKS] = {0};
    dsv4_backend *be[DSV4_COMM_MAX_RANKS] = {0};
    dsv4_sim_world *sw = NULL;
    const dsv4_backend_device *dev = NULL; /* the rows on the backend's device, its communicator */
    void *dw = NULL;
    dsv4_status st = DSV4_OK;
    for (int r = 0; r < world; r++) {
        dsv4_dist_rank *io = &ranks[r];
        io->trace = NULL;
        io->trace_len = 0;
        io->status = DSV4_OK;
        io->graphs_held = 0, io->graph_replays = 0, io->weights_planned = io->weights_bound = 0;
        dsv4_error_clear(&io->error);
        if (io->tokens < 0 || (io->tokens > 0 && (!io->x || !io->y)))
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist", "rank %d: tokens %lld with x %s and y %s", r,
                               (long long)io->tokens, io->x ? "set" : "NULL", io->y ? "set" : "NULL");
        if (io->tokens > topo->max_tokens_per_rank)
            return dsv4_seterr(err, DSV4_ERR_RANGE, "dist",
                               "rank %d holds %lld tokens, above max_tokens_per_rank = %lld of the plan", r,
                               (long long)io->tokens, (long long)topo->max_tokens_per_rank);
    }
    if (topo->tp > 1) /* TP ranks compute shares of the same tokens */
        for (int r = 0; r < world; r++) {
            int lead = r - r % topo->tp;
            const dsv4_dist_rank *a = &ranks[lead], *b = &ranks[r];
            if (a->tokens != b->tokens ||
                (a->tokens && memcmp(a->x, b->x, (size_t)(a->tokens * H) * sizeof *a->x)) ||
                (a->tokens && (a->input_ids == NULL) != (b->input_ids == NULL)) ||
                (a->tokens && a->input_ids && memcmp(a->input_ids, b->input_ids, (size_t)a->tokens * sizeof(int32_t))))
                return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist",
                                   "ranks %d and %d are in one tp group (tp = %d) but hold different tokens", lead,
                                   r, topo->tp);
        }
    bool standin = opt->compute_backend >= 0 && opt->compute_backend != (int)topo->backend;
    if (opt->compute_backend >= dsv4_backend_count())
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist options", "compute_backend %d is not -1 or a backend kind",
                           opt->compute_backend);
    dsv4_config scfg = standin_config(cfg, standin);
    for (int r = 0; r < world; r++) {
        dsv4_topology t = *topo;
        t.rank = r;
        if ((st = dsv4_plan_create(cfg, &t, budget, &plans[r], err)) ||
            (st = dsv4_allocator_create(0, &acct[r], err)))
            goto done;
        if (standin) {
            t.backend = (dsv4_backend_kind)opt->compute_backend;
            t.cuda_graph = false;
            t.n_buckets = 0;
            if ((st = dsv4_plan_create(&scfg, &t, budget, &cplans[r], err)))
                goto done;
        }
    }
    /* A rank's bad input would otherwise surface as its peers' deadlock reports. */
    if ((st = check_input_ids(cfg, ckpt, world, ranks, err)))
        goto done;
    dsv4_backend_options bopt;
    dsv4_backend_options_init(&bopt);
    bopt.threads = 1; /* the ranks are the threads */
    bopt.params = standin ? NULL : opt->backend_params;
    for (int r = 0; r < world; r++) {
        if ((st = dsv4_backend_create_with(standin ? cplans[r] : plans[r], ckpt, &bopt, &be[r], err)))
            goto done;
        const dsv4_backend_stages *sg = dsv4_backend_get_stages(be[r]);
        if (!sg) {
            st = dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "dist", "backend %s has no stages to run rank %d",
                             dsv4_backend_name(be[r]), r);
            goto done;
        }
        /* A rank that can replay holds its graphs, captured before the step (engine start-up). */
        bool replay_ok = ranks[r].can_replay && dsv4_plan_can_replay(plans[r], ranks[r].tokens);
        if (sg->graphs && (st = sg->graphs(be[r]->impl, replay_ok, false, &ranks[r].graphs_held, err)))
            goto done;
    }
    dsv4_comm_groups groups;
    dsv4_sim_options so;
    dsv4_sim_options_init(&so);
    so.timeout_ms = opt->timeout_ms;
    dev = device ? device : opt->rows_on_host ? NULL : dsv4_backend_get_stages(be[0])->device;
    if ((st = dsv4_comm_groups_init(&groups, world, topo->tp, topo->dp, topo->ep, err)) ||
        (st = dev ? dev->world_create(&groups, opt->timeout_ms, &dw, err) : dsv4_sim_world_create(&groups, &so, &sw, err)))
        goto done;
    for (int r = 0; r < world; r++) {
        ctx[r] = (rank_ctx){cfg,      plans[r], standin ? cplans[r] : plans[r], be[r], dsv4_backend_get_stages(be[r]),
                            be[r]->impl, dev ? dev->world_comm(dw, r) : dsv4_sim_world_comm(sw, r), &ranks[r], r, opt,
                            acct[r],  dev,      0,                              0};
        started[r] = pthread_create(&th[r], NULL, rank_main, &ctx[r]) == 0;
        if (!started[r]) {
            /* Without its thread the rank never arrives: the others get the deadlock report. */
            ranks[r].status = dsv4_seterr(&ranks[r].error, DSV4_ERR_INTERNAL, "dist", "rank %d: no thread", r);
        }
    }
    for (int r = 0; r < world; r++)
        if (started[r])
            pthread_join(th[r], NULL);
    /* The cause, not its echo: a rank's own error before the others' communication errors. */
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int r = 0; r < world; r++)
            if (ranks[r].status && (pass == 1 || ranks[r].status != DSV4_ERR_COMM)) {
                st = ranks[r].status;
                if (err)
                    *err = ranks[r].error;
                break;
            }
done:
    dsv4_sim_world_free(sw);
    if (dw)
        dev->world_free(dw);
    for (int r = 0; r < world; r++) {
        dsv4_backend_free(be[r]);
        dsv4_plan_free(plans[r]);
        dsv4_plan_free(cplans[r]);
        dsv4_allocator_free(acct[r]);
    }
    return st;
}

/* ---------------- the single-rank counterpart ---------------- */

/* A slot of the union of every rank's chunk: rank, index in that rank's sorted slots, expert. */
typedef struct {
    int32_t r, e;
    int64_t s;
} uslot;

static int cmp_uslot(const void *a, const void *b)
{
    const uslot *x = a, *y = b;
    return x->e != y->e ? CMP(x->e, y->e) : x->r != y->r ? CMP(x->r, y->r) : CMP(x->s, y->s);
}

/* A rank's chunk in the single-rank counterpart: its slot bookkeeping and its rows, on the host. */
typedef struct {
    chunk_bufs c;
    uint16_t *gx, *ob, *shb;
    float *go, *shf;
} single_rank;

typedef struct {
    single_rank b[DSV4_COMM_MAX_RANKS];
    int64_t ns[DSV4_COMM_MAX_RANKS];
    uslot *u;
    uint16_t *ux;
    int32_t *ue;
    float *uw, *uo;
} single_bufs;

static void *xmalloc(uint64_t n, size_t size, bool *oom)
{
    void *p = malloc((size_t)(n + 1) * size);
    *oom |= p == NULL;
    return p;
}

static void single_free(single_bufs *S, int world)
{
    for (int r = 0; r < world; r++) {
        single_rank *R = &S->b[r];
        chunk_bufs *b = &R->c;
        void *all[] = {b->ids, b->w, b->sl, b->tok, b->sw, b->shid, R->shf, R->shb, R->gx, b->ge, R->go, R->ob};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    free(S->u);
    free(S->ux);
    free(S->ue);
    free(S->uw);
    free(S->uo);
}

/* One chunk index c0 of every rank on one backend handle (see dsv4_dist_single_rank). */
static dsv4_status single_chunk(const dsv4_config *c, const dsv4_topology *topo, const dsv4_backend_stages *stg,
                                void *impl, dsv4_dist_rank *ranks, int64_t c0, int64_t ct, single_bufs *S,
                                dsv4_error *err)
{
    int world = topo->world_size;
    int64_t H = c->dim, K = c->n_activated, I = c->moe_inter_dim, nu = 0;
    dsv4_status st = DSV4_OK;
    for (int r = 0; r < world && !st; r++) {
        dsv4_dist_rank *io = &ranks[r];
        single_rank *R = &S->b[r];
        chunk_bufs *b = &R->c;
        int64_t n = io->tokens - c0 < ct ? io->tokens - c0 : ct;
        n = n > 0 ? n : 0;
        S->ns[r] = 0;
        if (n && (st = stg->route(impl, n, io->x + c0 * H, io->input_ids ? io->input_ids + c0 : NULL, b->ids, b->w,
                                  NULL, err)))
            break;
        if (io->topk_ids)
            memcpy(io->topk_ids + c0 * K, b->ids, (size_t)(n * K) * sizeof *b->ids);
        if (io->topk_weights)
            memcpy(io->topk_weights + c0 * K, b->w, (size_t)(n * K) * sizeof *b->w);
        S->ns[r] = kept_slots(c, n, b);
        for (int64_t s = 0; s < S->ns[r]; s++)
            S->u[nu++] = (uslot){r, b->sl[s].e, s};
        if (topo->ep <= 1) { /* the rank's own groups, as it computes them */
            for (int64_t s = 0; s < S->ns[r]; s++) {
                memcpy(R->gx + s * H, io->x + (c0 + b->sl[s].t) * H, (size_t)H * sizeof *R->gx);
                b->ge[s] = b->sl[s].e;
            }
            if (S->ns[r] && (st = stg->experts(impl, S->ns[r], R->gx, b->ge, b->sw, 0, I, R->go, err)))
                break;
            round_bf16(R->go, R->ob, (uint64_t)(S->ns[r] * H));
        }
        if (b->shid && n) {
            for (int64_t t = 0; t < n; t++)
                b->shid[t] = DSV4_SHARED_EXPERT;
            if ((st = stg->experts(impl, n, io->x + c0 * H, b->shid, NULL, 0, I, R->shf, err)))
                break;
            round_bf16(R->shf, R->shb, (uint64_t)(n * H));
        }
    }
    if (!st && topo->ep > 1 && nu) { /* every expert's group from all ranks' slots, as ep forms it */
        qsort(S->u, (size_t)nu, sizeof *S->u, cmp_uslot);
        for (int64_t q = 0; q < nu; q++) {
            const chunk_bufs *b = &S->b[S->u[q].r].c;
            const slot *sl = &b->sl[S->u[q].s];
            memcpy(S->ux + q * H, ranks[S->u[q].r].x + (c0 + sl->t) * H, (size_t)H * sizeof *S->ux);
            S->ue[q] = sl->e;
            S->uw[q] = sl->w;
        }
        st = stg->experts(impl, nu, S->ux, S->ue, S->uw, 0, I, S->uo, err);
        for (int64_t q = 0; q < nu && !st; q++)
            round_bf16(S->uo + q * H, S->b[S->u[q].r].ob + S->u[q].s * H, (uint64_t)H);
    }
    for (int r = 0; r < world && !st; r++) {
        int64_t n = ranks[r].tokens - c0 < ct ? ranks[r].tokens - c0 : ct;
        const single_rank *R = &S->b[r];
        if (n > 0)
            st = stg->combine(impl, n, S->ns[r], R->c.tok, R->c.sw, R->ob, R->c.shid ? R->shb : NULL,
                              ranks[r].y + c0 * H, err);
    }
    return st;
}

dsv4_status dsv4_dist_single_rank(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                                  const dsv4_budget *budget, const dsv4_dist_options *opt, dsv4_dist_rank *ranks,
                                  dsv4_error *err)
{
    if (!cfg || !ckpt || !topo || !budget || !ranks)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist single rank", "arguments must not be NULL");
    int world = topo->world_size;
    if (world < 1 || world > DSV4_COMM_MAX_RANKS)
        return dsv4_seterr(err, DSV4_ERR_REFUSED, "plan", "world_size %d is outside [1, %d]", world,
                           DSV4_COMM_MAX_RANKS);
    int kind = opt && opt->compute_backend >= 0 ? opt->compute_backend : (int)topo->backend;
    int64_t maxT = 0;
    for (int r = 0; r < world; r++) {
        if (ranks[r].tokens < 0 || (ranks[r].tokens > 0 && (!ranks[r].x || !ranks[r].y)))
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dist single rank", "rank %d: tokens without x or y", r);
        maxT = ranks[r].tokens > maxT ? ranks[r].tokens : maxT;
    }
    dsv4_status st;
    dsv4_plan *sharded = NULL, *one = NULL;
    dsv4_backend *be = NULL;
    single_bufs S;
    memset(&S, 0, sizeof S);
    dsv4_topology t = *topo;
    t.rank = 0;
    if ((st = dsv4_plan_create(cfg, &t, budget, &sharded, err)))
        return st;
    int64_t ct = dsv4_plan_chunk_tokens(sharded);
    t.world_size = t.tp = t.dp = t.ep = 1;
    t.backend = (dsv4_backend_kind)kind;
    t.cuda_graph = false;
    t.n_buckets = 0;
    t.dispatch = DSV4_DISPATCH_AUTO;
    t.executor = DSV4_EXECUTOR_AUTO;
    t.role = DSV4_ROLE_MIXED;
    t.max_tokens_per_rank = ct > 0 ? ct : 1;
    t.chunk_tokens = 0;
    const bool standin = kind != (int)topo->backend;
    dsv4_config scfg = standin_config(cfg, standin);
    /* the ranks' own backend parameters (not a stand-in's): a parameter that changes a kernel's
       arithmetic (the cuda backend's direct=) must change the counterpart's too */
    dsv4_backend_options bopt;
    dsv4_backend_options_init(&bopt);
    bopt.threads = 1;
    bopt.params = opt && !standin ? opt->backend_params : NULL;
    if ((st = dsv4_plan_create(&scfg, &t, budget, &one, err)) ||
        (st = dsv4_backend_create_with(one, ckpt, &bopt, &be, err)))
        goto done;
    const dsv4_backend_stages *stg = dsv4_backend_get_stages(be);
    if (!stg) {
        st = dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "dist single rank", "backend %s has no stages",
                         dsv4_backend_name(be));
        goto done;
    }
    int64_t H = cfg->dim, K = cfg->n_activated, nk = ct * K;
    uint64_t all = (uint64_t)(world * nk);
    bool oom = false;
    for (int r = 0; r < world; r++) {
        single_rank *R = &S.b[r];
        chunk_bufs *b = &R->c;
        b->ids = xmalloc((uint64_t)nk, sizeof *b->ids, &oom);
        b->w = xmalloc((uint64_t)nk, sizeof *b->w, &oom);
        b->sl = xmalloc((uint64_t)nk, sizeof *b->sl, &oom);
        b->tok = xmalloc((uint64_t)nk, sizeof *b->tok, &oom);
        b->sw = xmalloc((uint64_t)nk, sizeof *b->sw, &oom);
        R->gx = xmalloc((uint64_t)(nk * H), sizeof *R->gx, &oom);
        b->ge = xmalloc((uint64_t)nk, sizeof *b->ge, &oom);
        R->go = xmalloc((uint64_t)(nk * H), sizeof *R->go, &oom);
        R->ob = xmalloc((uint64_t)(nk * H), sizeof *R->ob, &oom);
        if (cfg->n_shared_experts > 0) {
            b->shid = xmalloc((uint64_t)ct, sizeof *b->shid, &oom);
            R->shf = xmalloc((uint64_t)(ct * H), sizeof *R->shf, &oom);
            R->shb = xmalloc((uint64_t)(ct * H), sizeof *R->shb, &oom);
        }
    }
    S.u = xmalloc(all, sizeof *S.u, &oom);
    S.ux = xmalloc(all * (uint64_t)H, sizeof *S.ux, &oom);
    S.ue = xmalloc(all, sizeof *S.ue, &oom);
    S.uw = xmalloc(all, sizeof *S.uw, &oom);
    S.uo = xmalloc(all * (uint64_t)H, sizeof *S.uo, &oom);
    if (oom) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist single rank", "out of memory for %d ranks' chunks", world);
        goto done;
    }
    for (int64_t c0 = 0; c0 < maxT && !st; c0 += ct)
        st = single_chunk(cfg, topo, stg, be->impl, ranks, c0, ct, &S, err);
done:
    single_free(&S, world);
    dsv4_backend_free(be);
    dsv4_plan_free(one);
    dsv4_plan_free(sharded);
    return st;
}
