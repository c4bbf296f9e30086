/*
 * The CPU production backend (fast/cpu): one rank, router LOCAL, every expert
 * on this rank. SPEC.md sections 2-5 on OpenBLAS sgemm.
 *
 * Per chunk of at most dsv4_plan_chunk_tokens(plan) tokens:
 *   1. x bf16 -> fp32; router logits by sgemm x[Tc, H] . Wg^T; per token scores,
 *      top-K (ties to the lower id), weights, norm top-p (sentinel E) as SPEC.md 2-3;
 *   2. act_quant of x (routed and shared modes), once per token;
 *   3. token-slots permuted into per-expert groups by a stable counting sort:
 *      ascending expert id, tokens ascending inside a group;
 *   4. per expert with rows, in ascending id (empty experts launch nothing):
 *        gate/up GEMM, fused epilogue (bf16 g/u, SwiGLU clamp with counts, silu,
 *        router weight before_w2, bf16 h, act_quant h), down GEMM, combine into fp32 y
 *        (bf16(o), or w bf16(o) after_w2). Ascending experts per token by construction;
 *   5. the shared expert over the chunk (shared_clamp), y += bf16(o); out = bf16(y).
 *
 * GEMM regimes (per group, by its row count n; groups of at most LARGE_ROWS rows run in
 * expert-parallel batches, one expert per worker at a time, single-threaded GEMMs):
 *   - fp4 weights on a CPU with AVX512-BF16 and activations exactly bf16 (every act_quant
 *     output and bf16 input is): "fused" at every n, in blocks of SMALL_ROWS rows: the
 *     bf16 decode-dot kernel (vdpbf16ps) reads the stored fp4 bytes, NW weight rows x RB
 *     activation rows per pass; it beats dequantize + sgemm at every group size measured;
 *   - other formats / kernels, n <= FUSED_ROWS: "fused": dot products against weight rows
 *     decoded on the fly from fp4/fp8/bf16 (AVX-512, else AVX2+FMA+F16C, else scalar),
 *     threads over weight rows; the weights are read once from their stored bytes, so
 *     T = 1 is bandwidth-bound;
 *   - larger n: "tiles": weight rows dequantized to fp32 in tiles of at most TILE_ROWS
 *     rows into per-thread scratch, then cblas_sgemm on the tile (one OpenBLAS thread
 *     per worker; our workers over tiles). The scratch is bounded independent of T.
 * The SIMD decoders give the same fp32 values as dsv4_matrix_dequant_rows (the scalar
 * fallback uses it), checked by tests/test_cpu.c.
 *
 * Memory: every byte through two accounting allocators owned by the backend: `persist`
 * (router tensors, quantized-at-load weights of a bf16 stacked checkpoint) and `ws`
 * (the workspace: chunk buffers, group buffers, tile scratch), kept between forwards
 * and grown only as needed; its peak is workspace_peak.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#ifdef I
#undef I /* complex.h through OpenBLAS's cblas.h */
#endif

#include "dsv4moe/alloc.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/weights.h"
#include "../backend/backend_impl.h"
#include "err.h"
#include "faults.h"
#include "parallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

/* OpenBLAS's own thread count (declared here: not every cblas.h has it). */
void openblas_set_num_threads(int num_threads);

#define SMALL_ROWS 256   /* fp4 on the bf16 kernel: fused decode-dot in blocks of this many rows */
#define FUSED_ROWS 16    /* other formats and kernels: fused up to this many rows, tiles above */
#define TILE_ROWS 256    /* weight rows per dequantized tile (tiles path) */
#define LARGE_ROWS 256   /* groups above this run alone, threads inside their GEMMs */
#define BATCH_BYTES (64ll << 20) /* group buffers of one expert-parallel batch */
#define NBUF 20

enum { B_XF, B_XQ, B_XQS, B_Y, B_LOG, B_IDS, B_W, B_KEPT, B_NONF, B_CNT, B_OFF, B_STOK, B_SW, B_XG, B_GU, B_HB, B_O,
       B_TILE };

typedef struct {
    dsv4_matrix_view v;
    uint8_t *own_q, *own_s; /* quantized at load (bf16 stacked checkpoint under a quantized config) */
} cmat;

typedef struct cpu_be {
    dsv4_config cfg;
    int threads;
    int64_t chunk, max_tokens;
    bool simd, avx512, bf16dot;
    bool k4; /* fp4 bf16 kernel on tilebf4 (AVX512-VBMI) where k % 128 == 0 */
    dsv4_allocator *persist, *ws;
    dsv4_router_tensors rt;
    cmat *experts;    /* [E][3] */
    cmat shared[3];
    struct {
        void *p;
        size_t n;
    } buf[NBUF];
    dsv4_backend_stats stats;
    _Atomic int nomem;               /* a worker could not allocate */
} cpu_be;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void *ensure(cpu_be *b, int id, size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (b->buf[id].n >= bytes)
        return b->buf[id].p;
    dsv4_release(b->ws, b->buf[id].p);
    b->buf[id].p = dsv4_alloc(b->ws, bytes);
    b->buf[id].n = b->buf[id].p ? bytes : 0;
    return b->buf[id].p;
}

/* ---------------- scalar helpers (bit-identical to core/formats.c) ---------------- */

static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float ffrom(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float rbf16(float x)
{
    uint32_t u = fbits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return ffrom(((u >> 16) | 0x0040u) << 16);
    return ffrom(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}
static inline uint16_t tobf16(float x)
{
    uint32_t u = fbits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float ue8m0f(uint8_t b)
{
    if (b == 255)
        return NAN;
    return ffrom(b ? (uint32_t)b << 23 : 0x00400000u);
}
static inline float ldf32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* ---------------- SIMD weight decoders and kernels ---------------- */

enum { F_BF16 = 0, F_FP8 = 1, F_FP4 = 2 };

/* Row r of a view: data and the scale pointer the decoders take. */
static inline const uint8_t *row_data(const dsv4_matrix_view *m, int64_t r) { return m->data + (uint64_t)r * m->row_bytes; }
static inline const uint8_t *row_scales(const dsv4_matrix_view *m, int64_t r)
{
    if (m->format == DSV4_FORMAT_FP4)
        return m->scales + r * (m->k / 32);
    if (m->format == DSV4_FORMAT_FP8)
        return m->scales + (r / 128) * cdiv(m->k, 128) * (m->scale_format == DSV4_SCALE_FP32 ? 4 : 1);
    return NULL;
}
static inline bool simd_ok(const dsv4_matrix_view *m) { return m->k % 32 == 0; }

#if CPU_X86
#define TGT __attribute__((target("avx2,fma,f16c")))
#define AINL __attribute__((always_inline)) inline

/* Decodes elements [32c, 32c + 32) of a row into w[0..3] (fp32, scaled). */
TGT static AINL void dec32(int fmt, const uint8_t *row, const uint8_t *scl, int sfp32, int64_t c, __m256 w[4])
{
    if (fmt == F_FP4) {
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m128i m0f = _mm_set1_epi8(0x0F);
        __m128i bb = _mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c));
        __m128i lo = _mm_and_si128(bb, m0f), hi = _mm_and_si128(_mm_srli_epi16(bb, 4), m0f);
        __m128i vl = _mm_shuffle_epi8(lut, lo), vh = _mm_shuffle_epi8(lut, hi);
        __m128i e0 = _mm_unpacklo_epi8(vl, vh), e1 = _mm_unpackhi_epi8(vl, vh);
        __m256 sv = _mm256_set1_ps(ue8m0f(scl[c]) * 0.5f);
        w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), sv);
        w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), sv);
        w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), sv);
        w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), sv);
    } else if (fmt == F_FP8) {
        int64_t bk = c >> 2;
        float s = sfp32 ? ldf32(scl + 4 * bk) : ue8m0f(scl[bk]);
        __m256 sv = _mm256_set1_ps(s * 256.0f);
        const __m256i mmag = _mm256_set1_epi16(0x3F80), msgn = _mm256_set1_epi16((short)0x8000);
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(row + 32 * c + 16 * h)));
            __m256i hf = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(v, 7), mmag),
                                         _mm256_and_si256(_mm256_slli_epi16(v, 8), msgn));
            w[2 * h] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hf)), sv);
            w[2 * h + 1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hf, 1)), sv);
        }
    } else {
        for (int i = 0; i < 4; i++) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 64 * c + 16 * i)));
            w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        }
    }
}

TGT static AINL float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* RB rows of X against one weight row; NA accumulators per row (4 for RB <= 2, else 2). */
TGT static AINL void dot_block(int fmt, int RB, const uint8_t *row, const uint8_t *scl, int sfp32, int64_t nc,
                               const float *X, int64_t ldx, float *out, int64_t ldo)
{
    __m256 acc[4][4];
    for (int r = 0; r < RB; r++)
        for (int a = 0; a < 4; a++)
            acc[r][a] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nc; c++) {
        __m256 w[4];
        dec32(fmt, row, scl, sfp32, c, w);
        for (int r = 0; r < RB; r++) {
            const float *x = X + r * ldx + 32 * c;
            if (RB <= 2) {
                for (int a = 0; a < 4; a++)
                    acc[r][a] = _mm256_fmadd_ps(w[a], _mm256_loadu_ps(x + 8 * a), acc[r][a]);
            } else {
                acc[r][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc[r][1]);
                acc[r][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc[r][1]);
            }
        }
    }
    for (int r = 0; r < RB; r++) {
        __m256 s = RB <= 2 ? _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))
                           : _mm256_add_ps(acc[r][0], acc[r][1]);
        out[r * ldo] = hsum(s);
    }
}

