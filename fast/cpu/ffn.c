/*
 * The CPU backend's GEMM regimes and the FFN of one expert group (fast/cpu/cpu.c says which
 * regime runs when): C[n, na + nb] = X[n, k] . [A; B]^T, either "fused" (dot products against
 * weight rows decoded on the fly by the kernel table's decode-dot entries, threads over weight
 * rows) or "tiles" (rows dequantized to fp32 in tiles, then cblas_sgemm per tile, threads over
 * tiles); the activation layouts the kernels take; the SwiGLU epilogue; the combine into y;
 * the expert-parallel batch worker.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#ifdef I
#undef I /* complex.h through OpenBLAS's cblas.h */
#endif

#include "fast/cpu/cpu_impl.h"
#include "core/err.h"
#include "core/testctl.h"
#include "fast/cpu/kernels/kutil.h"
#include "core/parallel.h"
#include "core/swiglu.h"

/* ---------------- GEMM: C[n, na + nb] = X[n, k] . [A; B]^T ---------------- */

size_t dsv4_cpu_wscratch_floats(const dsv4_config *c)
{
    int64_t kmax = c->dim > c->moe_inter_dim ? c->dim : c->moe_inter_dim;
    return (size_t)((TILE_ROWS + SMALL_ROWS + 1) * kmax);
}

wscratch dsv4_cpu_worker_scratch(cpu_be *b, float *base, int w)
{
    const dsv4_config *c = &b->cfg;
    int64_t kmax = c->dim > c->moe_inter_dim ? c->dim : c->moe_inter_dim;
    float *p = base + (size_t)w * dsv4_cpu_wscratch_floats(c);
    wscratch ws = {p, p + TILE_ROWS * kmax, p + (TILE_ROWS + SMALL_ROWS) * kmax};
    return ws;
}

/* The bf16 kernel's X layout: within each 64-block, even elements then odd ones, as bf16.
   Returns false (and the kernel is not used) when some element is not exactly a bf16. */
static bool bf16_rows(const float *X, int64_t ldx, int64_t n, int64_t k, bool k4, uint16_t *XB)
{
    uint32_t low = 0;
    if (k4) { /* tilebf4's layout */
        for (int64_t q = 0; q < n; q++) {
            const float *x = X + q * ldx;
            uint16_t *o = XB + q * k;
            for (int64_t c = 0; c < k; c += 128)
                for (int h = 0; h < 2; h++)
                    for (int par = 0; par < 2; par++)
                        for (int p = 0; p < 32; p++) {
                            uint32_t e = dsv4_f32_bits(x[c + 32 * (p / 8) + 2 * (8 * h + p % 8) + par]);
                            low |= e & 0xFFFFu;
                            o[c + 64 * h + 32 * par + p] = (uint16_t)(e >> 16);
                        }
        }
        return low == 0;
    }
    for (int64_t q = 0; q < n; q++) {
        const float *x = X + q * ldx;
        uint16_t *o = XB + q * k;
        for (int64_t c = 0; c < k; c += 64)
            for (int i = 0; i < 32; i++) {
                uint32_t e = dsv4_f32_bits(x[c + 2 * i]), d = dsv4_f32_bits(x[c + 2 * i + 1]);
                low |= (e | d) & 0xFFFFu;
                o[c + i] = (uint16_t)(e >> 16);
                o[c + 32 + i] = (uint16_t)(d >> 16);
            }
    }
    return low == 0;
}

static bool use_fp4_512(const cpu_be *b, const dsv4_matrix_view *m)
{
    return b->kt->dot_fp4_packed && m->format == DSV4_FORMAT_FP4 && m->k % 32 == 0;
}

/* m runs on a blocked fp32 decode-dot entry of the table (kernels.h, dot_blocked). */
static bool use_blocked(const cpu_be *b, const dsv4_matrix_view *m)
{
    return b->kt->dot_blocked && m->k % 32 == 0 &&
           ((m->format == DSV4_FORMAT_FP4 && b->kt->dot_fp4_packed) || (m->format == DSV4_FORMAT_FP8 && b->kt->dot_fp8));
}

/* Groups larger than FUSED_ROWS still take the fused kernel, in blocks of SMALL_ROWS rows, when
   it is the bf16 one or a blocked one: they beat dequantize + sgemm at every size measured
   (docs/cpu.md). */
static bool fused_blocks(const cpu_be *b, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb)
{
    if (use_blocked(b, ma) && (!mb || use_blocked(b, mb)))
        return true;
    return b->kt->dot_fp4_bf16 && use_fp4_512(b, ma) && ma->k % 64 == 0 && (!mb || use_fp4_512(b, mb));
}

