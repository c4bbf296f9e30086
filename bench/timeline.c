/*
 * bench/timeline.c: bench_cuda --timeline's summary of a step's kernels and, in the CUDA build
 * with CUPTI, their collection (timeline.h says what each does).
 */
#include "bench/timeline.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* A <length><identifier> item of a mangled name at s: its identifier's start and length, or 0. */
static int mangled_item(const char *s, const char **id, int *len)
{
    if (!isdigit((unsigned char)*s))
        return 0;
    int l = 0, d = 0;
    while (isdigit((unsigned char)s[d]) && d < 6)
        l = l * 10 + (s[d++] - '0');
    if (l <= 0 || (int)strnlen(s + d, (size_t)l) < l)
        return 0;
    *id = s + d;
    *len = l;
    return d + l;
}

void tl_short_name(const char *m, char *out, size_t n)
{
    if (!out || !n)
        return;
    out[0] = 0;
    if (!m)
        return;
    /* the items of the (nested) name in order: _Z [N] <len>id <len>id ... then I (template
       arguments of the last), E or the parameters */
    const char *id[8];
    int len[8], ni = 0;
    const char *p = m + 2;
    if (strncmp(m, "_Z", 2) == 0) {
        if (*p == 'N')
            p++;
        for (int used; ni < 8 && (used = mangled_item(p, &id[ni], &len[ni])) > 0; ni++)
            p += used;
    }
    if (ni == 0) {
        snprintf(out, n, "%s", m);
        return;
    }
    int ki = -1; /* the first item naming a kernel of this project */
    for (int i = 0; i < ni && ki < 0; i++)
        if (len[i] > 2 && strncmp(id[i], "k_", 2) == 0)
            ki = i;
    if (ki < 0) {
        if (ni >= 2)
            snprintf(out, n, "%.*s::%.*s", len[0], id[0], len[1], id[1]);
        else
            snprintf(out, n, "%.*s", len[0], id[0]);
        return;
    }
    size_t o = (size_t)snprintf(out, n, "%.*s", len[ki], id[ki]);
    if (ki != ni - 1 || *p != 'I' || o >= n)
        return;
    /* integral template arguments: L<type><value>E, e.g. Li2E, Lb0E, Lin3E (negative) */
    const char *q = p + 1;
    int first = 1;
    while (*q == 'L' && o + 2 < n) {
        q++;
        while (*q && isalpha((unsigned char)*q) && *q != 'n')
            q++;
        const int neg = *q == 'n';
        q += neg;
        long v = 0;
        if (!isdigit((unsigned char)*q))
            break;
        while (isdigit((unsigned char)*q))
            v = v * 10 + (*q++ - '0');
        if (*q != 'E')
            break;
        q++;
        o += (size_t)snprintf(out + o, n - o, "%s%s%ld", first ? "<" : ",", neg ? "-" : "", v);
        first = 0;
    }
    if (!first && o + 1 < n) {
        if (*q != 'E') /* a type argument: not spelled out */
            o += (size_t)snprintf(out + o, n - o, ",..");
        if (o + 1 < n)
            snprintf(out + o, n - o, ">");
    }
}

static int by_corr_start(const void *x, const void *y)
{
    const tl_kernel *a = x, *b = y;
    if (a->corr != b->corr)
        return a->corr < b->corr ? -1 : 1;
    return a->start < b->start ? -1 : a->start > b->start;
}

static int by_start(const void *x, const void *y)
{
    const tl_kernel *a = x, *b = y;
    return a->start < b->start ? -1 : a->start > b->start;
}