TGT static AINL void dot_rows_fmt(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                  const float *X, int64_t ldx, float *C, int64_t ldc)
{
    int64_t nc = m->k / 32;
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    for (int64_t j = 0; j < nr; j++) {
        const uint8_t *row = row_data(m, r0 + j), *scl = row_scales(m, r0 + j);
        int64_t q = 0;
        for (; q + 4 <= n; q += 4)
            dot_block(fmt, 4, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
        for (; q + 2 <= n; q += 2)
            dot_block(fmt, 2, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
        if (q < n)
            dot_block(fmt, 1, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
    }
}

TGT static void dot_rows_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    if (m->format == DSV4_FORMAT_FP4)
        dot_rows_fmt(F_FP4, m, r0, nr, n, X, ldx, C, ldc);
    else if (m->format == DSV4_FORMAT_FP8)
        dot_rows_fmt(F_FP8, m, r0, nr, n, X, ldx, C, ldc);
    else
        dot_rows_fmt(F_BF16, m, r0, nr, n, X, ldx, C, ldc);
}

TGT static AINL void dequant_fmt(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    int64_t nc = m->k / 32, k = m->k;
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    for (int64_t j = 0; j < nr; j++) {
        const uint8_t *row = row_data(m, r0 + j), *scl = row_scales(m, r0 + j);
        float *o = out + j * k;
        for (int64_t c = 0; c < nc; c++) {
            __m256 w[4];
            dec32(fmt, row, scl, sfp32, c, w);
            for (int a = 0; a < 4; a++)
                _mm256_storeu_ps(o + 32 * c + 8 * a, w[a]);
        }
    }
}

TGT static void dequant_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    if (m->format == DSV4_FORMAT_FP4)
        dequant_fmt(F_FP4, m, r0, nr, out);
    else if (m->format == DSV4_FORMAT_FP8)
        dequant_fmt(F_FP8, m, r0, nr, out);
    else
        dequant_fmt(F_BF16, m, r0, nr, out);
}

/*
 * AVX-512 fp4 decode-dot: a 16-entry table permute turns nibble codes into fp32 directly
 * (vpermps uses the low 4 bits of each lane). The even elements of a 32-group come from the
 * low nibbles and the odd ones from the high nibbles, so X is given "split": within each
 * 32-block, elements 0, 2, .., 30 then 1, 3, .., 31 (split_rows below).
 */
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
static float ue8m0_table[256];
static const float e2m1_table[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/*
 * Register-blocked AVX-512 decode-dot: NW weight rows x RB activation rows per pass. Each
 * 32-element chunk of the NW weight rows is decoded once into registers and used by all RB
 * activation rows, and each activation chunk is loaded once for all NW weight rows (the
 * earlier one-weight-row kernel re-read the activations from L2 for every weight row).
 * fp4: the ue8m0 scale is folded into the 16-entry table (exact: a power of two), then two
 * permutes give the even and odd elements. fp8: e4m3 -> fp16 bits (value * 2^-8) -> vcvtph2ps.
 */
TGT512 static AINL void dec_fp4_512(const uint8_t *row, const uint8_t *scl, int64_t c, __m512 tab, __m512 w[2])
{
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)));
    __m512 ts = _mm512_mul_ps(tab, _mm512_set1_ps(ue8m0_table[scl[c]]));
    w[0] = _mm512_permutexvar_ps(v, ts);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ts);
}

TGT512 static AINL void dec_fp8_512(const uint8_t *row, const uint8_t *scl, int sfp32, int64_t c, __m512 w[2])
{
    const __m512i mmag = _mm512_set1_epi16(0x3F80), msgn = _mm512_set1_epi16((short)0x8000);
    int64_t bk = c >> 2;
    __m512 sv = _mm512_set1_ps((sfp32 ? ldf32(scl + 4 * bk) : ue8m0_table[scl[bk]]) * 256.0f);
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * c)));
    __m512i h = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi16(v, 7), mmag),
                                _mm512_and_si512(_mm512_slli_epi16(v, 8), msgn));
    w[0] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), sv);
    w[1] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), sv);
}

/* A tile's row and scale pointers for weight rows r .. r + NW - 1, and zeroed accumulators. */
TGT512 static AINL void tile_init(int NW, int RB, const dsv4_matrix_view *m, int64_t r, const uint8_t *row[8],
                                  const uint8_t *scl[8], __m512 acc[8][8])
{
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++) {
        row[w] = row_data(m, r + w);
        scl[w] = row_scales(m, r + w);
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            acc[w][q] = _mm512_setzero_ps();
    }
}

/* C[q * ldc + w] = X[q, :] . W[r + w, :] for w < NW, q < RB (X split for fp4, natural for fp8). */
TGT512 static AINL void tile512(int fmt, int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t nc,
                                const float *X, int64_t ldx, float *C, int64_t ldc)
{
    const __m512 tab = _mm512_loadu_ps(e2m1_table);
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    const int64_t pf = 8 * (int64_t)NW * (int64_t)m->row_bytes;
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < nc; c++) {
        __m512 wv[8][2];
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            if (fmt == F_FP4)
                dec_fp4_512(row[w], scl[w], c, tab, wv[w]);
            else {
                if (!(c & 1)) /* as tilebf4: the rows 8 blocks ahead into L2, one line per 64 bytes */
                    _mm_prefetch((const char *)(row[w] + 32 * c + pf), _MM_HINT_T1);
                dec_fp8_512(row[w], scl[w], sfp32, c, wv[w]);
            }
        }
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++) {
            __m512 x0 = _mm512_loadu_ps(X + q * ldx + 32 * c), x1 = _mm512_loadu_ps(X + q * ldx + 32 * c + 16);
#pragma GCC unroll 8
            for (int w = 0; w < NW; w++) {
                acc[w][q] = _mm512_fmadd_ps(wv[w][0], x0, acc[w][q]);
                acc[w][q] = _mm512_fmadd_ps(wv[w][1], x1, acc[w][q]);
            }
        }
    }
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = _mm512_reduce_add_ps(acc[w][q]);
}

/* Weight rows [r0, r0 + nr) against n activation rows in blocks of at most 8; the weight-row
   block NW shrinks as RB grows so that the accumulators and decoded weights fit 32 registers. */
TGT512 static AINL void dot_rows_512(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                     const float *X, int64_t ldx, float *C, int64_t ldc)
{
    int64_t nc = m->k / 32;
    for (int64_t q = 0; q < n;) {
        int64_t passes = cdiv(n - q, 8);
        int rb = (int)cdiv(n - q, passes);
        const float *Xq = X + q * ldx;
        float *Cq = C + q * ldc;
        int64_t j = 0;
#define T512(NW_, RB_)                                                                                           \
    do {                                                                                                         \
        for (; j + (NW_) <= nr; j += (NW_))                                                                      \
            tile512(fmt, NW_, RB_, m, r0 + j, nc, Xq, ldx, Cq + j, ldc);                                         \
        for (; j < nr; j++)                                                                                      \
            tile512(fmt, 1, RB_, m, r0 + j, nc, Xq, ldx, Cq + j, ldc);                                           \
    } while (0)
        switch (rb) {
        case 1: T512(8, 1); break;
        case 2: T512(4, 2); break;
        case 3: T512(4, 3); break;
        case 4: T512(4, 4); break;
        case 5: T512(2, 5); break;
        case 6: T512(2, 6); break;
        case 7: T512(2, 7); break;
        default: T512(2, 8); break;
        }
#undef T512
        q += rb;
    }
}

TGT512 static void dot_rows_fp4_512(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *XS,
                                    int64_t ldx, float *C, int64_t ldc)
{
    dot_rows_512(F_FP4, m, r0, nr, n, XS, ldx, C, ldc);
}

TGT512 static void dot_rows_fp8_512(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                                    int64_t ldx, float *C, int64_t ldc)
{
    dot_rows_512(F_FP8, m, r0, nr, n, X, ldx, C, ldc);
}

/*
 * fp4 decode-dot on AVX512-BF16 (vdpbf16ps), for activations that are exactly bf16 (the
 * act_quant outputs e4m3 x 2^k, and bf16 inputs: checked element by element when X is
 * converted, else the fp32 kernel runs). Per 64 elements (32 bytes) of a weight row: one
 * zero-extension to 16-bit lanes, two 32-entry word permutes give the unscaled e2m1 values
 * as bf16 (the even elements from the low nibbles, the odd ones from the high nibbles), two
 * vdpbf16ps (exact products, fp32 sums) and one FMA by the two groups' ue8m0 scales (lanes
 * 0-7 hold elements 0-31, lanes 8-15 elements 32-63). About 4 vector ops per 32 weights
 * against 7 in the fp32 kernel above. X is given permuted: within each 64-block, the even
 * elements then the odd ones (bf16_rows below).
 */