/* The largest group the fused path takes in one go (the row scratch holds SMALL_ROWS rows). */
static int64_t fused_limit(const cpu_be *b, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb)
{
    return fused_blocks(b, ma, mb) ? SMALL_ROWS : FUSED_ROWS;
}

/* X as the fp4 AVX-512 kernels take it: bf16 permuted (XB) when the CPU has AVX512-BF16 and
   X is exactly bf16, else fp32 split (XS); both NULL when no fp4 AVX-512 kernel runs. */
typedef struct {
    const float *XS;
    const uint16_t *XB;
    const uint16_t *XN; /* fp8 on the bf16 kernel: X as bf16 in natural order */
} xprep;

static bool use_fp8_bf16(const cpu_be *b, const dsv4_matrix_view *m)
{
    return b->kt->dot_fp8_bf16 && m->format == DSV4_FORMAT_FP8 && m->k % 128 == 0;
}

/* X as bf16 in natural order; false when some element is not exactly a bf16. */
static bool bf16_natural(const float *X, int64_t ldx, int64_t n, int64_t k, uint16_t *XN)
{
    uint32_t low = 0;
    for (int64_t q = 0; q < n; q++)
        for (int64_t i = 0; i < k; i++) {
            uint32_t e = dsv4_f32_bits(X[q * ldx + i]);
            low |= e & 0xFFFFu;
            XN[q * k + i] = (uint16_t)(e >> 16);
        }
    return low == 0;
}

static xprep prep_x(const cpu_be *b, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb, const float *X,
                    int64_t ldx, int64_t n, float *scratch)
{
    xprep p = {NULL, NULL, NULL};
    int64_t k = ma->k;
    if (use_fp8_bf16(b, ma) && (!mb || use_fp8_bf16(b, mb))) {
        if (bf16_natural(X, ldx, n, k, (uint16_t *)(void *)scratch))
            p.XN = (const uint16_t *)(const void *)scratch;
        return p;
    }
    if (!use_fp4_512(b, ma) && !(mb && use_fp4_512(b, mb)))
        return p;
    bool k4 = b->kt->dot_fp4_bf16_k128 && k % 128 == 0;
    if (b->kt->dot_fp4_bf16 && k % 64 == 0 && bf16_rows(X, ldx, n, k, k4, (uint16_t *)(void *)scratch)) {
        p.XB = (const uint16_t *)(const void *)scratch;
        return p;
    }
    b->kt->pack_fp4(X, ldx, n, k, scratch);
    p.XS = scratch;
    return p;
}

/* Fused decode-dot of weight rows [r0, r0 + nr) of m; xp from prep_x. */
static void fused_rows(const cpu_be *b, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                       const float *X, int64_t ldx, xprep xp, float *C, int64_t ldc, float *row)
{
    if (use_fp4_512(b, m) && xp.XB)
        if (b->kt->dot_fp4_bf16_k128 && m->k % 128 == 0)
            b->kt->dot_fp4_bf16_k128(m, r0, nr, n, xp.XB, m->k, C, ldc);
        else
            b->kt->dot_fp4_bf16(m, r0, nr, n, xp.XB, m->k, C, ldc);
    else if (use_fp4_512(b, m))
        b->kt->dot_fp4_packed(m, r0, nr, n, xp.XS, m->k, C, ldc, NULL);
    else if (xp.XN && use_fp8_bf16(b, m))
        b->kt->dot_fp8_bf16(m, r0, nr, n, xp.XN, m->k, C, ldc);
    else if (b->kt->dot_fp8 && m->format == DSV4_FORMAT_FP8 && m->k % 32 == 0)
        b->kt->dot_fp8(m, r0, nr, n, X, ldx, C, ldc, NULL);
    else
        b->kt->dot(m, r0, nr, n, X, ldx, C, ldc, row);
}

/* One tile: dequantize rows [r0, r0 + rows) and sgemm into C columns [col, col + rows). */
static void tile_gemm(const cpu_be *b, const dsv4_matrix_view *m, int64_t r0, int64_t rows, int64_t col, int64_t n,
                      const float *X, int64_t ldx, float *C, int64_t ldc, float *scr)
{
    b->kt->dequant(m, r0, rows, scr);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)rows, (int)m->k, 1.0f, X, (int)ldx, scr,
                (int)m->k, 0.0f, C + col, (int)ldc);
}