static int cmp_d(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The occurrence of step kernel i's name among the step's kernels before it. */
static int occurrence(const tl_kernel *k, int i)
{
    int c = 0;
    for (int j = 0; j < i; j++)
        c += strcmp(k[j].name, k[i].name) == 0;
    return c;
}

int tl_summarize(const tl_kernel *recs, int n, int steps, tl_summary *s, char *err, size_t errn)
{
    memset(s, 0, sizeof *s);
    if (n <= 0 || steps <= 0) {
        set_err(err, errn, "no kernels recorded (%d records, %d steps)", n, steps);
        return -1;
    }
    tl_kernel *k = malloc((size_t)n * sizeof *k);
    double *v = malloc((size_t)steps * 6 * sizeof *v);
    int *pos = malloc((size_t)n * sizeof *pos), *occ0 = malloc((size_t)n * sizeof *occ0);
    if (!k || !v || !pos || !occ0) {
        free(k), free(v), free(pos), free(occ0);
        set_err(err, errn, "out of memory");
        return -1;
    }
    memcpy(k, recs, (size_t)n * sizeof *k);
    qsort(k, (size_t)n, sizeof *k, by_corr_start);
    int ncorr = 1;
    for (int i = 1; i < n; i++)
        ncorr += k[i].corr != k[i - 1].corr;
    int rc = -1;
    if (ncorr != steps) { /* eager launches: equal runs by start time */
        qsort(k, (size_t)n, sizeof *k, by_start);
        if (n % steps) {
            set_err(err, errn, "%d kernels in %d launches do not split into %d steps", n, ncorr, steps);
            goto done;
        }
    }
    const int per = n / steps;
    if (per > TL_MAX_ROWS) {
        set_err(err, errn, "%d kernels a step, more than %d", per, TL_MAX_ROWS);
        goto done;
    }
    for (int st = 0; st < steps; st++) {
        tl_kernel *q = k + (size_t)st * per;
        if (st > 0 && q[0].corr == q[-1].corr && ncorr == steps) {
            set_err(err, errn, "the launches hold different numbers of kernels");
            goto done;
        }
        qsort(q, (size_t)per, sizeof *q, by_start); /* (already so; the eager runs too) */
        if (st == 0)
            for (int r = 0; r < per; r++)
                occ0[r] = occurrence(k, r);
        /* each kernel's row: step 0's kernel of the same name and occurrence (kernels on forked
           streams may start in either order) */
        for (int i = 0; i < per; i++) {
            const int occ = occurrence(q, i);
            pos[st * per + i] = -1;
            for (int r = 0; r < per; r++)
                if (occ0[r] == occ && strcmp(k[r].name, q[i].name) == 0) {
                    pos[st * per + i] = r;
                    break;
                }
            if (pos[st * per + i] < 0) {
                set_err(err, errn, "step %d runs %s (occurrence %d), which step 0 does not", st, q[i].name, occ + 1);
                goto done;
            }
        }
    }
    s->steps = steps;
    s->kernels = per;
    int next_stream = 0;
    for (int r = 0; r < per; r++) { /* the step's streams numbered by first use (step 0's order) */
        snprintf(s->rows[r].name, sizeof s->rows[r].name, "%s", k[r].name);
        int f = 0;
        while (k[f].stream != k[r].stream)
            f++;
        s->rows[r].stream = f < r ? s->rows[f].stream : next_stream++;
    }
    double *sp = v, *bu = v + steps, *su = v + 2 * steps, *a = v + 3 * steps, *b = v + 4 * steps, *c = v + 5 * steps;
    for (int st = 0; st < steps; st++) {
        const tl_kernel *q = k + (size_t)st * per;
        uint64_t t0 = q[0].start, last = q[0].start, cur_s = q[0].start, cur_e = q[0].start, busy = 0, sum = 0;
        for (int i = 0; i < per; i++) {
            sum += q[i].end - q[i].start;
            if (q[i].start > cur_e) { /* a new busy interval */
                busy += cur_e - cur_s;
                cur_s = q[i].start;
                cur_e = q[i].end;
            } else if (q[i].end > cur_e) {
                cur_e = q[i].end;
            }
            last = q[i].end > last ? q[i].end : last;
        }
        busy += cur_e - cur_s;
        sp[st] = (double)(last - t0) * 1e-3;
        bu[st] = (double)busy * 1e-3;
        su[st] = (double)sum * 1e-3;
    }
    s->span_us = median_of(sp, steps);
    s->busy_us = median_of(bu, steps);
    s->sum_us = median_of(su, steps);
    for (int r = 0; r < per; r++) {
        for (int st = 0; st < steps; st++) {
            const tl_kernel *q = k + (size_t)st * per;
            int i = 0;
            while (pos[st * per + i] != r)
                i++;
            uint64_t maxend = q[0].start;
            for (int j = 0; j < i; j++)
                maxend = q[j].end > maxend ? q[j].end : maxend;
            a[st] = (double)(q[i].start - q[0].start) * 1e-3;
            b[st] = (double)(q[i].end - q[i].start) * 1e-3;
            c[st] = q[i].start > maxend ? (double)(q[i].start - maxend) * 1e-3 : 0.0;
        }
        s->rows[r].start_us = median_of(a, steps);
        s->rows[r].dur_us = median_of(b, steps);
        s->rows[r].gap_us = median_of(c, steps);
    }
    rc = 0;
done:
    free(k), free(v), free(pos), free(occ0);
    return rc;
}

#ifdef DSV4_BENCH_CUPTI
#include <cupti.h>

/* The records, appended by CUPTI's buffer-completed callback (called from tl_end's flush, or from
   CUPTI's own thread while recording: the lock). */
#include <pthread.h>
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static tl_kernel *g_recs;
static int g_n, g_cap, g_lost;

#define TL_BUF (4u << 20)

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, TL_BUF);
    *size = *buf ? TL_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&g_lock);
    while (buf && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *a = (const CUpti_ActivityKernel10 *)r;
        if (g_n == g_cap) {
            const int cap = g_cap ? 2 * g_cap : 4096;
            tl_kernel *p = realloc(g_recs, (size_t)cap * sizeof *p);
            if (!p) {
                g_lost++;
                continue;
            }
            g_recs = p, g_cap = cap;
        }
        tl_kernel *k = &g_recs[g_n++];
        tl_short_name(a->name, k->name, sizeof k->name);
        k->start = a->start, k->end = a->end, k->stream = a->streamId, k->corr = a->correlationId;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        g_lost += (int)dropped;
    pthread_mutex_unlock(&g_lock);
    free(buf);
}