#define TGTBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define TGTBF4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")))
static uint16_t e2m1_bf16_table[32]; /* entry i: bf16 of e2m1 code i & 15 */

/*
 * The activation-row blocking of the bf16 kernels: rows in even passes of at most 8 (9 rows
 * run as 5 + 4, not 8 + 1), NW weight rows per tile call, fewer as RB grows so that the
 * accumulators fit the registers. TILE(NW, RB, m, r, nc, X, ldx, C, ldc); NC: its step count.
 */
#define BF16_ROW_BLOCKS(TILE, NC)                                                                                \
    for (int64_t q = 0; q < n;) {                                                                                \
        int64_t passes = cdiv(n - q, 8);                                                                         \
        int rb = (int)cdiv(n - q, passes);                                                                       \
        const uint16_t *Xq = X + q * ldx;                                                                        \
        float *Cq = C + q * ldc;                                                                                 \
        int64_t j = 0;                                                                                           \
        switch (rb) {                                                                                            \
        case 1: BF16_TILES(TILE, NC, 8, 1); break;                                                               \
        case 2: BF16_TILES(TILE, NC, 8, 2); break;                                                               \
        case 3: BF16_TILES(TILE, NC, 4, 3); break;                                                               \
        case 4: BF16_TILES(TILE, NC, 4, 4); break;                                                               \
        case 5: BF16_TILES(TILE, NC, 4, 5); break;                                                               \
        case 6: BF16_TILES(TILE, NC, 2, 6); break;                                                               \
        case 7: BF16_TILES(TILE, NC, 2, 7); break;                                                               \
        default: BF16_TILES(TILE, NC, 2, 8); break;                                                              \
        }                                                                                                        \
        q += rb;                                                                                                 \
    }
#define BF16_TILES(TILE, NC, NW_, RB_)                                                                           \
    do {                                                                                                         \
        for (; j + (NW_) <= nr; j += (NW_))                                                                      \
            TILE(NW_, RB_, m, r0 + j, NC, Xq, ldx, Cq + j, ldc);                                                 \
        for (; j < nr; j++)                                                                                      \
            TILE(1, RB_, m, r0 + j, NC, Xq, ldx, Cq + j, ldc);                                                   \
    } while (0)

TGTBF static AINL void tilebf(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n64, const uint16_t *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    const __m512i tab = _mm512_loadu_si512((const void *)e2m1_bf16_table);
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < n64; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(row[w] + 32 * c)));
            __m512bh we = (__m512bh)_mm512_permutexvar_epi16(v, tab);
            __m512bh wo = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tab);
            __m512 sv = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(ue8m0_table[scl[w][2 * c]])),
                                                            _mm256_castps_pd(_mm256_set1_ps(ue8m0_table[scl[w][2 * c + 1]])), 1));
#pragma GCC unroll 8
            for (int q = 0; q < RB; q++) {
                const uint16_t *x = X + q * ldx + 64 * c;
                __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), we, (__m512bh)_mm512_loadu_si512((const void *)x));
                t = _mm512_dpbf16_ps(t, wo, (__m512bh)_mm512_loadu_si512((const void *)(x + 32)));
                acc[w][q] = _mm512_fmadd_ps(t, sv, acc[w][q]);
            }
        }
    }
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = _mm512_reduce_add_ps(acc[w][q]);
}

/*
 * tilebf4: the fp4 bf16 kernel where k % 128 == 0 and the CPU has AVX512-VBMI (every group
 * size; tilebf stays for the other cases and DSV4MOE_CPU_NO_VBMI). 64 bytes (128 weights, four
 * ue8m0 groups) of a weight row per step: two masked byte permutes widen the bytes to 16-bit
 * lanes so that each 32-bit lane of the products holds one group (lanes 0-3 group 0, .., 12-15
 * group 3); the four vdpbf16ps of the step then sum into one vector, scaled once by the four
 * groups' scales, built from the 4 scale bytes by one byte permute and a shift (ue8m0 b is the
 * fp32 with exponent field b: exact for 1 <= b <= 254; a block of rows with a scale byte 0 or
 * 255 takes the table instead). Per 128 weights: 2 byte permutes, 2 shifts, 4 word permutes,
 * 4 dot products, 3 scale ops and 1 FMA, against about 24 ops in tilebf (from L2, one core:
 * 17.4 -> 22.3 GB/s of fp4 bytes). The rows of a block are contiguous, so the same offset 8
 * blocks ahead is prefetched into L2 (from DRAM, one core: 12.8 -> 15.5 GB/s; into L1 or 2
 * blocks ahead: 12.1). X layout in each 128-block: four runs of 32 (half h = 0, 1; parity 0,
 * 1): word p of a run holds element 32 (p / 8) + 2 (8 h + p % 8) + parity (bf16_rows).
 */
static uint8_t k4_idx1[64], k4_idx2[64], k4_sidx[64]; /* filled by init_tables */

TGTBF4 static bool scales_plain(const uint8_t *s, int64_t n)
{
    __mmask64 bad = 0;
    for (int64_t i = 0; i < n; i += 64) {
        __mmask64 in = n - i >= 64 ? ~0ull : (1ull << (n - i)) - 1u;
        __m512i v = _mm512_mask_loadu_epi8(_mm512_set1_epi8(1), in, (const void *)(s + i));
        bad |= _mm512_cmpeq_epi8_mask(v, _mm512_setzero_si512()) | _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1));
    }
    return bad == 0;
}

/* The step tilebf4 and tile8bf share: acc[q] += sv * (X[q]'s 128-block c . wv[0..3]), q < RB. */
TGTBF static AINL void dot4_step(int RB, const uint16_t *X, int64_t ldx, int64_t c, const __m512bh wv[4], __m512 sv,
                                 __m512 *acc)
{
#pragma GCC unroll 8
    for (int q = 0; q < RB; q++) {
        const uint16_t *x = X + q * ldx + 128 * c;
        __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), wv[0], (__m512bh)_mm512_loadu_si512((const void *)x));
        t = _mm512_dpbf16_ps(t, wv[1], (__m512bh)_mm512_loadu_si512((const void *)(x + 32)));
        t = _mm512_dpbf16_ps(t, wv[2], (__m512bh)_mm512_loadu_si512((const void *)(x + 64)));
        t = _mm512_dpbf16_ps(t, wv[3], (__m512bh)_mm512_loadu_si512((const void *)(x + 96)));
        acc[q] = _mm512_fmadd_ps(t, sv, acc[q]);
    }
}

/* C[q * ldc + w] = the sum of acc[w][q]'s lanes. */
TGTBF static AINL void store_acc(int NW, int RB, __m512 acc[8][8], float *C, int64_t ldc)
{
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = _mm512_reduce_add_ps(acc[w][q]);
}

TGTBF4 static AINL void tilebf4(int NW, int RB, bool plain, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                               const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    const __m512i tab = _mm512_loadu_si512((const void *)e2m1_bf16_table);
    const __m512i i1 = _mm512_loadu_si512((const void *)k4_idx1), i2 = _mm512_loadu_si512((const void *)k4_idx2);
    const __m512i si = _mm512_loadu_si512((const void *)k4_sidx);
    const __mmask64 even = 0x5555555555555555ull, top = 0x8888888888888888ull;
    const int64_t pf = 8 * (int64_t)NW * (int64_t)m->row_bytes; /* 8 blocks ahead, into L2 */
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < n128; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            const uint8_t *p = row[w] + 64 * c;
            _mm_prefetch((const char *)(p + pf), _MM_HINT_T1);
            __m512i b = _mm512_loadu_si512((const void *)p);
            __m512i z1 = _mm512_maskz_permutexvar_epi8(even, i1, b), z2 = _mm512_maskz_permutexvar_epi8(even, i2, b);
            __m512bh wv[4] = {(__m512bh)_mm512_permutexvar_epi16(z1, tab),
                              (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z1, 4), tab),
                              (__m512bh)_mm512_permutexvar_epi16(z2, tab),
                              (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z2, 4), tab)};
            __m512 sv;
            const uint8_t *s = scl[w] + 4 * c;
            if (plain) {
                uint32_t s4;
                memcpy(&s4, s, 4);
                sv = _mm512_castsi512_ps(
                    _mm512_srli_epi32(_mm512_maskz_permutexvar_epi8(top, si, _mm512_set1_epi32((int)s4)), 1));
            } else
                sv = _mm512_permutexvar_ps(_mm512_srli_epi32(si, 24),
                                           _mm512_castps128_ps512(_mm_setr_ps(ue8m0_table[s[0]], ue8m0_table[s[1]],
                                                                              ue8m0_table[s[2]], ue8m0_table[s[3]])));
            dot4_step(RB, X, ldx, c, wv, sv, acc[w]);
        }
    }
    store_acc(NW, RB, acc, C, ldc);
}

