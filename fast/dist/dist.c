/* The distributed driver over simulated ranks (see include/dsv4moe/dist.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/alloc.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/weights.h"
#include "err.h"
#include "faults.h"
#include "ref_internal.h"

void dsv4_dist_options_init(dsv4_dist_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->timeout_ms = 5000;
    o->fault_skip_meta_rank = -1;
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
    const dsv4_ref *ref;
    const dsv4_plan *plan;
    dsv4_comm *comm;
    dsv4_dist_rank *io;
    int rank;
    const dsv4_dist_options *opt;
    dsv4_allocator *acct; /* this rank's workspace, measured against the plan */
} rank_ctx;

/* A token-slot of this rank's chunk: token (chunk-relative), slot, expert, weight. */
typedef struct {
    int64_t t;
    int32_t k, e;
    float w;
} slot;

static int cmp_slot_expert(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    if (x->e != y->e)
        return x->e < y->e ? -1 : 1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->k > y->k) - (x->k < y->k);
}

/* Accumulates the bf16 outputs of a chunk's kept slots (o[slot index]) into acc [n, H] (zeroed) in
   ascending expert id per token, adds the shared expert, rounds into y. sorted: by (expert, token, k). */
static void combine(const dsv4_config *c, int64_t n, const slot *sorted, int64_t ns, const float *o,
                    const float *shared, float *acc, uint16_t *y)
{
    int64_t H = c->dim;
    for (int64_t s = 0; s < ns; s++)
        dsv4_ref_accumulate(c, H, o + s * H, sorted[s].w, acc + sorted[s].t * H);
    for (int64_t i = 0; i < n * H; i++)
        y[i] = dsv4_f32_to_bf16(shared ? acc[i] + shared[i] : acc[i]);
}

#define TRY(expr)                                                                                           \
    do {                                                                                                    \
        if ((st = (expr)))                                                                                  \
            goto done;                                                                                      \
    } while (0)