/* Single-threaded matmul inside one worker (the expert-parallel batches). */
static void mm_serial(const cpu_be *b, const wscratch *ws, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb,
                      int64_t n, const float *X, int64_t ldx, float *C, int64_t ldc)
{
    int64_t na = ma->n;
    if (n > SMALL_ROWS && fused_blocks(b, ma, mb)) {
        for (int64_t q = 0; q < n; q += SMALL_ROWS)
            mm_serial(b, ws, ma, mb, n - q < SMALL_ROWS ? n - q : SMALL_ROWS, X + q * ldx, ldx, C + q * ldc, ldc);
        return;
    }
    if (n <= fused_limit(b, ma, mb)) {
        xprep xp = prep_x(b, ma, mb, X, ldx, n, ws->xs);
        fused_rows(b, ma, 0, na, n, X, ldx, xp, C, ldc, ws->row);
        if (mb)
            fused_rows(b, mb, 0, mb->n, n, X, ldx, xp, C + na, ldc, ws->row);
        return;
    }
    for (int64_t r0 = 0; r0 < na; r0 += TILE_ROWS)
        tile_gemm(b, ma, r0, na - r0 < TILE_ROWS ? na - r0 : TILE_ROWS, r0, n, X, ldx, C, ldc, ws->tile);
    if (mb)
        for (int64_t r0 = 0; r0 < mb->n; r0 += TILE_ROWS)
            tile_gemm(b, mb, r0, mb->n - r0 < TILE_ROWS ? mb->n - r0 : TILE_ROWS, na + r0, n, X, ldx, C, ldc,
                      ws->tile);
}

typedef struct {
    cpu_be *b;
    const dsv4_matrix_view *ma, *mb; /* mb may be NULL */
    int64_t n, k;
    const float *X;
    xprep xp;
    int64_t ldx;
    float *C;
    int64_t ldc;
    int64_t tile, tiles_a, tiles; /* tiles path */
    int workers;
    float *wbase;                 /* worker scratch */
} mm_job;

static void mm_fused(void *p, int64_t lo, int64_t hi)
{
    mm_job *j = p;
    int64_t na = j->ma->n;
    float *row = NULL; /* the scalar path's decoded row */
    const dsv4_cpu_kernels_table *kt = j->b->kt;
    bool simd = dsv4_cpu_kernels_vector(kt, j->ma) && (!j->mb || dsv4_cpu_kernels_vector(kt, j->mb));
    if (!simd && !(row = dsv4_alloc(j->b->ws, (size_t)j->k * sizeof *row))) {
        atomic_store(&j->b->nomem, 1);
        return;
    }
    if (lo < na) {
        int64_t e = hi < na ? hi : na;
        fused_rows(j->b, j->ma, lo, e - lo, j->n, j->X, j->ldx, j->xp, j->C + lo, j->ldc, row);
    }
    if (hi > na) {
        int64_t s = lo > na ? lo : na;
        fused_rows(j->b, j->mb, s - na, hi - s, j->n, j->X, j->ldx, j->xp, j->C + s, j->ldc, row);
    }
    dsv4_release(j->b->ws, row);
}

static void mm_tiles(void *p, int64_t w, int64_t wend)
{
    mm_job *j = p;
    (void)wend;
    wscratch ws = dsv4_cpu_worker_scratch(j->b, j->wbase, (int)w);
    int64_t na = j->ma->n;
    for (int64_t t = w; t < j->tiles; t += j->workers) {
        const dsv4_matrix_view *m = t < j->tiles_a ? j->ma : j->mb;
        int64_t r0 = (t < j->tiles_a ? t : t - j->tiles_a) * j->tile;
        int64_t rows = m->n - r0 < j->tile ? m->n - r0 : j->tile;
        int64_t col = (t < j->tiles_a ? 0 : na) + r0;
        tile_gemm(j->b, m, r0, rows, col, j->n, j->X, j->ldx, j->C, j->ldc, ws.tile);
    }
}