/* NW rows from r: the plain-scale variant when every scale byte of the rows is in [1, 254]. */
TGTBF4 static AINL void tilebf4_any(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                                   const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    if (scales_plain(row_scales(m, r), (int64_t)NW * 4 * n128))
        tilebf4(NW, RB, true, m, r, n128, X, ldx, C, ldc);
    else
        tilebf4(NW, RB, false, m, r, n128, X, ldx, C, ldc);
}

/* Weight rows [r0, r0 + nr) on tilebf4, activation rows in even blocks of at most 8. */
TGTBF4 static void dot_rows_fp4_k4(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                   int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tilebf4_any, m->k / 128)
}

TGTBF static void dot_rows_fp4_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                    int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tilebf, m->k / 64)
}

/*
 * fp8 (e4m3) decode-dot on AVX512-BF16 for k % 128 == 0 and activations that are exactly bf16
 * (natural order, bf16_natural below). e4m3 -> bf16 is exact (3 mantissa bits): for a normal
 * code the bf16 bits are ((c & 0x7F) << 4) + (120 << 7) (exponent bias 7 -> 127), the 7
 * subnormal codes (exponent 0: m 2^-9, normal in bf16) come from a table by a masked word
 * permute, and the sign bit is moved to bit 15. 7 vector ops per 32 weights, one vdpbf16ps
 * (exact products, fp32 sums), and one FMA by the block scale per 128 weights, against about
 * 12 ops per 32 in the fp32 kernel (dec_fp8_512). As that kernel, 0x7F / 0xFF decode as 480
 * (the fp16 path gives the same). Rows are prefetched 8 blocks ahead into L2 as in tilebf4.
 */
static uint16_t e4m3_sub_bf16[32]; /* entry m < 8: bf16 of m 2^-9 (init_tables) */

TGTBF static AINL __m512bh dec_fp8_bf16(const uint8_t *p, __m512i sub)
{
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)p));
    __m512i a = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(v, 4), _mm512_set1_epi16(0x07F0)),
                                 _mm512_set1_epi16(0x3C00));
    a = _mm512_mask_permutexvar_epi16(a, _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x78)), v, sub);
    return (__m512bh)_mm512_ternarylogic_epi32(a, _mm512_slli_epi16(v, 8), _mm512_set1_epi16((short)0x8000), 0xF8);
}

TGTBF static AINL void tile8bf(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                               const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    const __m512i sub = _mm512_loadu_si512((const void *)e4m3_sub_bf16);
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    const int64_t pf = 8 * (int64_t)NW * (int64_t)m->row_bytes;
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < n128; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            const uint8_t *p = row[w] + 128 * c;
            _mm_prefetch((const char *)(p + pf), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + pf + 64), _MM_HINT_T1);
            __m512bh wv[4] = {dec_fp8_bf16(p, sub), dec_fp8_bf16(p + 32, sub), dec_fp8_bf16(p + 64, sub),
                              dec_fp8_bf16(p + 96, sub)};
            __m512 sv = _mm512_set1_ps(sfp32 ? ldf32(scl[w] + 4 * c) : ue8m0_table[scl[w][c]]);
            dot4_step(RB, X, ldx, c, wv, sv, acc[w]);
        }
    }
    store_acc(NW, RB, acc, C, ldc);
}

TGTBF static void dot_rows_fp8_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                    int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tile8bf, m->k / 128)
}

/*
 * The SwiGLU epilogue of one row on AVX-512 (16 lanes, the tail masked): the same operations
 * in the same order as the scalar loop in epilogue(), with expf replaced by exp512 below and
 * bf16 rounding done on the integer bits exactly as rbf16 (vcvtneps2bf16 would flush
 * denormals). exp512: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
 * [-ln2/2, ln2/2] (truncation < 1e-8 relative), vscalefps for 2^n (overflow to inf,
 * underflow to 0); NaN propagates. It is within 1-2 ulp of libm's expf, so h can differ from
 * the scalar path in the last bf16 bit where v sits at a rounding boundary (the tests bound
 * the ULP distance to the reference).
 */
TGT512 static AINL __m512 rbf16_512(__m512 x)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i qn = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_mask_blend_epi32(nan, r, qn), hi));
}

TGT512 static AINL __m512 exp512(__m512 x)
{
    /* min/max with x second: a NaN x comes out as NaN */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

TGT512 static void swiglu_row_512(const float *gr, const float *ur, float *h, int64_t I, bool clamp, float L,
                                  bool mulw, float w, uint64_t *gc, uint64_t *uc)
{
    const __m512 Lv = _mm512_set1_ps(L), nL = _mm512_set1_ps(-L), one = _mm512_set1_ps(1.0f);
    const __m512 wv = _mm512_set1_ps(w);
    uint64_t g_hits = 0, u_hits = 0;
    for (int64_t i = 0; i < I; i += 16) {
        __mmask16 m = I - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (I - i)) - 1u);
        __m512 g = rbf16_512(_mm512_maskz_loadu_ps(m, gr + i)), u = rbf16_512(_mm512_maskz_loadu_ps(m, ur + i));
        if (clamp) {
            __mmask16 mg = _mm512_mask_cmp_ps_mask(m, g, Lv, _CMP_GT_OQ);
            __mmask16 mu = _mm512_mask_cmp_ps_mask(m, u, Lv, _CMP_GT_OQ);
            __mmask16 ml = _mm512_mask_cmp_ps_mask(m, u, nL, _CMP_LT_OQ);
            g = _mm512_mask_blend_ps(mg, g, Lv);
            u = _mm512_mask_blend_ps(ml, _mm512_mask_blend_ps(mu, u, Lv), nL);
            g_hits += (uint64_t)__builtin_popcount(mg);
            u_hits += (uint64_t)__builtin_popcount((unsigned)(mu | ml));
        }
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        __m512 v = _mm512_mul_ps(s, u);
        if (mulw)
            v = _mm512_mul_ps(v, wv);
        _mm512_mask_storeu_ps(h + i, m, rbf16_512(v));
    }
    *gc += g_hits;
    *uc += u_hits;
}

static bool cpu_has_avx512bf16(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}

static bool cpu_has_avx512vbmi(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
}

static bool cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static bool cpu_has_simd(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
static float ue8m0_table[256];
static bool cpu_has_avx512(void) { return false; }
static uint16_t e2m1_bf16_table[32];
static bool cpu_has_avx512bf16(void) { return false; }
static bool cpu_has_avx512vbmi(void) { return false; }
static void dot_rows_fp8_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)X, (void)ldx, (void)C, (void)ldc;
}
static void dot_rows_fp4_k4(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                            int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)X, (void)ldx, (void)C, (void)ldc;
}
static void swiglu_row_512(const float *gr, const float *ur, float *h, int64_t I, bool clamp, float L, bool mulw,
                           float w, uint64_t *gc, uint64_t *uc)
{
    (void)gr, (void)ur, (void)h, (void)I, (void)clamp, (void)L, (void)mulw, (void)w, (void)gc, (void)uc;
}
static void dot_rows_fp4_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)X, (void)ldx, (void)C, (void)ldc;
}
static void dot_rows_fp4_512(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *XS,
                             int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)XS, (void)ldx, (void)C, (void)ldc;
}
static void dot_rows_fp8_512(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                             int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)X, (void)ldx, (void)C, (void)ldc;
}
static bool cpu_has_simd(void) { return false; }
static void dot_rows_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                          int64_t ldx, float *C, int64_t ldc)
{
    (void)m, (void)r0, (void)nr, (void)n, (void)X, (void)ldx, (void)C, (void)ldc;
}
static void dequant_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    (void)m, (void)r0, (void)nr, (void)out;
}
#endif

/* Dequantizes rows [r0, r0 + nr) to fp32 [nr, k]: the SIMD decoder or dsv4_matrix_dequant_rows. */
static void dequant_rows(bool simd, const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    if (simd && simd_ok(m))
        dequant_simd(m, r0, nr, out);
    else
        dsv4_matrix_dequant_rows(m, r0, nr, out);
}