static dsv4_status run_chunk(rank_ctx *rc, int64_t c0, int64_t n, dsv4_error *err)
{
    const dsv4_config *c = rc->cfg;
    const dsv4_topology *tp = dsv4_plan_topology(rc->plan);
    int64_t H = c->dim, K = c->n_activated, E = c->n_routed_experts, I = c->moe_inter_dim;
    dsv4_dist_rank *io = rc->io;
    dsv4_status st = DSV4_OK;
    uint64_t gdummy = 0, udummy = 0;
    int64_t nk = n * K;
    float *xf = dsv4_alloc(rc->acct, (size_t)(n * H + 1) * sizeof *xf);
    int32_t *ids = dsv4_alloc(rc->acct, (size_t)(nk + 1) * sizeof *ids);
    float *w = dsv4_alloc(rc->acct, (size_t)(nk + 1) * sizeof *w);
    slot *sl = dsv4_alloc(rc->acct, (size_t)(nk + 1) * sizeof *sl);
    float *acc = dsv4_alloc(rc->acct, (size_t)(n * H + 1) * sizeof *acc);
    float *shared = NULL, *o = NULL, *xs = NULL, *rx = NULL, *ro = NULL, *rw = NULL;
    uint16_t *sendx = NULL, *recvx = NULL, *sendo = NULL, *recvo = NULL;
    int32_t *sende = NULL, *recve = NULL;
    float *sendw = NULL, *recvw = NULL;
    slot *rs = NULL;
    if (!xf || !ids || !w || !sl || !acc) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for a chunk of %lld tokens", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n * H; i++)
        xf[i] = dsv4_bf16_to_f32(io->x[c0 * H + i]);
    TRY(dsv4_ref_route(rc->ref, 1, n, xf, io->input_ids ? io->input_ids + c0 : NULL, ids, w, NULL, NULL, err));
    if (io->topk_ids)
        memcpy(io->topk_ids + c0 * K, ids, (size_t)nk * sizeof *ids);
    if (io->topk_weights)
        memcpy(io->topk_weights + c0 * K, w, (size_t)nk * sizeof *w);
    /* Kept slots only: the sentinel E is no expert and is never sent or computed. */
    int64_t ns = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            if (ids[t * K + k] != (int32_t)E || DSV4_FAULT(DSV4_FAULT_F12)) /* fault F12: sentinel unsanitised */
                sl[ns++] = (slot){t, (int32_t)k, ids[t * K + k], w[t * K + k]};
    qsort(sl, (size_t)ns, sizeof *sl, cmp_slot_expert);
    o = dsv4_alloc(rc->acct, (size_t)(ns * H + 1) * sizeof *o);
    if (!o) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for %lld slots", (long long)ns);
        goto done;
    }
    if (c->n_shared_experts > 0) {
        shared = dsv4_alloc(rc->acct, (size_t)(n * H + 1) * sizeof *shared);
        if (!shared) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory");
            goto done;
        }
    }

    if (tp->ep > 1) {
        int P = dsv4_comm_group_size(rc->comm, DSV4_GROUP_EP);
        int64_t per = E / P, first = dsv4_plan_expert_first(rc->plan), cnt = dsv4_plan_expert_count(rc->plan);
        uint64_t sc[DSV4_COMM_MAX_RANKS] = {0}, rcn[DSV4_COMM_MAX_RANKS], ones[DSV4_COMM_MAX_RANKS];
        uint64_t scH[DSV4_COMM_MAX_RANKS], rcH[DSV4_COMM_MAX_RANKS];
        /* sl is sorted by expert, so it is already grouped by destination in rank order. */
        for (int64_t s = 0; s < ns; s++)
            sc[sl[s].e / per < P ? sl[s].e / per : P - 1]++; /* (F12's sentinel goes to the last rank) */
        for (int j = 0; j < P; j++)
            ones[j] = 1;
        int64_t scount[DSV4_COMM_MAX_RANKS], rcount[DSV4_COMM_MAX_RANKS];
        for (int j = 0; j < P; j++)
            scount[j] = (int64_t)sc[j];
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_I64, scount, ones, rcount, ones,
                                  "dispatch counts", err));
        uint64_t nr = 0;
        for (int j = 0; j < P; j++) {
            rcn[j] = (uint64_t)rcount[j];
            nr += rcn[j];
            scH[j] = sc[j] * (uint64_t)H;
            rcH[j] = rcn[j] * (uint64_t)H;
        }
        sendx = dsv4_alloc(rc->acct, (size_t)(ns * H + 1) * sizeof *sendx);
        sende = dsv4_alloc(rc->acct, (size_t)(ns + 1) * sizeof *sende);
        sendw = dsv4_alloc(rc->acct, (size_t)(ns + 1) * sizeof *sendw);
        recvx = dsv4_alloc(rc->acct, (size_t)(nr * (uint64_t)H + 1) * sizeof *recvx);
        recve = dsv4_alloc(rc->acct, (size_t)(nr + 1) * sizeof *recve);
        recvw = dsv4_alloc(rc->acct, (size_t)(nr + 1) * sizeof *recvw);
        rx = dsv4_alloc(rc->acct, (size_t)(nr * (uint64_t)H + 1) * sizeof *rx);
        ro = dsv4_alloc(rc->acct, (size_t)(nr * (uint64_t)H + 1) * sizeof *ro);
        rw = dsv4_alloc(rc->acct, (size_t)(nr + 1) * sizeof *rw);
        rs = dsv4_alloc(rc->acct, (size_t)(nr + 1) * sizeof *rs);
        sendo = dsv4_alloc(rc->acct, (size_t)(nr * (uint64_t)H + 1) * sizeof *sendo);
        recvo = dsv4_alloc(rc->acct, (size_t)(ns * H + 1) * sizeof *recvo);
        if (!sendx || !sende || !sendw || !recvx || !recve || !recvw || !rx || !ro || !rw || !rs || !sendo ||
            !recvo) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory for %llu received slots",
                             (unsigned long long)nr);
            goto done;
        }
        for (int64_t s = 0; s < ns; s++) {
            memcpy(sendx + s * H, io->x + (c0 + sl[s].t) * H, (size_t)H * sizeof *sendx);
            sende[s] = sl[s].e;
            sendw[s] = sl[s].w;
        }
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_BF16, sendx, scH, recvx, rcH,
                                  "dispatch rows", err));
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_I32, sende, sc, recve, rcn,
                                  "dispatch experts", err));
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_F32, sendw, sc, recvw, rcn,
                                  "dispatch weights", err));
        /* This rank's experts, ascending; the received order is kept for the way back. */
        for (uint64_t q = 0; q < nr; q++) {
            if (recve[q] < first || recve[q] >= first + cnt) {
                st = dsv4_seterr(err, DSV4_ERR_INTERNAL, "dist", "rank %d received expert %d outside its [%lld, %lld)",
                                 rc->rank, recve[q], (long long)first, (long long)(first + cnt));
                goto done;
            }
            rs[q] = (slot){(int64_t)q, 0, recve[q], recvw[q]};
        }
        qsort(rs, (size_t)nr, sizeof *rs, cmp_slot_expert);
        for (uint64_t a = 0; a < nr;) {
            uint64_t b = a;
            while (b < nr && rs[b].e == rs[a].e)
                b++;
            for (uint64_t q = a; q < b; q++) {
                for (int64_t h = 0; h < H; h++)
                    rx[(q - a) * (uint64_t)H + (uint64_t)h] = dsv4_bf16_to_f32(recvx[(uint64_t)rs[q].t * (uint64_t)H + (uint64_t)h]);
                rw[q - a] = rs[q].w;
            }
            TRY(dsv4_ref_ffn_partial(rc->ref, 1, rs[a].e, (int64_t)(b - a), rx, rw, 0, I, ro, &gdummy, &udummy, err));
            for (uint64_t q = a; q < b; q++)
                for (int64_t h = 0; h < H; h++)
                    sendo[(uint64_t)rs[q].t * (uint64_t)H + (uint64_t)h] = dsv4_f32_to_bf16(ro[(q - a) * (uint64_t)H + (uint64_t)h]);
            a = b;
        }
        TRY(dsv4_comm_all_to_allv(rc->comm, DSV4_GROUP_EP, DSV4_DTYPE_BF16, sendo, rcH, recvo, scH,
                                  "combine rows", err));
        for (int64_t i = 0; i < ns * H; i++)
            o[i] = dsv4_bf16_to_f32(recvo[i]);
        if (shared)
            TRY(dsv4_ref_ffn_partial(rc->ref, 1, DSV4_SHARED_EXPERT, n, xf, NULL, 0, I, shared, &gdummy, &udummy, err));
    } else {
        int64_t i0 = dsv4_plan_inter_first(rc->plan), ni = dsv4_plan_inter_count(rc->plan);
        xs = dsv4_alloc(rc->acct, (size_t)(ns * H + 1) * sizeof *xs);
        float *ws = dsv4_alloc(rc->acct, (size_t)(ns + 1) * sizeof *ws);
        if (!xs || !ws) {
            dsv4_release(rc->acct, ws);
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory");
            goto done;
        }
        for (int64_t a = 0; a < ns;) {
            int64_t b = a;
            while (b < ns && sl[b].e == sl[a].e)
                b++;
            for (int64_t q = a; q < b; q++) {
                memcpy(xs + (q - a) * H, xf + sl[q].t * H, (size_t)H * sizeof *xs);
                ws[q - a] = sl[q].w;
            }
            st = dsv4_ref_ffn_partial(rc->ref, 1, sl[a].e, b - a, xs, ws, i0, ni, o + a * H, &gdummy, &udummy, err);
            if (st) {
                dsv4_release(rc->acct, ws);
                goto done;
            }
            a = b;
        }
        dsv4_release(rc->acct, ws);
        if (shared)
            TRY(dsv4_ref_ffn_partial(rc->ref, 1, DSV4_SHARED_EXPERT, n, xf, NULL, i0, ni, shared, &gdummy, &udummy,
                                     err));
        if (tp->tp > 1) {
            /* One all_reduce of the partial down projections, slots then shared rows. */
            uint64_t len = (uint64_t)(ns * H) + (shared ? (uint64_t)(n * H) : 0);
            float *buf = dsv4_alloc(rc->acct, (size_t)(len + 1) * sizeof *buf);
            if (!buf) {
                st = dsv4_seterr(err, DSV4_ERR_NOMEM, "dist", "out of memory");
                goto done;
            }
            memcpy(buf, o, (size_t)(ns * H) * sizeof *buf);
            if (shared)
                memcpy(buf + ns * H, shared, (size_t)(n * H) * sizeof *buf);
            st = dsv4_comm_all_reduce(rc->comm, DSV4_GROUP_TP, DSV4_DTYPE_F32, buf, len, "tp reduce", err);
            if (!st) {
                memcpy(o, buf, (size_t)(ns * H) * sizeof *o);
                if (shared)
                    memcpy(shared, buf + ns * H, (size_t)(n * H) * sizeof *shared);
            }
            dsv4_release(rc->acct, buf);
            if (st)
                goto done;
        }
        dsv4_ref_round_rows(o, ns * H);
    }
    if (shared)
        dsv4_ref_round_rows(shared, n * H);
    combine(c, n, sl, ns, o, shared, acc, io->y + c0 * H);