/* Threads inside one matmul: over weight rows (fused) or over tiles (sgemm). */
static dsv4_status matmul_par(cpu_be *b, float *wbase, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb,
                              int64_t n, const float *X, int64_t ldx, float *C, int64_t ldc, dsv4_error *err)
{
    int64_t k = ma->k, tot = ma->n + (mb ? mb->n : 0);
    if (n > SMALL_ROWS && fused_blocks(b, ma, mb)) {
        dsv4_status st = DSV4_OK;
        for (int64_t q = 0; q < n && !st; q += SMALL_ROWS)
            st = matmul_par(b, wbase, ma, mb, n - q < SMALL_ROWS ? n - q : SMALL_ROWS, X + q * ldx, ldx, C + q * ldc,
                            ldc, err);
        return st;
    }
    mm_job j = {.b = b, .ma = ma, .mb = mb, .n = n, .k = k, .X = X, .ldx = ldx, .C = C, .ldc = ldc, .wbase = wbase};
    if (n <= fused_limit(b, ma, mb)) {
        j.xp = prep_x(b, ma, mb, X, ldx, n, dsv4_cpu_worker_scratch(b, wbase, 0).xs);
        int th = (double)tot * (double)k * (double)n < 4e5 ? 1 : b->threads;
        atomic_store(&b->nomem, 0);
        dsv4_parallel_for(th, tot, 16, mm_fused, &j);
        if (atomic_load(&b->nomem))
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu backend", "out of memory for the decode scratch");
        return DSV4_OK;
    }
    int64_t rows_max = mb && mb->n > ma->n ? mb->n : ma->n;
    int64_t tile = cdiv(cdiv(rows_max, b->threads), 16) * 16;
    if (tile > TILE_ROWS)
        tile = TILE_ROWS;
    j.tile = tile;
    j.tiles_a = cdiv(ma->n, tile);
    j.tiles = j.tiles_a + (mb ? cdiv(mb->n, tile) : 0);
    j.workers = b->threads < j.tiles ? b->threads : (int)j.tiles;
    if ((double)n * (double)tot * (double)k < 2e6)
        j.workers = 1;
    dsv4_parallel_for(j.workers, j.workers, 1, mm_tiles, &j);
    return DSV4_OK;
}

/* ---------------- the FFN of one group ---------------- */

typedef struct {
    const dsv4_config *c;
    const float *GU; /* [n, 2I] */
    float *HB;       /* [n, I] */
    const float *tw; /* [n] or NULL */
    bool clamp, quant, before;
    int64_t I;
    _Atomic uint64_t *gc, *uc;
    dsv4_cpu_swiglu_fn row; /* the kernel table's SwiGLU row, or NULL: the scalar loop below */
} epi_job;

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

static void epilogue(void *p, int64_t lo, int64_t hi)
{
    epi_job *j = p;
    int64_t I = j->I;
    float L = j->c->swiglu_limit;
    bool clamp = j->clamp && L > 0.0f;
    uint64_t gc = 0, uc = 0;
    for (int64_t q = lo; q < hi; q++) {
        const float *gr = j->GU + q * 2 * I, *ur = gr + I;
        float *h = j->HB + q * I;
        bool mulw = j->tw && j->before;
        float w = mulw ? j->tw[q] : 1.0f;
        if (j->row)
            j->row(gr, ur, h, I, clamp, L, mulw, w, &gc, &uc);
        for (int64_t i = j->row ? I : 0; i < I; i++) {
            float g = rbf16(gr[i]), u = rbf16(ur[i]);
            if (clamp)
                dsv4_swiglu_clamp(&g, &u, L, &gc, &uc);
            float v = silu(g) * u;
            if (mulw)
                v = v * w;
            h[i] = rbf16(v);
        }
        if (j->quant)
            dsv4_act_quant_row(h, I, j->c->act_quant, h, NULL, NULL);
    }
    atomic_fetch_add(j->gc, gc);
    atomic_fetch_add(j->uc, uc);
}

/* X [n, H] activations as the GEMMs see them; O [n, H] receives the fp32 down projection.
   Threads inside (par) or on the calling worker only (ws != NULL). */
dsv4_status dsv4_cpu_ffn(cpu_be *b, float *wbase, const wscratch *ws, const cmat *m, bool clamp, int64_t n,
                         const float *X, const float *tw, float *GU, float *HB, float *O, _Atomic uint64_t *gcl,
                         _Atomic uint64_t *ucl, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = b->inter; /* this rank's share of moe_inter_dim */
    dsv4_status st = DSV4_OK;
    if (DSV4_TESTHOOK(DROP_ROUTED_CLAMP) && m != b->shared && m[0].v.format == DSV4_FORMAT_FP8)
        clamp = false; /* test hook: the fp8 per-block routed family without the SwiGLU clamp */
    if (ws)
        mm_serial(b, ws, &m[0].v, &m[1].v, n, X, H, GU, 2 * I);
    else if ((st = matmul_par(b, wbase, &m[0].v, &m[1].v, n, X, H, GU, 2 * I, err)))
        return st;
    bool quant = m[2].v.format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    epi_job ej = {c, GU, HB, tw, clamp, quant, c->weight_point == DSV4_WEIGHT_BEFORE_W2, I, gcl, ucl, b->kt->swiglu_row};
    if (ws)
        epilogue(&ej, 0, n);
    else
        dsv4_parallel_for((double)n * (double)I < 65536 ? 1 : b->threads, n, 1, epilogue, &ej);
    if (ws) {
        mm_serial(b, ws, &m[2].v, NULL, n, HB, I, O, H);
        return DSV4_OK;
    }
    return matmul_par(b, wbase, &m[2].v, NULL, n, HB, I, O, H, err);
}