/* a . b in fp32 over four fixed partial sums, ((s0 + s1) + (s2 + s3)): the scalar paths' one order. */
static float dot4(const float *a, const float *b, int64_t n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* C[q, j] = X[q, :] . W[r0 + j, :] for j < nr, q < n; tmp: k floats (scalar path). */
static void dot_rows(bool simd, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                     int64_t ldx, float *C, int64_t ldc, float *tmp)
{
    if (simd) {
        dot_rows_simd(m, r0, nr, n, X, ldx, C, ldc);
        return;
    }
    int64_t k = m->k;
    for (int64_t j = 0; j < nr; j++) {
        dsv4_matrix_dequant_rows(m, r0 + j, 1, tmp);
        for (int64_t q = 0; q < n; q++)
            C[q * ldc + j] = dot4(X + q * ldx, tmp, k);
    }
}

/* Exposed to tests/test_cpu.c through a prototype there: the SIMD decoder against the library's. */
void dsv4_cpu_dequant_rows_for_test(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out);
void dsv4_cpu_dequant_rows_for_test(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    dequant_rows(cpu_has_simd(), m, r0, nr, out);
}

/* ---------------- GEMM: C[n, na + nb] = X[n, k] . [A; B]^T ---------------- */

/* Per-worker scratch: a dequantized tile, split X rows (fp4 AVX-512 path), one decoded row. */
typedef struct {
    float *tile; /* TILE_ROWS * kmax */
    float *xs;   /* SMALL_ROWS * kmax */
    float *row;  /* kmax */
} wscratch;

static size_t wscratch_floats(const dsv4_config *c)
{
    int64_t kmax = c->dim > c->moe_inter_dim ? c->dim : c->moe_inter_dim;
    return (size_t)((TILE_ROWS + SMALL_ROWS + 1) * kmax);
}

static wscratch worker_scratch(cpu_be *b, float *base, int w)
{
    const dsv4_config *c = &b->cfg;
    int64_t kmax = c->dim > c->moe_inter_dim ? c->dim : c->moe_inter_dim;
    float *p = base + (size_t)w * wscratch_floats(c);
    wscratch ws = {p, p + TILE_ROWS * kmax, p + (TILE_ROWS + SMALL_ROWS) * kmax};
    return ws;
}

/* The fp4 AVX-512 kernel's X layout: within each 32-block, even elements then odd ones. */
static void split_rows(const float *X, int64_t ldx, int64_t n, int64_t k, float *XS)
{
    for (int64_t q = 0; q < n; q++) {
        const float *x = X + q * ldx;
        float *o = XS + q * k;
        for (int64_t c = 0; c < k; c += 32)
            for (int i = 0; i < 16; i++) {
                o[c + i] = x[c + 2 * i];
                o[c + 16 + i] = x[c + 2 * i + 1];
            }
    }
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
                            uint32_t e = fbits(x[c + 32 * (p / 8) + 2 * (8 * h + p % 8) + par]);
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
                uint32_t e = fbits(x[c + 2 * i]), d = fbits(x[c + 2 * i + 1]);
                low |= (e | d) & 0xFFFFu;
                o[c + i] = (uint16_t)(e >> 16);
                o[c + 32 + i] = (uint16_t)(d >> 16);
            }
    }
    return low == 0;
}

static bool use_fp4_512(const cpu_be *b, const dsv4_matrix_view *m)
{
    return b->avx512 && m->format == DSV4_FORMAT_FP4 && m->k % 32 == 0;
}

/* Groups larger than SMALL_ROWS still take the fused kernel, in blocks of SMALL_ROWS rows, when
   it is the bf16 one: it beats dequantize + sgemm at every size measured (docs/cpu.md). */
static bool fused_blocks(const cpu_be *b, const dsv4_matrix_view *ma, const dsv4_matrix_view *mb)
{
    return b->bf16dot && use_fp4_512(b, ma) && ma->k % 64 == 0 && (!mb || use_fp4_512(b, mb));
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
    return b->bf16dot && m->format == DSV4_FORMAT_FP8 && m->k % 128 == 0;
}