done:
    dsv4_release(rc->acct, acc);
    dsv4_release(rc->acct, xf);
    dsv4_release(rc->acct, ids);
    dsv4_release(rc->acct, w);
    dsv4_release(rc->acct, sl);
    dsv4_release(rc->acct, shared);
    dsv4_release(rc->acct, o);
    dsv4_release(rc->acct, xs);
    dsv4_release(rc->acct, rx);
    dsv4_release(rc->acct, ro);
    dsv4_release(rc->acct, rw);
    dsv4_release(rc->acct, rs);
    dsv4_release(rc->acct, sendx);
    dsv4_release(rc->acct, recvx);
    dsv4_release(rc->acct, sendo);
    dsv4_release(rc->acct, recvo);
    dsv4_release(rc->acct, sende);
    dsv4_release(rc->acct, recve);
    dsv4_release(rc->acct, sendw);
    dsv4_release(rc->acct, recvw);
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
    if ((rc->opt->fault_skip_meta_rank == rc->rank || DSV4_FAULT(DSV4_FAULT_F03)) && replay_ok) { /* fault F03 */
        /* The review's defect: a graph-replaying rank skips the plan collective. */
    } else {
        int64_t meta[2] = {T, replay_ok ? 1 : 0}, all[2 * DSV4_COMM_MAX_RANKS];
        if ((st = dsv4_comm_all_gather(rc->comm, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, meta, 2, all, "step meta", err)))
            goto out;
        for (int r = 0; r < world; r++) {
            maxT = all[2 * r] > maxT ? all[2 * r] : maxT;
            all_replay = all_replay && all[2 * r + 1];
        }
    }
    io->step_max_tokens = maxT;
    io->replayed = all_replay && dsv4_plan_can_replay(rc->plan, maxT);
    int64_t nch = dsv4_plan_chunks(rc->plan, maxT), ct = dsv4_plan_chunk_tokens(rc->plan);
    nch += DSV4_FAULT(DSV4_FAULT_F10) && maxT == 0; /* fault F10: a zero-size chunk when every rank is empty */
    io->chunks = nch;
    io->workspace_planned = dsv4_plan_workspace_bytes(rc->plan, maxT, io->replayed);
    for (int64_t ch = 0; ch < nch; ch++) {
        int64_t b = ch * ct, e = b + ct < T ? b + ct : T;
        if ((st = run_chunk(rc, b < T ? b : T, e > b ? e - b : 0, err)))
            goto out;
    }