void dsv4_cpu_combine(void *p, int64_t lo, int64_t hi)
{
    comb_job *j = p;
    for (int64_t q = 0; q < j->n; q++) {
        float *y = j->y + (j->tok ? j->tok[q] : q) * j->H;
        const float *o = j->O + q * j->H;
        if (j->tw) {
            float w = j->tw[q];
            for (int64_t i = lo; i < hi; i++)
                y[i] += w * rbf16(o[i]);
        } else
            for (int64_t i = lo; i < hi; i++)
                y[i] += rbf16(o[i]);
    }
}

/* ---------------- expert-parallel batches of routed groups ---------------- */


void dsv4_cpu_batch_worker(void *p, int64_t w, int64_t wend)
{
    batch_job *j = p;
    (void)wend;
    cpu_be *b = j->b;
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = b->inter; /* this rank's share of moe_inter_dim */
    wscratch ws = dsv4_cpu_worker_scratch(b, j->wbase, (int)w);
    for (;;) {
        int64_t e = j->e0 + atomic_fetch_add(&j->next, 1);
        if (e >= j->e1)
            break;
        int64_t n = j->off[e + 1] - j->off[e], r = j->off[e] - j->base;
        if (n == 0)
            continue;
        float *XG = j->XG + r * H;
        for (int64_t q = 0; q < n; q++)
            memcpy(XG + q * H, j->xq + (int64_t)j->stok[j->off[e] + q] * H, (size_t)H * sizeof *XG);
        dsv4_cpu_ffn(b, NULL, &ws, &b->experts[3 * e], true, n, XG, j->sw + j->off[e], j->GU + r * 2 * I, j->HB + r * I,
            j->O + r * H, &j->gc, &j->uc, NULL);
    }
}
int64_t dsv4_cpu_run_batch(cpu_be *b, float *wbase, int64_t e, int64_t e_end, const int64_t *off, int64_t cap,
                           const int32_t *stok, const float *sw, const float *xq, float *XG, float *GU, float *HB,
                           float *O, int64_t *rows, uint64_t *groups, uint64_t *skips, uint64_t *gc, uint64_t *uc)
{
    int64_t e1 = e, nrows = 0, ngroups = 0;
    while (e1 < e_end) {
        int64_t n1 = off[e1 + 1] - off[e1];
        if (n1 > LARGE_ROWS || nrows + n1 > cap)
            break;
        nrows += n1;
        ngroups += n1 > 0;
        *skips += n1 == 0;
        e1++;
    }
    batch_job bj = {.b = b, .wbase = wbase, .e0 = e, .e1 = e1, .off = off, .base = off[e], .stok = stok, .sw = sw,
                    .xq = xq, .XG = XG, .GU = GU, .HB = HB, .O = O};
    atomic_init(&bj.next, 0);
    atomic_init(&bj.gc, 0);
    atomic_init(&bj.uc, 0);
    int workers = ngroups < b->threads ? (int)ngroups : b->threads;
    if ((double)nrows * (double)b->cfg.dim * (double)b->inter < 2e5)
        workers = 1;
    dsv4_parallel_for(workers, workers, 1, dsv4_cpu_batch_worker, &bj);
    *gc += atomic_load(&bj.gc);
    *uc += atomic_load(&bj.uc);
    *rows += nrows;
    *groups += (uint64_t)ngroups;
    return e1;
}

/* The fused regime on one matrix (cpu_impl.h). */
int dsv4_cpu_fused_dot(const dsv4_cpu_kernels_table *kt, const dsv4_matrix_view *m, int64_t n, const float *X,
                       float *C)
{
    cpu_be b;
    memset(&b, 0, sizeof b);
    b.kt = kt;
    float *scr = malloc((size_t)(SMALL_ROWS * m->k) * sizeof *scr), *row = malloc((size_t)m->k * sizeof *row);
    if (!scr || !row || n > SMALL_ROWS) {
        free(scr);
        free(row);
        return 1;
    }
    xprep xp = prep_x(&b, m, NULL, X, m->k, n, scr);
    fused_rows(&b, m, 0, m->n, n, X, m->k, xp, C, m->n, row);
    free(scr);
    free(row);
    return 0;
}