/* X as bf16 in natural order; false when some element is not exactly a bf16. */
static bool bf16_natural(const float *X, int64_t ldx, int64_t n, int64_t k, uint16_t *XN)
{
    uint32_t low = 0;
    for (int64_t q = 0; q < n; q++)
        for (int64_t i = 0; i < k; i++) {
            uint32_t e = fbits(X[q * ldx + i]);
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
    if (b->bf16dot && k % 64 == 0 && bf16_rows(X, ldx, n, k, b->k4 && k % 128 == 0, (uint16_t *)(void *)scratch)) {
        p.XB = (const uint16_t *)(const void *)scratch;
        return p;
    }
    split_rows(X, ldx, n, k, scratch);
    p.XS = scratch;
    return p;
}

/* Fused decode-dot of weight rows [r0, r0 + nr) of m; xp from prep_x. */
static void fused_rows(const cpu_be *b, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                       const float *X, int64_t ldx, xprep xp, float *C, int64_t ldc, float *row)
{
    if (use_fp4_512(b, m) && xp.XB)
        if (b->k4 && m->k % 128 == 0)
            dot_rows_fp4_k4(m, r0, nr, n, xp.XB, m->k, C, ldc);
        else
            dot_rows_fp4_bf16(m, r0, nr, n, xp.XB, m->k, C, ldc);
    else if (use_fp4_512(b, m))
        dot_rows_fp4_512(m, r0, nr, n, xp.XS, m->k, C, ldc);
    else if (xp.XN && use_fp8_bf16(b, m))
        dot_rows_fp8_bf16(m, r0, nr, n, xp.XN, m->k, C, ldc);
    else if (b->avx512 && m->format == DSV4_FORMAT_FP8 && m->k % 32 == 0)
        dot_rows_fp8_512(m, r0, nr, n, X, ldx, C, ldc);
    else
        dot_rows(b->simd && simd_ok(m), m, r0, nr, n, X, ldx, C, ldc, row);
}

/* One tile: dequantize rows [r0, r0 + rows) and sgemm into C columns [col, col + rows). */
static void tile_gemm(const cpu_be *b, const dsv4_matrix_view *m, int64_t r0, int64_t rows, int64_t col, int64_t n,
                      const float *X, int64_t ldx, float *C, int64_t ldc, float *scr)
{
    dequant_rows(b->simd, m, r0, rows, scr);
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
    bool simd = j->b->simd && simd_ok(j->ma) && (!j->mb || simd_ok(j->mb));
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
    wscratch ws = worker_scratch(j->b, j->wbase, (int)w);
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
        j.xp = prep_x(b, ma, mb, X, ldx, n, worker_scratch(b, wbase, 0).xs);
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
    bool simd512; /* the AVX-512 row (swiglu_row_512) */
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
        if (j->simd512)
            swiglu_row_512(gr, ur, h, I, clamp, L, mulw, w, &gc, &uc);
        for (int64_t i = j->simd512 ? I : 0; i < I; i++) {
            float g = rbf16(gr[i]), u = rbf16(ur[i]);
            if (clamp) {
                if (g > L) {
                    g = L;
                    gc++;
                }
                if (u > L || u < -L) {
                    u = u > L ? L : -L;
                    uc++;
                }
            }
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
static dsv4_status ffn(cpu_be *b, float *wbase, const wscratch *ws, const cmat *m, bool clamp, int64_t n,
                       const float *X, const float *tw, float *GU, float *HB, float *O, _Atomic uint64_t *gcl,
                       _Atomic uint64_t *ucl, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = c->moe_inter_dim;
    dsv4_status st = DSV4_OK;
    if (DSV4_FAULT(DSV4_FAULT_F01) && m != b->shared && m[0].v.format == DSV4_FORMAT_FP8)
        clamp = false; /* fault F01: the fp8 per-block routed family without the SwiGLU clamp */
    if (ws)
        mm_serial(b, ws, &m[0].v, &m[1].v, n, X, H, GU, 2 * I);
    else if ((st = matmul_par(b, wbase, &m[0].v, &m[1].v, n, X, H, GU, 2 * I, err)))
        return st;
    bool quant = m[2].v.format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    epi_job ej = {c, GU, HB, tw, clamp, quant, c->weight_point == DSV4_WEIGHT_BEFORE_W2, I, gcl, ucl, b->avx512};
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

/* y[tok[q]] += bf16(O[q]) (or w bf16(O[q]) after_w2) for the rows of groups in order; columns in parallel. */
typedef struct {
    float *y;
    const float *O;
    const int32_t *tok; /* NULL: row q is token q */
    const float *tw;    /* NULL: weight 1 */
    int64_t n, H;
} comb_job;

static void combine(void *p, int64_t lo, int64_t hi)
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

typedef struct {
    cpu_be *b;
    float *wbase;
    int64_t e0, e1;     /* experts [e0, e1) of the batch, ascending */
    const int64_t *off; /* slot offsets per expert */
    int64_t base;       /* off[e0]: the batch's first slot */
    const int32_t *stok;
    const float *sw, *xq;
    float *XG, *GU, *HB, *O; /* indexed by slot - base */
    _Atomic int64_t next;
    _Atomic uint64_t gc, uc;
} batch_job;

static void batch_worker(void *p, int64_t w, int64_t wend)
{
    batch_job *j = p;
    (void)wend;
    cpu_be *b = j->b;
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = c->moe_inter_dim;
    wscratch ws = worker_scratch(b, j->wbase, (int)w);
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
        ffn(b, NULL, &ws, &b->experts[3 * e], true, n, XG, j->sw + j->off[e], j->GU + r * 2 * I, j->HB + r * I,
            j->O + r * H, &j->gc, &j->uc, NULL);
    }
}

/* ---------------- router ---------------- */

typedef struct {
    cpu_be *b;
    const float *xf, *logits;
    const int32_t *in_ids;
    int32_t *ids, *kept;
    float *w;
    unsigned char *nonf;
} route_job;

static inline bool before(float ka, int32_t ia, float kb, int32_t ib) { return ka > kb || (ka == kb && ia < ib); }

static void route(void *p, int64_t lo, int64_t hi)
{
    route_job *j = p;
    const cpu_be *b = j->b;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, K = c->n_activated;
    bool hash = dsv4_config_is_hash_layer(c);
    float s[E], key[K], contrib[K], norms[K];
    int order[K];
    for (int64_t t = lo; t < hi; t++) {
        const float *l = j->logits + t * E;
        int32_t *ids = j->ids + t * K;
        float *w = j->w + t * K;
        bool finite = true;
        float lb[E];
        for (int64_t e = 0; e < E; e++) {
            lb[e] = c->gate_logits == DSV4_GATE_LOGITS_BF16 ? rbf16(l[e]) : l[e];
            finite = finite && isfinite(lb[e]);
        }
        j->nonf[t] = !finite;
        if (!finite) {
            for (int64_t k = 0; k < K; k++) {
                ids[k] = (int32_t)k;
                w[k] = c->route_scale / (float)K;
            }
            j->kept[t] = (int32_t)K;
            continue;
        }
        /* scores (SPEC.md 2.2) */
        if (c->score_func == DSV4_SCORE_SQRTSOFTPLUS) {
            for (int64_t e = 0; e < E; e++)
                s[e] = sqrtf(lb[e] > 20.0f ? lb[e] : log1pf(expf(lb[e])));
        } else if (c->score_func == DSV4_SCORE_SIGMOID) {
            for (int64_t e = 0; e < E; e++)
                s[e] = 1.0f / (1.0f + expf(-lb[e]));
        } else {
            float mx = lb[0], sum = 0.0f;
            for (int64_t e = 1; e < E; e++)
                mx = lb[e] > mx ? lb[e] : mx;
            for (int64_t e = 0; e < E; e++) {
                s[e] = expf(lb[e] - mx);
                sum += s[e];
            }
            for (int64_t e = 0; e < E; e++)
                s[e] = s[e] / sum;
        }
        /* selection (2.3) */
        if (hash) {
            for (int64_t k = 0; k < K; k++)
                ids[k] = b->rt.tid2eid[(int64_t)j->in_ids[t] * K + k];
        } else {
            int64_t n = 0;
            for (int64_t e = 0; e < E; e++) {
                float v = b->rt.bias ? s[e] + b->rt.bias[e] : s[e];
                if (n == K && !before(v, (int32_t)e, key[K - 1], ids[K - 1]))
                    continue;
                int64_t pos = n < K ? n++ : K - 1;
                while (pos > 0 && before(v, (int32_t)e, key[pos - 1], ids[pos - 1])) {
                    key[pos] = key[pos - 1];
                    ids[pos] = ids[pos - 1];
                    pos--;
                }
                key[pos] = v;
                ids[pos] = (int32_t)e;
            }
        }
        /* weights (2.4) */
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            w[k] = s[ids[k]];
            sum += w[k];
        }
        if (c->score_func != DSV4_SCORE_SOFTMAX) {
            float den = sum + c->norm_eps;
            for (int64_t k = 0; k < K; k++)
                w[k] = w[k] / den;
        }
        for (int64_t k = 0; k < K; k++)
            w[k] = w[k] * c->route_scale;
        int64_t keep = K;
        /* norm top-p (3) */
        if (!hash && c->top_p < 1.0f) {
            const float *x = j->xf + t * H;
            for (int64_t k = 0; k < K; k++) {
                int32_t ex = ids[k];
                if (c->top_p_predictor == DSV4_PREDICTOR_CONST)
                    norms[k] = b->rt.pred_norm[ex];
                else if (c->top_p_predictor == DSV4_PREDICTOR_LINEAR) {
                    float v = dot4(x, b->rt.pred_w + (int64_t)ex * H, H) + b->rt.pred_b[ex];
                    norms[k] = v > 0.0f ? v : 0.0f;
                } else
                    norms[k] = 1.0f;
            }
            for (int64_t k = 0; k < K; k++) {
                contrib[k] = w[k] * norms[k];
                int64_t pos = k;
                while (pos > 0 && before(contrib[k], ids[k], contrib[order[pos - 1]], ids[order[pos - 1]])) {
                    order[pos] = order[pos - 1];
                    pos--;
                }
                order[pos] = (int)k;
            }
            float total = 0.0f;
            for (int64_t r = 0; r < K; r++)
                total += contrib[order[r]];
            float thr = c->top_p * total, cum = 0.0f;
            for (int64_t r = 0; r < K; r++) {
                cum += contrib[order[r]];
                if (cum >= thr) {
                    keep = r + 1;
                    break;
                }
            }
            if (keep < c->top_p_min_keep)
                keep = c->top_p_min_keep;
            float orig = 0.0f, kw = 0.0f;
            for (int64_t k = 0; k < K; k++)
                orig += w[k];
            for (int64_t r = keep; r < K; r++) {
                ids[order[r]] = (int32_t)E;
                w[order[r]] = 0.0f;
            }
            for (int64_t k = 0; k < K; k++)
                kw += w[k];
            if (c->top_p_renorm && keep < K && kw > 0.0f) {
                float sc = orig / kw;
                for (int64_t k = 0; k < K; k++)
                    w[k] = w[k] * sc;
            }
        }
        j->kept[t] = (int32_t)keep;
    }
}

typedef struct {
    const cpu_be *b;
    const float *xf;
    float *logits;
    int64_t Tc;
} logit_job;

static void logits_rows(void *p, int64_t lo, int64_t hi)
{
    logit_job *j = p;
    const dsv4_config *c = &j->b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(hi - lo), (int)E, (int)H, 1.0f, j->xf + lo * H,
                (int)H, j->b->rt.gate, (int)H, 0.0f, j->logits + lo * E, (int)E);
}

/* Few tokens: experts [lo, hi) of every token by sgemv, the gate rows split over the workers (sgemm
   at M = 1 packs the whole gate first: a second pass over its 4 MiB). */
static void logits_cols(void *p, int64_t lo, int64_t hi)
{
    logit_job *j = p;
    const dsv4_config *c = &j->b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim;
    for (int64_t t = 0; t < j->Tc; t++)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(hi - lo), (int)H, 1.0f, j->b->rt.gate + lo * H, (int)H,
                    j->xf + t * H, 1, 0.0f, j->logits + t * E + lo, 1);
}

/* ---------------- per-row conversions ---------------- */

typedef struct {
    const uint16_t *x;
    float *xf, *xq, *xqs;
    int64_t H;
    dsv4_act_quant mode;
    bool qr, qs; /* quantize into xq / xqs (else they alias xf) */
} conv_job;

static void convert_rows(void *p, int64_t lo, int64_t hi)
{
    conv_job *j = p;
    int64_t H = j->H;
    for (int64_t t = lo; t < hi; t++) {
        float *xf = j->xf + t * H;
        const uint16_t *x = j->x + t * H;
        for (int64_t i = 0; i < H; i++)
            xf[i] = ffrom((uint32_t)x[i] << 16);
        if (j->qr)
            dsv4_act_quant_row(xf, H, j->mode, j->xq + t * H, NULL, NULL);
        if (j->qs && j->xqs != j->xq)
            dsv4_act_quant_row(xf, H, j->mode, j->xqs + t * H, NULL, NULL);
    }
}

typedef struct {
    const float *y;
    uint16_t *out;
} out_job;

static void output_rows(void *p, int64_t lo, int64_t hi)
{
    out_job *j = p;
    for (int64_t i = lo; i < hi; i++)
        j->out[i] = tobf16(j->y[i]);
}

/* ---------------- forward ---------------- */