out:
    io->status = st;
    io->workspace_peak = dsv4_allocator_stats(rc->acct).peak;
    size_t n = 0;
    const dsv4_coll_record *tr = dsv4_comm_trace(rc->comm, &n);
    io->trace = n ? malloc(n * sizeof *io->trace) : NULL;
    if (io->trace) {
        memcpy(io->trace, tr, n * sizeof *io->trace);
        io->trace_len = n;
    }
    return NULL;
}

dsv4_status dsv4_dist_forward(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                              const dsv4_budget *budget, const dsv4_dist_options *opt, dsv4_dist_rank *ranks,
                              dsv4_error *err)
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
    dsv4_plan *plans[DSV4_COMM_MAX_RANKS] = {0};
    dsv4_allocator *acct[DSV4_COMM_MAX_RANKS] = {0};
    rank_ctx ctx[DSV4_COMM_MAX_RANKS];
    pthread_t th[DSV4_COMM_MAX_RANKS];
    bool started[DSV4_COMM_MAX_RANKS] = {0};
    dsv4_sim_world *sw = NULL;
    dsv4_ref *ref = NULL;
    dsv4_status st = DSV4_OK;
    for (int r = 0; r < world; r++) {
        dsv4_dist_rank *io = &ranks[r];
        io->trace = NULL;
        io->trace_len = 0;
        io->status = DSV4_OK;
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
    for (int r = 0; r < world; r++) {
        dsv4_topology t = *topo;
        t.rank = r;
        if ((st = dsv4_plan_create(cfg, &t, budget, &plans[r], err)) ||
            (st = dsv4_allocator_create(0, &acct[r], err)))
            goto done;
    }
    dsv4_comm_groups groups;
    dsv4_sim_options so;
    dsv4_sim_options_init(&so);
    so.timeout_ms = opt->timeout_ms;
    if ((st = dsv4_comm_groups_init(&groups, world, topo->tp, topo->dp, topo->ep, err)) ||
        (st = dsv4_sim_world_create(&groups, &so, &sw, err)) || (st = dsv4_ref_create(cfg, ckpt, 1, &ref, err)))
        goto done;
    /* A rank's bad input would otherwise surface as its peers' deadlock reports. */
    for (int r = 0; r < world; r++)
        if ((st = dsv4_ref_check_ids(ref, ranks[r].tokens, ranks[r].input_ids, err))) {
            char msg[DSV4_ERROR_MESSAGE_MAX];
            snprintf(msg, sizeof msg, "%s", err ? err->message : "");
            dsv4_seterr(err, st, "dist", "rank %d: %s", r, msg);
            goto done;
        }
    for (int r = 0; r < world; r++) {
        ctx[r] = (rank_ctx){cfg, ref, plans[r], dsv4_sim_world_comm(sw, r), &ranks[r], r, opt, acct[r]};
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
    dsv4_ref_free(ref);
    dsv4_sim_world_free(sw);
    for (int r = 0; r < world; r++) {
        dsv4_plan_free(plans[r]);
        dsv4_allocator_free(acct[r]);
    }
    return st;
}