static int cupti_err(CUptiResult r, const char *what, char *err, size_t errn)
{
    const char *m = NULL;
    cuptiGetResultString(r, &m);
    set_err(err, errn, "%s: %s", what, m ? m : "CUPTI error");
    return -1;
}

int tl_begin(char *err, size_t errn)
{
    static int registered; /* the callbacks once per process */
    CUptiResult r;
    pthread_mutex_lock(&g_lock);
    g_n = 0, g_lost = 0;
    pthread_mutex_unlock(&g_lock);
    if (!registered) {
        if ((r = cuptiActivityRegisterCallbacks(buf_requested, buf_completed)) != CUPTI_SUCCESS)
            return cupti_err(r, "cuptiActivityRegisterCallbacks", err, errn);
        registered = 1;
    }
    if ((r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) != CUPTI_SUCCESS)
        return cupti_err(r, "cuptiActivityEnable", err, errn);
    return 0;
}

int tl_end(tl_kernel **recs, int *n, char *err, size_t errn)
{
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    *recs = NULL, *n = 0;
    if (r != CUPTI_SUCCESS)
        return cupti_err(r, "cuptiActivityFlushAll", err, errn);
    pthread_mutex_lock(&g_lock);
    const int lost = g_lost;
    *recs = g_recs, *n = g_n;
    g_recs = NULL, g_n = 0, g_cap = 0;
    pthread_mutex_unlock(&g_lock);
    if (lost) {
        free(*recs);
        *recs = NULL, *n = 0;
        set_err(err, errn, "CUPTI dropped %d kernel records", lost);
        return -1;
    }
    return 0;
}
#endif