static dsv4_status cpu_forward(void *p, int64_t T, const uint16_t *x, const int32_t *in_ids, dsv4_forward_out *out,
                               dsv4_error *err)
{
    cpu_be *b = p;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim, K = c->n_activated;
    bool hash = dsv4_config_is_hash_layer(c);
    b->stats.launches += DSV4_FAULT(DSV4_FAULT_F11) ? 3 : 0; /* fault F11: sanitised ids, weights, mask per forward */
    if (T == 0) {
        b->stats.forwards++;
        return DSV4_OK;
    }
    /* Hash layers: every id checked before anything is written (as the reference). */
    dsv4_status st = dsv4_router_check_input_ids(c, b->rt.tid2eid, T, in_ids, "cpu forward", err);
    if (st)
        return st;
    openblas_set_num_threads(1); /* our workers own the cores; each sgemm runs on its caller */
    bool qr = c->routed_format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    bool qs = c->n_shared_experts > 0 && c->shared_format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    int64_t Tc0 = T < b->chunk ? T : b->chunk;
    size_t TH = (size_t)(Tc0 * H), TK = (size_t)(Tc0 * K);
    float *xf = ensure(b, B_XF, TH * sizeof(float));
    float *xq = qr ? ensure(b, B_XQ, TH * sizeof(float)) : xf;
    float *xqs = !qs ? xf : qr ? xq : ensure(b, B_XQS, TH * sizeof(float));
    float *y = ensure(b, B_Y, TH * sizeof(float));
    float *logits = ensure(b, B_LOG, (size_t)(Tc0 * E) * sizeof(float));
    int32_t *ids = ensure(b, B_IDS, TK * sizeof(int32_t));
    float *w = ensure(b, B_W, TK * sizeof(float));
    int32_t *kept = ensure(b, B_KEPT, (size_t)Tc0 * sizeof(int32_t));
    unsigned char *nonf = ensure(b, B_NONF, (size_t)Tc0);
    int64_t *cnt = ensure(b, B_CNT, (size_t)(E + 1) * sizeof(int64_t));
    int64_t *off = ensure(b, B_OFF, (size_t)(E + 1) * sizeof(int64_t));
    int32_t *stok = ensure(b, B_STOK, TK * sizeof(int32_t));
    float *sw = ensure(b, B_SW, TK * sizeof(float));
    if (!xf || !xq || !xqs || !y || !logits || !ids || !w || !kept || !nonf || !cnt || !off || !stok || !sw)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu forward", "out of memory for a chunk of %lld tokens",
                           (long long)Tc0);
    uint64_t rg = 0, ru = 0, sg = 0, su = 0, launches = 0, skips = 0, nonfinite = 0;
    for (int64_t t0 = 0; t0 < T; t0 += b->chunk) {
        int64_t Tc = T - t0 < b->chunk ? T - t0 : b->chunk;
        /* 1-2: convert and quantize x, route */
        conv_job cj = {x + t0 * H, xf, xq, xqs, H, c->act_quant, qr, qs};
        dsv4_parallel_for(Tc * H < 65536 ? 1 : b->threads, Tc, 8, convert_rows, &cj);
        logit_job lj = {b, xf, logits, Tc};
        if (Tc <= 4)
            dsv4_parallel_for((double)E * H < 4e5 ? 1 : b->threads, E, 16, logits_cols, &lj);
        else
            dsv4_parallel_for((double)Tc * E * H < 4e6 ? 1 : b->threads, Tc, 16, logits_rows, &lj);
        route_job rj = {b, xf, logits, hash ? in_ids + t0 : NULL, ids, kept, w, nonf};
        dsv4_parallel_for(Tc * E < 8192 ? 1 : b->threads, Tc, 16, route, &rj);
        for (int64_t t = 0; t < Tc; t++)
            nonfinite += nonf[t];
        if (out->topk_ids)
            memcpy(out->topk_ids + t0 * K, ids, (size_t)(Tc * K) * sizeof *ids);
        if (out->topk_weights)
            memcpy(out->topk_weights + t0 * K, w, (size_t)(Tc * K) * sizeof *w);
        if (out->kept_counts)
            memcpy(out->kept_counts + t0, kept, (size_t)Tc * sizeof *kept);
        /* 3: stable counting sort of the kept slots by expert */
        memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
        for (int64_t i = 0; i < Tc * K; i++) {
            int32_t e = ids[i];
            if (e < 0 || e > E)
                return dsv4_seterr(err, DSV4_ERR_INTERNAL, "cpu forward",
                                   "slot %lld holds expert id %d outside [0, %lld] (E is the sentinel)",
                                   (long long)(t0 + i / K), e, (long long)E);
            cnt[e]++;
        }
        int64_t maxn = c->n_shared_experts > 0 ? Tc : 0;
        off[0] = 0;
        for (int64_t e = 0; e < E; e++) {
            off[e + 1] = off[e] + cnt[e];
            maxn = cnt[e] > maxn ? cnt[e] : maxn;
        }
        for (int64_t e = 0; e < E; e++)
            cnt[e] = off[e];
        for (int64_t i = 0; i < Tc * K; i++) {
            int32_t e = ids[i];
            if (e == E)
                continue;
            stok[cnt[e]] = (int32_t)(i / K);
            sw[cnt[e]] = w[i];
            cnt[e]++;
        }
        /* Group buffers: a batch of groups (or one large group, or the shared expert). */
        int64_t rowbytes = (2 * H + 3 * I) * (int64_t)sizeof(float);
        int64_t cap = BATCH_BYTES / rowbytes;
        cap = cap > maxn ? cap : maxn;
        cap = cap < Tc * K ? cap : Tc * K;
        cap = cap > maxn ? cap : maxn;
        float *XG = ensure(b, B_XG, (size_t)(cap * H) * sizeof(float));
        float *GU = ensure(b, B_GU, (size_t)(cap * 2 * I) * sizeof(float));
        float *HB = ensure(b, B_HB, (size_t)(cap * I) * sizeof(float));
        float *O = ensure(b, B_O, (size_t)(cap * H) * sizeof(float));
        float *wbase = ensure(b, B_TILE, (size_t)b->threads * wscratch_floats(c) * sizeof(float));
        if (!XG || !GU || !HB || !O || !wbase)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu forward", "out of memory for groups of %lld rows",
                               (long long)cap);
        memset(y, 0, (size_t)(Tc * H) * sizeof *y);
        /* 4: routed experts in ascending id: large groups alone (threads inside the GEMMs), the others in
           batches of consecutive experts (one expert per worker at a time); each batch is combined in
           slot order, i.e. ascending expert id per token. */
        bool after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
        int64_t e = 0;
        while (e < E) {
            int64_t n = off[e + 1] - off[e];
            if (n == 0) {
                skips++;
                e++;
                continue;
            }
            if (n > LARGE_ROWS) {
                const int32_t *tok = stok + off[e];
                const float *tw = sw + off[e];
                for (int64_t q = 0; q < n; q++)
                    memcpy(XG + q * H, xq + (int64_t)tok[q] * H, (size_t)H * sizeof *XG);
                _Atomic uint64_t gc = 0, uc = 0;
                if ((st = ffn(b, wbase, NULL, &b->experts[3 * e], true, n, XG, tw, GU, HB, O, &gc, &uc, err)))
                    return st;
                rg += atomic_load(&gc);
                ru += atomic_load(&uc);
                launches++;
                comb_job cb = {y, O, tok, after ? tw : NULL, n, H};
                dsv4_parallel_for(n * H < 262144 ? 1 : b->threads, H, 64, combine, &cb);
                e++;
                continue;
            }
            int64_t e1 = e, rows = 0, groups = 0;
            while (e1 < E) {
                int64_t n1 = off[e1 + 1] - off[e1];
                if (n1 > LARGE_ROWS || rows + n1 > cap)
                    break;
                rows += n1;
                groups += n1 > 0;
                skips += n1 == 0;
                e1++;
            }
            batch_job bj = {.b = b, .wbase = wbase, .e0 = e, .e1 = e1, .off = off, .base = off[e], .stok = stok,
                            .sw = sw, .xq = xq, .XG = XG, .GU = GU, .HB = HB, .O = O};
            atomic_init(&bj.next, 0);
            atomic_init(&bj.gc, 0);
            atomic_init(&bj.uc, 0);
            int workers = groups < b->threads ? (int)groups : b->threads;
            if ((double)rows * (double)H * (double)I < 2e5)
                workers = 1;
            dsv4_parallel_for(workers, workers, 1, batch_worker, &bj);
            rg += atomic_load(&bj.gc);
            ru += atomic_load(&bj.uc);
            launches += (uint64_t)groups;
            comb_job cb = {y, O, stok + off[e], after ? sw + off[e] : NULL, rows, H};
            dsv4_parallel_for(rows * H < 262144 ? 1 : b->threads, H, 64, combine, &cb);
            e = e1;
        }
        /* 5: shared expert */
        if (c->n_shared_experts > 0) {
            _Atomic uint64_t gc = 0, uc = 0;
            if ((st = ffn(b, wbase, NULL, b->shared, c->shared_clamp, Tc, xqs, NULL, GU, HB, O, &gc, &uc, err)))
                return st;
            sg += atomic_load(&gc);
            su += atomic_load(&uc);
            launches++;
            comb_job cb = {y, O, NULL, NULL, Tc, H};
            dsv4_parallel_for(Tc * H < 262144 ? 1 : b->threads, H, 64, combine, &cb);
        }
        out_job oj = {y, out->y + t0 * H};
        dsv4_parallel_for(Tc * H < 262144 ? 1 : b->threads, Tc * H, 4096, output_rows, &oj);
    }
    b->stats.forwards++;
    b->stats.tokens += (uint64_t)T;
    b->stats.launches += launches;
    b->stats.empty_skips += skips;
    b->stats.nonfinite_rows += nonfinite;
    b->stats.routed_g_clamped += rg;
    b->stats.routed_u_clamped += ru;
    b->stats.shared_g_clamped += sg;
    b->stats.shared_u_clamped += su;
    return DSV4_OK;
}

/* ---------------- create / free ---------------- */

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    static const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int i = 0; i < 256; i++)
        ue8m0_table[i] = ue8m0f((uint8_t)i);
    for (int i = 0; i < 32; i++)
        e2m1_bf16_table[i] = (uint16_t)(fbits(e2m1[i & 15]) >> 16); /* exact: 2 mantissa bits */
