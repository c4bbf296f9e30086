/*
 * sim: N ranks as threads of one process, moving real data.
 *
 * One rendezvous per group instance (group, colour). A collective:
 *   (a) the rank posts its record, buffer pointers and (all_to_allv) a copy of
 *       its count arrays into its slot; the last to arrive validates every
 *       fingerprint once, under the lock, and records the outcome;
 *   (b) on a mismatch every rank of the group returns DSV4_ERR_COMM with the
 *       same message and the world is poisoned;
 *   (c) otherwise each rank copies what it needs from its peers' posted
 *       buffers, outside the lock (all_reduce sums into a temporary);
 *   (d) a second rendezvous: nobody leaves, and so nobody reuses or frees its
 *       buffers, before every rank has copied; all_reduce then writes its
 *       temporary into buf.
 * Waiting in (a) is bounded by the timeout (deadlock report) and ends early
 * when the world is poisoned; waiting in (d) is not bounded because every
 * rank of the group has passed (a) and only copies memory before arriving.
 *
 * One mutex and one condition variable per world: poisoning broadcasts once
 * and every waiter, in any group, rechecks its condition.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4moe/comm.h"
#include "dsv4moe/formats.h"
#include "fast/comm/comm_impl.h"
#include "core/err.h"

#define MSG_MAX DSV4_ERROR_MESSAGE_MAX

typedef struct sim_slot {
    bool posted; /* arrived in the current generation */
    dsv4_coll_record rec;
    const void *send;
    void *recv;
    uint64_t *send_counts; /* points into the rendezvous' count storage: n entries */
    uint64_t *recv_counts;
} sim_slot;

typedef struct sim_rv {
    dsv4_group group;
    int color;
    int n;
    int members[DSV4_COMM_MAX_RANKS]; /* world ranks, ascending */
    sim_slot *slots;                  /* n */
    uint64_t *counts;                 /* 2 * n * n */
    int arrived;
    unsigned long gen;  /* phase (a) generation */
    int departed;
    unsigned long gen2; /* phase (d) generation */
    bool failed;        /* the error arose in this rendezvous; msg holds it */
    char msg[MSG_MAX];
} sim_rv;

typedef struct sim_comm {
    dsv4_comm base; /* first: a dsv4_comm * is a sim_comm * */
    dsv4_sim_world *world;
    int rv[DSV4_GROUP_COUNT];
} sim_comm;

struct dsv4_sim_world {
    int n;
    int timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sim_rv *rvs;
    int nrv;
    sim_comm comms[DSV4_COMM_MAX_RANKS];
    /* Per rank, under mu: the last collective it entered and whether it is inside one now. */
    dsv4_coll_record last[DSV4_COMM_MAX_RANKS];
    bool has_last[DSV4_COMM_MAX_RANKS];
    bool busy[DSV4_COMM_MAX_RANKS];
    bool poisoned;
    char poison_msg[MSG_MAX];
};

/* ---------------- small text helpers ---------------- */

typedef struct appender {
    char *buf;
    size_t cap, len;
} appender;