#if CPU_X86
    for (int i = 0; i < 8; i++) /* e4m3 subnormals i 2^-9 as bf16 (normal there) */
        e4m3_sub_bf16[i] = (uint16_t)(fbits(ldexpf((float)i, -9)) >> 16);
    for (int p = 0; p < 32; p++) { /* tilebf4: word p <- byte 16 (p / 8) + p % 8 (+ 8), group p / 8 */
        k4_idx1[2 * p] = (uint8_t)(16 * (p / 8) + p % 8);
        k4_idx2[2 * p] = (uint8_t)(16 * (p / 8) + p % 8 + 8);
        k4_idx1[2 * p + 1] = k4_idx2[2 * p + 1] = 0;
    }
    for (int l = 0; l < 16; l++) /* fp32 lane l <- scale byte l / 4 in its top byte */
        for (int i = 0; i < 4; i++)
            k4_sidx[4 * l + i] = (uint8_t)(i == 3 ? l / 4 : 0);
#endif
}

/* The kernels this CPU has, less those the environment switches off (tests and benchmarks). */
static void pick_kernels(cpu_be *b)
{
    b->simd = cpu_has_simd() && !getenv("DSV4MOE_CPU_NO_SIMD");
    b->avx512 = b->simd && cpu_has_avx512() && !getenv("DSV4MOE_CPU_NO_AVX512");
    b->bf16dot = b->avx512 && cpu_has_avx512bf16() && !getenv("DSV4MOE_CPU_NO_BF16");
    b->k4 = b->bf16dot && cpu_has_avx512vbmi() && !getenv("DSV4MOE_CPU_NO_VBMI");
    pthread_once(&table_once, init_tables);
}

/* Exposed to tests/test_cpu.c through a prototype there: the fused decode-dot that a forward
   would run here (same kernel choice) of all rows of m against n <= 16 activation rows X [n, k]:
   C[q * m->n + j]. Returns 1 when out of memory, else 0. */
int dsv4_cpu_fused_dot_for_test(const dsv4_matrix_view *m, int64_t n, const float *X, float *C);
int dsv4_cpu_fused_dot_for_test(const dsv4_matrix_view *m, int64_t n, const float *X, float *C)
{
    cpu_be b;
    memset(&b, 0, sizeof b);
    pick_kernels(&b);
    float *scr = malloc((size_t)(SMALL_ROWS * m->k) * sizeof *scr), *row = malloc((size_t)m->k * sizeof *row);
    if (!scr || !row || n > FUSED_ROWS) {
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

static dsv4_backend_stats cpu_stats(const void *p)
{
    const cpu_be *b = p;
    dsv4_backend_stats s = b->stats;
    s.workspace_peak = dsv4_allocator_stats(b->ws).peak;
    return s;
}

static void cpu_free(void *p)
{
    cpu_be *b = p;
    if (!b)
        return;
    for (int i = 0; i < NBUF; i++)
        dsv4_release(b->ws, b->buf[i].p);
    if (b->experts) {
        for (int64_t i = 0; i < 3 * b->cfg.n_routed_experts; i++) {
            dsv4_release(b->persist, b->experts[i].own_q);
            dsv4_release(b->persist, b->experts[i].own_s);
        }
        dsv4_release(b->persist, b->experts);
    }
    for (int i = 0; i < 3; i++) {
        dsv4_release(b->persist, b->shared[i].own_q);
        dsv4_release(b->persist, b->shared[i].own_s);
    }
    dsv4_router_tensors_release(&b->rt, b->persist);
    dsv4_allocator_free(b->ws);
    dsv4_allocator_free(b->persist);
    free(b);
}

static const dsv4_backend_vtable cpu_vtable = {"cpu", cpu_forward, cpu_stats, cpu_free, NULL};

/* A bf16 (stacked) matrix under a quantized config: quantized here exactly as the reference does. */
static dsv4_status quantize_at_load(cpu_be *b, dsv4_weight_format fmt, cmat *m, dsv4_error *err)
{
    int64_t n = m->v.n, k = m->v.k;
    float *w = dsv4_alloc(b->persist, (size_t)(n * k) * sizeof *w);
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load");
    dsv4_matrix_dequant_rows(&m->v, 0, n, w);
    dsv4_status st;
    if (fmt == DSV4_FORMAT_FP8) {
        size_t ssz = b->cfg.weight_scale == DSV4_SCALE_FP32 ? 4 : 1;
        m->own_q = dsv4_alloc(b->persist, (size_t)(n * k));
        m->own_s = dsv4_alloc(b->persist, (size_t)(cdiv(n, 128) * cdiv(k, 128)) * ssz);
        st = !m->own_q || !m->own_s ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                                    : dsv4_quant_fp8_block(w, n, k, b->cfg.weight_scale, m->own_q, m->own_s,
                                                           m->v.key, err);
        m->v.row_bytes = (uint64_t)k;
        m->v.scale_format = b->cfg.weight_scale;
    } else {
        m->own_q = dsv4_alloc(b->persist, (size_t)(n * k / 2));
        m->own_s = dsv4_alloc(b->persist, (size_t)(n * (k / 32)));
        st = !m->own_q || !m->own_s ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                                    : dsv4_quant_fp4_block(w, n, k, m->own_q, m->own_s, m->v.key, err);
        m->v.row_bytes = (uint64_t)k / 2;
    }
    dsv4_release(b->persist, w);
    if (st == DSV4_OK) {
        m->v.format = fmt;
        m->v.data = m->own_q;
        m->v.scales = m->own_s;
    }
    return st;
}

static dsv4_status bind(cpu_be *b, const dsv4_checkpoint *ck, int64_t e, int p, cmat *m, dsv4_error *err)
{
    dsv4_status st = dsv4_weights_matrix(ck, &b->cfg, e, (dsv4_proj)p, &m->v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? b->cfg.shared_format : b->cfg.routed_format;
    return m->v.format != want ? quantize_at_load(b, want, m, err) : DSV4_OK;
}

dsv4_status dsv4_cpu_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, int threads, void **impl,
                                    const dsv4_backend_vtable **vt, dsv4_error *err)
{
    const dsv4_config *cfg = dsv4_plan_config(plan);
    dsv4_router_kind rk = dsv4_plan_router(plan);
    if (rk != DSV4_ROUTER_LOCAL)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend cpu",
                           "router %s is not supported by the cpu backend (it runs router local on one rank; the "
                           "distributed routers run through fast/dist)",
                           dsv4_router_kind_name(rk));
    if (dsv4_plan_expert_count(plan) != cfg->n_routed_experts || dsv4_plan_inter_count(plan) != cfg->moe_inter_dim)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend cpu",
                           "the plan shards the layer (experts %lld of %lld, inter %lld of %lld): the cpu backend "
                           "runs the whole layer on one rank (tp 1, ep 1)",
                           (long long)dsv4_plan_expert_count(plan), (long long)cfg->n_routed_experts,
                           (long long)dsv4_plan_inter_count(plan), (long long)cfg->moe_inter_dim);
    dsv4_status st = dsv4_config_validate(cfg, err);
    if (st)
        return st;
    cpu_be *b = calloc(1, sizeof *b);
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "backend cpu", "out of memory");
    b->cfg = *cfg;
    /* The plan sized the per-worker scratch for host_threads workers. */
    int planned = dsv4_plan_topology(plan)->host_threads;
    b->threads = threads < (planned > 0 ? planned : 1) ? threads : (planned > 0 ? planned : 1);
    b->chunk = dsv4_plan_chunk_tokens(plan);
    b->max_tokens = dsv4_plan_topology(plan)->max_tokens_per_rank;
    if (b->chunk < 1)
        b->chunk = b->max_tokens > 0 ? b->max_tokens : 128;
    if (DSV4_FAULT(DSV4_FAULT_F08))
        b->chunk = b->max_tokens; /* fault F08: long prefills unchunked, no token bound */
    pick_kernels(b);
    b->stats.workspace_planned = dsv4_plan_workspace_max(plan);
    atomic_init(&b->nomem, 0);
    if ((st = dsv4_allocator_create(0, &b->persist, err)) || (st = dsv4_allocator_create(0, &b->ws, err)))
        goto fail;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts;
    if ((st = dsv4_router_tensors_load(ck, c, b->persist, &b->rt, err)))
        goto fail;
    b->experts = dsv4_alloc(b->persist, (size_t)(3 * E) * sizeof *b->experts);
    if (!b->experts)
        goto nomem;
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < 3; p++)
            if ((st = bind(b, ck, e, p, &b->experts[3 * e + p], err)))
                goto fail;
    if (c->n_shared_experts > 0)
        for (int p = 0; p < 3; p++)
            if ((st = bind(b, ck, DSV4_SHARED_EXPERT, p, &b->shared[p], err)))
                goto fail;
    *impl = b;
    *vt = &cpu_vtable;
    return DSV4_OK;
nomem:
    st = dsv4_seterr(err, DSV4_ERR_NOMEM, "backend cpu", "out of memory binding layer %lld", (long long)c->layer);
fail:
    cpu_free(b);
    return st;
}