static void app(appender *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void app(appender *a, const char *fmt, ...)
{
    if (a->len + 1 >= a->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(a->buf + a->len, a->cap - a->len, fmt, ap);
    va_end(ap);
    if (w < 0)
        return;
    a->len += (size_t)w;
    if (a->len >= a->cap)
        a->len = a->cap - 1;
}

/* "rank 5" or "rank 5 (ep rank 1)". */
static void rank_name(const sim_rv *rv, int i, char *buf, size_t n)
{
    if (rv->group == DSV4_GROUP_WORLD)
        snprintf(buf, n, "rank %d", rv->members[i]);
    else
        snprintf(buf, n, "rank %d (%s rank %d)", rv->members[i], dsv4_group_name(rv->group), i);
}

/* "world" or "tp [ranks 2, 3]". */
static void group_label(const sim_rv *rv, char *buf, size_t n)
{
    appender a = {buf, n, 0};
    buf[0] = '\0';
    app(&a, "%s", dsv4_group_name(rv->group));
    if (rv->group != DSV4_GROUP_WORLD) {
        app(&a, " [ranks ");
        for (int i = 0; i < rv->n; i++)
            app(&a, "%s%d", i ? ", " : "", rv->members[i]);
        app(&a, "]");
    }
}

static dsv4_status comm_err(dsv4_error *err, const sim_rv *rv, const char *msg)
{
    dsv4_seterr(err, DSV4_ERR_COMM, NULL, "%s", msg);
    if (err)
        snprintf(err->where, sizeof err->where, "comm group %s", dsv4_group_name(rv->group));
    return DSV4_ERR_COMM;
}

/* ---------------- poisoning ---------------- */

/* Under mu. The first message wins; every waiter wakes. */
static void poison_locked(dsv4_sim_world *w, const char *msg)
{
    if (!w->poisoned) {
        w->poisoned = true;
        snprintf(w->poison_msg, sizeof w->poison_msg, "%s", msg);
    }
    pthread_cond_broadcast(&w->cv);
}

static dsv4_status poisoned_err(dsv4_sim_world *w, const sim_rv *rv, dsv4_error *err)
{
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg, "world poisoned by an earlier error: %.*s", (int)(sizeof msg - 40), w->poison_msg);
    return comm_err(err, rv, msg);
}

static void sim_abort(dsv4_comm *comm, const char *reason)
{
    dsv4_sim_world *w = ((sim_comm *)comm)->world;
    pthread_mutex_lock(&w->mu);
    poison_locked(w, reason);
    pthread_mutex_unlock(&w->mu);
}

/* ---------------- validation and the deadlock report ---------------- */

static bool same_fingerprint(const dsv4_coll_record *a, const dsv4_coll_record *b)
{
    if (a->op != b->op || a->seq != b->seq || a->dtype != b->dtype)
        return false;
    if ((a->op == DSV4_COLL_ALL_REDUCE || a->op == DSV4_COLL_ALL_GATHER) && a->count != b->count)
        return false;
    return true;
}

/* Under mu, by the last rank to arrive. Sets rv->failed and poisons on a mismatch. */
static void validate_locked(dsv4_sim_world *w, sim_rv *rv)
{
    char na[64], nb[64], da[160], db[160];
    for (int i = 1; i < rv->n; i++) {
        const dsv4_coll_record *a = &rv->slots[0].rec, *b = &rv->slots[i].rec;
        if (same_fingerprint(a, b))
            continue;
        rank_name(rv, 0, na, sizeof na);
        rank_name(rv, i, nb, sizeof nb);
        dsv4_comm_describe(a, da, sizeof da);
        dsv4_comm_describe(b, db, sizeof db);
        snprintf(rv->msg, sizeof rv->msg, "collective mismatch in group %s: %s issued %s but %s issued %s",
                 dsv4_group_name(rv->group), na, da, nb, db);
        rv->failed = true;
        poison_locked(w, rv->msg);
        return;
    }
    if (rv->slots[0].rec.op != DSV4_COLL_ALL_TO_ALLV)
        return;
    for (int i = 0; i < rv->n; i++)
        for (int j = 0; j < rv->n; j++) {
            uint64_t s = rv->slots[i].send_counts[j], r = rv->slots[j].recv_counts[i];
            if (s == r)
                continue;
            rank_name(rv, i, na, sizeof na);
            rank_name(rv, j, nb, sizeof nb);
            snprintf(rv->msg, sizeof rv->msg,
                     "collective mismatch in group %s: all_to_allv #%llu (%s, '%s'): %s sends %llu to %s, %s expects "
                     "%llu from %s",
                     dsv4_group_name(rv->group), (unsigned long long)rv->slots[i].rec.seq,
                     dsv4_dtype_name(rv->slots[i].rec.dtype), rv->slots[i].rec.tag, na, (unsigned long long)s, nb,
                     nb, (unsigned long long)r, na);
            rv->failed = true;
            poison_locked(w, rv->msg);
            return;
        }
}

/* Under mu, by a rank whose wait in phase (a) timed out. */
static void deadlock_locked(dsv4_sim_world *w, sim_rv *rv)
{
    appender a = {rv->msg, sizeof rv->msg, 0};
    char g[96];
    group_label(rv, g, sizeof g);
    app(&a, "deadlock: after %d ms in group %s, ", w->timeout_ms, g);
    /* The arrived ranks, grouped by what they wait in. */
    bool done[DSV4_COMM_MAX_RANKS] = {false};
    char di[160], dj[160];
    bool first = true;
    for (int i = 0; i < rv->n; i++) {
        if (!rv->slots[i].posted || done[i])
            continue;
        dsv4_comm_describe(&rv->slots[i].rec, di, sizeof di);
        int cnt = 0;
        for (int j = i; j < rv->n; j++) {
            if (!rv->slots[j].posted || done[j])
                continue;
            dsv4_comm_describe(&rv->slots[j].rec, dj, sizeof dj);
            if (strcmp(di, dj) == 0)
                cnt++;
        }
        app(&a, "%s%s ", first ? "" : "; ", cnt > 1 ? "ranks" : "rank");
        first = false;
        int k = 0;
        for (int j = i; j < rv->n; j++) {
            if (!rv->slots[j].posted || done[j])
                continue;
            dsv4_comm_describe(&rv->slots[j].rec, dj, sizeof dj);
            if (strcmp(di, dj) != 0)
                continue;
            done[j] = true;
            app(&a, "%s%d", k++ ? ", " : "", rv->members[j]);
        }
        app(&a, " %s in %s", cnt > 1 ? "wait" : "waits", di);
    }
    /* The ranks that never came, and where they are. */
    int missing = 0;
    for (int i = 0; i < rv->n; i++)
        missing += !rv->slots[i].posted;
    app(&a, "; %s ", missing > 1 ? "ranks" : "rank");
    int k = 0;
    for (int i = 0; i < rv->n; i++)
        if (!rv->slots[i].posted)
            app(&a, "%s%d", k++ ? ", " : "", rv->members[i]);
    app(&a, " never arrived (%s last collective: ", missing > 1 ? "their" : "its");
    k = 0;
    for (int i = 0; i < rv->n; i++) {
        if (rv->slots[i].posted)
            continue;
        int r = rv->members[i];
        app(&a, "%srank %d ", k++ ? ", " : "", r);
        if (!w->has_last[r]) {
            app(&a, "none");
            continue;
        }
        const dsv4_coll_record *l = &w->last[r];
        app(&a, "%s%s #%llu '%s'", w->busy[r] ? "waits in " : "", dsv4_coll_op_name(l->op),
            (unsigned long long)l->seq, l->tag);
        if (l->group != rv->group)
            app(&a, " in group %s", dsv4_group_name(l->group));
    }
    app(&a, ")");
    rv->failed = true;
    poison_locked(w, rv->msg);
}

/* ---------------- the collective ---------------- */

typedef struct sim_call {
    const dsv4_coll_record *rec;
    const void *send;
    void *recv;
    const uint64_t *send_counts, *recv_counts;
} sim_call;

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Phase (a). Returns DSV4_OK when every rank arrived and the fingerprints agree. Under mu. */
static dsv4_status arrive_locked(dsv4_sim_world *w, sim_rv *rv, int me, const sim_call *call, dsv4_error *err)
{
    sim_slot *s = &rv->slots[me];
    s->rec = *call->rec;
    s->send = call->send;
    s->recv = call->recv;
    if (call->rec->op == DSV4_COLL_ALL_TO_ALLV) {
        memcpy(s->send_counts, call->send_counts, (size_t)rv->n * sizeof *s->send_counts);
        memcpy(s->recv_counts, call->recv_counts, (size_t)rv->n * sizeof *s->recv_counts);
    }
    s->posted = true;
    unsigned long g = rv->gen;
    if (++rv->arrived == rv->n) {
        validate_locked(w, rv);
        for (int i = 0; i < rv->n; i++)
            rv->slots[i].posted = false;
        rv->arrived = 0;
        rv->gen++;
        pthread_cond_broadcast(&w->cv);
    } else {
        struct timespec dl;
        deadline_after(&dl, w->timeout_ms);
        while (rv->gen == g && !rv->failed && !w->poisoned) {
            int rc = pthread_cond_timedwait(&w->cv, &w->mu, &dl);
            if (rc == ETIMEDOUT && rv->gen == g && !rv->failed && !w->poisoned)
                deadlock_locked(w, rv);
        }
    }
    if (rv->failed)
        return comm_err(err, rv, rv->msg);
    if (rv->gen == g)
        return poisoned_err(w, rv, err);
    return DSV4_OK;
}

/* Phase (d). Under mu. */
static void depart_locked(dsv4_sim_world *w, sim_rv *rv)
{
    unsigned long g2 = rv->gen2;
    if (++rv->departed == rv->n) {
        rv->departed = 0;
        rv->gen2++;
        pthread_cond_broadcast(&w->cv);
    } else {
        while (rv->gen2 == g2)
            pthread_cond_wait(&w->cv, &w->mu);
    }
}

/* reduce_into for a type T whose + is the reduction: rank 0's buffer copied into tmp, the others
   added in rank order. */
#define SUM_AS(T)                                                                                                    \
    do {                                                                                                             \
        T *t = tmp;                                                                                                  \
        memcpy(t, rv->slots[0].recv, n * sizeof *t);                                                                 \
        for (int j = 1; j < rv->n; j++) {                                                                            \
            const T *x = rv->slots[j].recv;                                                                          \
            for (size_t e = 0; e < n; e++)                                                                           \
                t[e] += x[e];                                                                                        \
        }                                                                                                            \
    } while (0)

/* Sums every rank's buf in ascending group-rank order into tmp (float for BF16). Outside mu. */
static void reduce_into(const sim_rv *rv, dsv4_dtype dt, uint64_t count, void *tmp)
{
    size_t n = (size_t)count;
    switch (dt) {
    case DSV4_DTYPE_F32:
        SUM_AS(float);
        break;
    case DSV4_DTYPE_F64:
        SUM_AS(double);
        break;
    case DSV4_DTYPE_I32: /* wrapping two's-complement sum */
        SUM_AS(uint32_t);
        break;
    case DSV4_DTYPE_I64:
        SUM_AS(uint64_t);
        break;
    case DSV4_DTYPE_BF16: {
        float *t = tmp;
        const uint16_t *x0 = rv->slots[0].recv;
        for (size_t e = 0; e < n; e++)
            t[e] = dsv4_bf16_to_f32(x0[e]);
        for (int j = 1; j < rv->n; j++) {
            const uint16_t *x = rv->slots[j].recv;
            for (size_t e = 0; e < n; e++)
                t[e] += dsv4_bf16_to_f32(x[e]);
        }
        break;
    }
    default:
        break;
    }
#undef SUM_AS
}

static void copy_out(const sim_rv *rv, int me, const dsv4_coll_record *rec, void *recv)
{
    size_t dsz = dsv4_dtype_size(rec->dtype);
    if (rec->op == DSV4_COLL_ALL_GATHER) {
        size_t blk = (size_t)rec->count * dsz;
        if (blk == 0)
            return;
        for (int j = 0; j < rv->n; j++) {
            unsigned char *dst = (unsigned char *)recv + (size_t)j * blk;
            if (dst != rv->slots[j].send) /* send may alias recv + me * count */
                memcpy(dst, rv->slots[j].send, blk);
        }
    } else if (rec->op == DSV4_COLL_ALL_TO_ALLV) {
        size_t roff = 0;
        for (int j = 0; j < rv->n; j++) {
            const sim_slot *src = &rv->slots[j];
            uint64_t soff = 0;
            for (int k = 0; k < me; k++)
                soff += src->send_counts[k];
            size_t nb = (size_t)src->send_counts[me] * dsz;
            if (nb)
                memcpy((unsigned char *)recv + roff, (const unsigned char *)src->send + (size_t)soff * dsz, nb);
            roff += nb;
        }
    }
}

static dsv4_status sim_collective(dsv4_comm *comm, const sim_call *call, dsv4_error *err)
{
    sim_comm *c = (sim_comm *)comm;
    dsv4_sim_world *w = c->world;
    const dsv4_coll_record *rec = call->rec;
    sim_rv *rv = &w->rvs[c->rv[rec->group]];
    int me = comm->group_rank[rec->group];
    int r = comm->rank;

    void *tmp = NULL;
    if (rec->op == DSV4_COLL_ALL_REDUCE && rec->count > 0) {
        size_t esz = rec->dtype == DSV4_DTYPE_BF16 ? sizeof(float) : dsv4_dtype_size(rec->dtype);
        tmp = malloc((size_t)rec->count * esz);
        if (!tmp) {
            char why[MSG_MAX];
            char d[160];
            dsv4_comm_describe(rec, d, sizeof d);
            snprintf(why, sizeof why, "rank %d: out of memory for the temporary of %s", r, d);
            pthread_mutex_lock(&w->mu);
            w->last[r] = *rec;
            w->has_last[r] = true;
            poison_locked(w, why);
            pthread_mutex_unlock(&w->mu);
            dsv4_seterr(err, DSV4_ERR_NOMEM, NULL, "%s", why);
            return DSV4_ERR_NOMEM;
        }
    }

    pthread_mutex_lock(&w->mu);
    w->last[r] = *rec;
    w->has_last[r] = true;
    if (w->poisoned) {
        dsv4_status st = poisoned_err(w, rv, err);
        pthread_mutex_unlock(&w->mu);
        free(tmp);
        return st;
    }
    w->busy[r] = true;
    dsv4_status st = arrive_locked(w, rv, me, call, err);
    if (st != DSV4_OK) {
        w->busy[r] = false;
        pthread_mutex_unlock(&w->mu);
        free(tmp);
        return st;
    }
    pthread_mutex_unlock(&w->mu);

    /* (c) every peer's buffers stay posted until (d) completes. */
    if (rec->op == DSV4_COLL_ALL_REDUCE) {
        if (tmp)
            reduce_into(rv, rec->dtype, rec->count, tmp);
    } else {
        copy_out(rv, me, rec, call->recv);
    }

    pthread_mutex_lock(&w->mu);
    depart_locked(w, rv);
    w->busy[r] = false;
    pthread_mutex_unlock(&w->mu);

    if (tmp) {
        if (rec->dtype == DSV4_DTYPE_BF16) {
            const float *t = tmp;
            uint16_t *b = call->recv;
            for (size_t e = 0; e < (size_t)rec->count; e++)
                b[e] = dsv4_f32_to_bf16(t[e]);
        } else {
            memcpy(call->recv, tmp, (size_t)rec->count * dsv4_dtype_size(rec->dtype));
        }
        free(tmp);
    }
    return DSV4_OK;
}

static dsv4_status sim_all_reduce(dsv4_comm *comm, const dsv4_coll_record *rec, void *buf, dsv4_error *err)
{
    sim_call call = {rec, buf, buf, NULL, NULL};
    return sim_collective(comm, &call, err);
}

static dsv4_status sim_all_gather(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send, void *recv,
                                  dsv4_error *err)
{
    sim_call call = {rec, send, recv, NULL, NULL};
    return sim_collective(comm, &call, err);
}

static dsv4_status sim_all_to_allv(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send,
                                   const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                                   dsv4_error *err)
{
    sim_call call = {rec, send, recv, send_counts, recv_counts};
    return sim_collective(comm, &call, err);
}

static dsv4_status sim_barrier(dsv4_comm *comm, const dsv4_coll_record *rec, dsv4_error *err)
{
    sim_call call = {rec, NULL, NULL, NULL, NULL};
    return sim_collective(comm, &call, err);
}

static const dsv4_comm_vtable sim_vtable = {
    "sim", sim_all_reduce, sim_all_gather, sim_all_to_allv, sim_barrier, sim_abort,
};

/* ---------------- the world ---------------- */

void dsv4_sim_options_init(dsv4_sim_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = (uint32_t)sizeof *opt;
    opt->timeout_ms = 5000;
}

static void world_destroy(dsv4_sim_world *w, bool sync_ready)
{
    for (int r = 0; r < w->n; r++)
        dsv4_comm_base_fini(&w->comms[r].base);
    if (w->rvs) {
        for (int i = 0; i < w->nrv; i++) {
            free(w->rvs[i].slots);
            free(w->rvs[i].counts);
        }
        free(w->rvs);
    }
    if (sync_ready) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
    free(w);
}

dsv4_status dsv4_sim_world_create(const dsv4_comm_groups *groups, const dsv4_sim_options *opt,
                                  dsv4_sim_world **out, dsv4_error *err)
{
    static const char fn[] = "dsv4_sim_world_create";
    if (out)
        *out = NULL;
    if (!groups || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "%s is NULL", !groups ? "groups" : "out");
    int n = groups->world;
    if (n < 1 || n > DSV4_COMM_MAX_RANKS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "comm groups field 'world'", "world %d is outside [1, %d]", n,
                           DSV4_COMM_MAX_RANKS);
    int timeout_ms = 5000;
    if (opt) {
        if (opt->struct_size < offsetof(dsv4_sim_options, timeout_ms) + sizeof opt->timeout_ms)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "sim options field 'struct_size'",
                               "struct_size %u is too small (call dsv4_sim_options_init)", (unsigned)opt->struct_size);
        timeout_ms = opt->timeout_ms;
        if (timeout_ms < 1)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "sim options field 'timeout_ms'",
                               "timeout_ms %d must be >= 1", timeout_ms);
    }

    dsv4_sim_world *w = calloc(1, sizeof *w);
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory for a world of %d ranks", n);
    w->n = n;
    w->timeout_ms = timeout_ms;
    for (int r = 0; r < n; r++) {
        dsv4_comm_base_init(&w->comms[r].base, &sim_vtable, r);
        w->comms[r].world = w;
    }
    pthread_condattr_t ca;
    bool sync_ok = false;
    if (pthread_condattr_init(&ca) == 0) {
        if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&w->cv, &ca) == 0) {
            if (pthread_mutex_init(&w->mu, NULL) == 0)
                sync_ok = true;
            else
                pthread_cond_destroy(&w->cv);
        }
        pthread_condattr_destroy(&ca);
    }
    if (!sync_ok) {
        world_destroy(w, false);
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, fn, "cannot create the mutex and condition variable");
    }

    w->rvs = calloc((size_t)DSV4_GROUP_COUNT * (size_t)n, sizeof *w->rvs);
    if (!w->rvs) {
        world_destroy(w, true);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory for the rendezvous");
    }
    for (int g = 0; g < DSV4_GROUP_COUNT; g++)
        for (int r = 0; r < n; r++) {
            int color = g == DSV4_GROUP_WORLD ? 0 : groups->color[g][r];
            int k = 0;
            while (k < w->nrv && !(w->rvs[k].group == (dsv4_group)g && w->rvs[k].color == color))
                k++;
            if (k == w->nrv) {
                w->rvs[k].group = (dsv4_group)g;
                w->rvs[k].color = color;
                w->nrv++;
            }
            sim_rv *rv = &w->rvs[k];
            w->comms[r].rv[g] = k;
            w->comms[r].base.group_rank[g] = rv->n;
            rv->members[rv->n++] = r;
        }
    for (int k = 0; k < w->nrv; k++) {
        sim_rv *rv = &w->rvs[k];
        size_t m = (size_t)rv->n;
        rv->slots = calloc(m, sizeof *rv->slots);
        rv->counts = calloc(2 * m * m, sizeof *rv->counts);
        if (!rv->slots || !rv->counts) {
            world_destroy(w, true);
            return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory for the rendezvous");
        }
        for (size_t i = 0; i < m; i++) {
            rv->slots[i].send_counts = rv->counts + 2 * m * i;
            rv->slots[i].recv_counts = rv->counts + 2 * m * i + m;
        }
    }
    for (int r = 0; r < n; r++)
        for (int g = 0; g < DSV4_GROUP_COUNT; g++)
            w->comms[r].base.group_size[g] = w->rvs[w->comms[r].rv[g]].n;
    *out = w;
    return DSV4_OK;
}

void dsv4_sim_world_free(dsv4_sim_world *world)
{
    if (world)
        world_destroy(world, true);
}

dsv4_comm *dsv4_sim_world_comm(dsv4_sim_world *world, int rank)
{
    if (!world || rank < 0 || rank >= world->n)
        return NULL;
    return &world->comms[rank].base;
}
