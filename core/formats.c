/*
 * Number formats (SPEC.md section 5).
 *
 * Every encoder works on the IEEE bit pattern with integer arithmetic, so the
 * result never depends on the floating-point rounding mode, on flush-to-zero
 * or on libm. The only fp32 arithmetic left is what the contract itself
 * defines in fp32: the fp32 scale amax / 448, the division by it, and the
 * decode(q) * scale products; with fp32 scales these round (in the default
 * round-to-nearest mode the library expects). Products by a power-of-two
 * ue8m0 scale or its reciprocal are exact, except a result below the fp32
 * normal range, which is far under half the smallest e4m3/e2m1 step and so
 * encodes to zero whichever way it rounded: the ue8m0 paths are bit-identical
 * under any rounding mode.
 */
#include <math.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "core/bits.h"
#include "core/err.h"

#define F32_ABS_MASK 0x7FFFFFFFu
#define F32_INF_BITS 0x7F800000u
#define F32_QNAN_BITS 0x7FC00000u


/* ---- bf16 ---- */

/* core/bits.h's, shared with the cpu kernels and the cuda kernels. */
uint16_t dsv4_f32_to_bf16(float x) { return dsv4_bf16_bits(x); }

float dsv4_bf16_to_f32(uint16_t b) { return dsv4_f32_from_bits((uint32_t)b << 16); }

float dsv4_round_bf16(float x) { return dsv4_bf16_to_f32(dsv4_f32_to_bf16(x)); }

/* ---- fp8 e4m3fn ---- */

/* Magnitude bits of e4m3 code c (0..0x7F) as fp32: normals rebias 7 -> 127; subnormals m * 2^-9. */
#define E4M3_SUB(m)                                                                                       \
    ((m) == 0   ? 0u                                                                                      \
     : (m) == 1 ? 0x3B000000u /* 2^-9 */                                                                  \
     : (m) == 2 ? 0x3B800000u /* 2^-8 */                                                                  \
     : (m) == 3 ? 0x3BC00000u /* 1.5 * 2^-8 */                                                            \
     : (m) == 4 ? 0x3C000000u /* 2^-7 */                                                                  \
     : (m) == 5 ? 0x3C200000u /* 1.25 * 2^-7 */                                                           \
     : (m) == 6 ? 0x3C400000u /* 1.5 * 2^-7 */                                                            \
                : 0x3C600000u /* 1.75 * 2^-7 */)
#define E4M3_MAG(c)                                                                                       \
    ((c) == 0x7F ? F32_QNAN_BITS : (c) >= 8 ? ((((c) >> 3) + 120u) << 23) | (((c)&7u) << 20) : E4M3_SUB(c))
#define E4M3_BITS(c) ((((c)&0x80u) << 24) | E4M3_MAG((c)&0x7Fu))
#define E4M3_R4(c) E4M3_BITS(c), E4M3_BITS((c) + 1u), E4M3_BITS((c) + 2u), E4M3_BITS((c) + 3u)
#define E4M3_R16(c) E4M3_R4(c), E4M3_R4((c) + 4u), E4M3_R4((c) + 8u), E4M3_R4((c) + 12u)
#define E4M3_R64(c) E4M3_R16(c), E4M3_R16((c) + 16u), E4M3_R16((c) + 32u), E4M3_R16((c) + 48u)

/* A constant table (not filled at run time) so that decoding needs no initialisation or locking. */
static const uint32_t e4m3_lut[256] = {E4M3_R64(0u), E4M3_R64(64u), E4M3_R64(128u), E4M3_R64(192u)};

static inline float e4m3_decode(uint8_t c) { return dsv4_f32_from_bits(e4m3_lut[c]); }

float dsv4_e4m3_to_f32(uint8_t code) { return e4m3_decode(code); }

uint8_t dsv4_f32_to_e4m3(float x) { return dsv4_e4m3_bits(x); }

/* ---- fp4 e2m1 ---- */

static const float e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline float e2m1_decode(uint8_t n) { return e2m1_lut[n & 0xFu]; }

float dsv4_e2m1_to_f32(uint8_t nibble) { return e2m1_decode(nibble); }

/*
 * The code is the number of midpoints below |x|. Comparing magnitude bits as
 * integers is exact and orders every non-negative float; ">" at a midpoint
 * whose lower code is even and ">=" where the upper one is even gives ties to
 * the even code. NaN bits exceed every threshold, so NaN lands on 7 (+6) as
 * the header documents.
 */
static inline uint8_t e2m1_encode(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    uint32_t a = u & F32_ABS_MASK;
    uint32_t r = (uint32_t)(a > 0x3E800000u)    /* 0.25 -> 0 */
                 + (uint32_t)(a >= 0x3F400000u) /* 0.75 -> 2 */
                 + (uint32_t)(a > 0x3FA00000u)  /* 1.25 -> 2 */
                 + (uint32_t)(a >= 0x3FE00000u) /* 1.75 -> 4 */
                 + (uint32_t)(a > 0x40200000u)  /* 2.5 -> 4 */
                 + (uint32_t)(a >= 0x40600000u) /* 3.5 -> 6 */
                 + (uint32_t)(a > 0x40A00000u); /* 5 -> 6 */
    uint32_t sign = a > F32_INF_BITS ? 0u : (u >> 28) & 8u;
    return (uint8_t)(sign | r);
}

uint8_t dsv4_f32_to_e2m1(float x) { return e2m1_encode(x); }

/* ---- ue8m0 ---- */

/* The ue8m0 helpers (decode, reciprocal, the scale's exponent) are core/bits.h's, shared with the
   cuda kernels. */
float dsv4_ue8m0_to_f32(uint8_t b) { return dsv4_ue8m0_decode(b); }

/*
 * dsv4_ue8m0_exponent (core/bits.h) of amax floored at DSV4_AMAX_FLOOR: integer-exact.
 * A limit that is not positive and finite has no meaningful scale: 255 (NaN).
 */
uint8_t dsv4_ue8m0_scale_for(float amax, float limit)
{
    uint32_t ua = dsv4_f32_bits(amax), ul = dsv4_f32_bits(limit);
    if ((ua & F32_ABS_MASK) > F32_INF_BITS)
        return 255;
    if (ul - 1u >= F32_INF_BITS - 1u) /* ul == 0 (+0), negative, Inf or NaN */
        return 255;
    if (ua == F32_INF_BITS)
        return 254;
    if (!(amax >= DSV4_AMAX_FLOOR)) /* negatives (even -Inf) and -0 too: max(amax, floor) */
        ua = dsv4_f32_bits(DSV4_AMAX_FLOOR);
    return (uint8_t)dsv4_ue8m0_exponent(ua, ul);
}

/* ---- weight quantizers ---- */

static dsv4_status check_args(const float *w, int64_t n, int64_t k, const void *q, const void *scales,
                              const char *name, dsv4_error *err)
{
    const char *where = name ? name : "weight";
    if (n < 0 || k < 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "bad shape [%lld, %lld]: dims must be >= 0",
                           (long long)n, (long long)k);
    if (!w || !q || !scales)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "NULL %s passed to the quantizer",
                           !w ? "weights" : !q ? "code buffer" : "scale buffer");
    return DSV4_OK;
}

/*
 * Called once a region is known to hold a non-finite value: rows [r0, r1) of
 * w, row-major, are scanned from the left so the report names the first one.
 * Callers guarantee that every earlier element in row-major order is finite.
 */
static dsv4_status report_nonfinite(const float *w, int64_t k, int64_t r0, int64_t r1, const char *name,
                                    dsv4_error *err)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < k; c++) {
            float v = w[r * k + c];
            if ((dsv4_f32_bits(v) & F32_ABS_MASK) >= F32_INF_BITS)
                return dsv4_seterr(err, DSV4_ERR_NUMERIC, name ? name : "weight",
                                   "element [%lld, %lld] is %.9g; weights to quantize must be finite",
                                   (long long)r, (long long)c, (double)v);
        }
    return dsv4_seterr(err, DSV4_ERR_INTERNAL, name ? name : "weight", "non-finite value vanished");
}

/* max |w| over a region as magnitude bits: integer max orders non-negative floats, and any
 * non-finite value makes the result >= F32_INF_BITS. */
static inline uint32_t amax_bits(const float *w, int64_t stride, int64_t rows, int64_t cols)
{
    uint32_t m = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *p = w + r * stride;
        for (int64_t c = 0; c < cols; c++) {
            uint32_t a = dsv4_f32_bits(p[c]) & F32_ABS_MASK;
            m = a > m ? a : m;
        }
    }
    return m;
}

dsv4_status dsv4_quant_fp8_block(const float *w, int64_t n, int64_t k, dsv4_scale_format scale_format,
                                 uint8_t *q, void *scales, const char *name, dsv4_error *err)
{
    dsv4_status st = check_args(w, n, k, q, scales, name, err);
    if (st)
        return st;
    if (scale_format != DSV4_SCALE_UE8M0 && scale_format != DSV4_SCALE_FP32)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, name ? name : "weight", "unknown scale format %d",
                           (int)scale_format);
    const int64_t B = DSV4_FP8_BLOCK;
    int64_t nb_k = (k + B - 1) / B;
    for (int64_t r0 = 0; r0 < n; r0 += B) {
        int64_t rows = n - r0 < B ? n - r0 : B;
        /* One block at a time: 128 x 128 fp32 (64 KiB) stays in cache between the two passes. */
        for (int64_t bk = 0; bk < nb_k; bk++) {
            int64_t c0 = bk * B, cols = k - c0 < B ? k - c0 : B;
            const float *wb = w + r0 * k + c0;
            uint32_t mb = amax_bits(wb, k, rows, cols);
            if (mb >= F32_INF_BITS)
                return report_nonfinite(w, k, r0, r0 + rows, name, err);
            float amax = dsv4_f32_from_bits(mb);
            amax = amax < DSV4_AMAX_FLOOR ? DSV4_AMAX_FLOOR : amax;
            int64_t si = (r0 / B) * nb_k + bk;
            uint8_t *qb = q + r0 * k + c0;
            if (scale_format == DSV4_SCALE_UE8M0) {
                uint8_t b = dsv4_ue8m0_scale_for(amax, DSV4_E4M3_MAX);
                ((uint8_t *)scales)[si] = b;
                /* w * 2^(127-b) equals w / 2^(b-127) exactly, and is cheaper. */
                float inv = dsv4_ue8m0_inverse(b);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++)
                        qb[r * k + c] = dsv4_e4m3_bits(wb[r * k + c] * inv);
            } else {
                float s = amax / DSV4_E4M3_MAX;
                ((float *)scales)[si] = s;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++)
                        qb[r * k + c] = dsv4_e4m3_bits(wb[r * k + c] / s);
            }
        }
    }
    return DSV4_OK;
}

dsv4_status dsv4_quant_fp4_block(const float *w, int64_t n, int64_t k, uint8_t *q, uint8_t *scales,
                                 const char *name, dsv4_error *err)
{
    dsv4_status st = check_args(w, n, k, q, scales, name, err);
    if (st)
        return st;
    const int64_t G = DSV4_FP4_GROUP;
    if (k % G)
        return dsv4_seterr(err, DSV4_ERR_SHAPE, name ? name : "weight",
                           "fp4 needs K a multiple of %d, got [%lld, %lld]", (int)G, (long long)n,
                           (long long)k);
    int64_t ng = k / G;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t g = 0; g < ng; g++) {
            const float *wg = w + r * k + g * G;
            uint32_t mb = amax_bits(wg, 0, 1, G);
            /* Groups run in row-major order, so the first non-finite is in this row. */
            if (mb >= F32_INF_BITS)
                return report_nonfinite(w, k, r, r + 1, name, err);
            float amax = dsv4_f32_from_bits(mb);
            uint8_t b = dsv4_ue8m0_scale_for(amax, DSV4_E2M1_MAX);
            scales[r * ng + g] = b;
            float inv = dsv4_ue8m0_inverse(b);
            uint8_t *qg = q + (r * k + g * G) / 2;
            for (int64_t j = 0; j < G; j += 2)
                qg[j / 2] = (uint8_t)(e2m1_encode(wg[j] * inv) | (e2m1_encode(wg[j + 1] * inv) << 4));
        }
    }
    return DSV4_OK;
}

/* ---- dequantizers ---- */

/* Rows beyond n are not read: the range is clipped to [0, n). */
static void clip_rows(int64_t n, int64_t *n0, int64_t *rows)
{
    if (*n0 < 0) {
        *rows += *n0;
        *n0 = 0;
    }
    if (*rows > n - *n0)
        *rows = n - *n0;
}

void dsv4_dequant_fp8_rows(const uint8_t *q, const void *scales, dsv4_scale_format scale_format, int64_t n,
                           int64_t k, int64_t n0, int64_t rows, float *out)
{
    if (!q || !scales || !out || k <= 0)
        return;
    clip_rows(n, &n0, &rows);
    const int64_t B = DSV4_FP8_BLOCK;
    int64_t nb_k = (k + B - 1) / B;
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = n0 + r;
        const uint8_t *qr = q + row * k;
        float *o = out + r * k;
        for (int64_t bk = 0; bk < nb_k; bk++) {
            int64_t si = (row / B) * nb_k + bk;
            /* fp32 scales may sit at any offset of a mapped file: load them bytewise. */
            float s;
            if (scale_format == DSV4_SCALE_FP32)
                memcpy(&s, (const uint8_t *)scales + 4 * si, sizeof s);
            else
                s = dsv4_ue8m0_to_f32(((const uint8_t *)scales)[si]);
            int64_t c1 = (bk + 1) * B < k ? (bk + 1) * B : k;
            for (int64_t c = bk * B; c < c1; c++)
                o[c] = e4m3_decode(qr[c]) * s;
        }
    }
}

void dsv4_dequant_fp4_rows(const uint8_t *q, const uint8_t *scales, int64_t n, int64_t k, int64_t n0,
                           int64_t rows, float *out)
{
    if (!q || !scales || !out || k <= 0 || k % DSV4_FP4_GROUP)
        return;
    clip_rows(n, &n0, &rows);
    const int64_t G = DSV4_FP4_GROUP, ng = k / G;
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = n0 + r;
        const uint8_t *qr = q + row * (k / 2);
        const uint8_t *sr = scales + row * ng;
        float *o = out + r * k;
        for (int64_t g = 0; g < ng; g++) {
            float s = dsv4_ue8m0_to_f32(sr[g]);
            for (int64_t j = g * G; j < (g + 1) * G; j += 2) {
                uint8_t byte = qr[j / 2];
                o[j] = e2m1_decode(byte & 0xFu) * s;
                o[j + 1] = e2m1_decode(byte >> 4) * s;
            }
        }
    }
}

void dsv4_dequant_bf16_rows(const uint16_t *w, int64_t k, int64_t n0, int64_t rows, float *out)
{
    if (!w || !out || k <= 0 || rows <= 0 || n0 < 0)
        return;
    const uint16_t *src = w + n0 * k;
    for (int64_t i = 0; i < rows * k; i++)
        out[i] = dsv4_bf16_to_f32(src[i]);
}

/* ---- activation quantizer ---- */

/*
 * Every NaN this writes (x NaN; Inf / Inf or 0 * Inf with an fp32 scale of
 * Inf) is the quiet NaN with the sign of x, never one produced by arithmetic:
 * the sign of a generated NaN differs between CPUs (x86's default NaN is
 * negative, ARM's positive, RISC-V's canonical), and the reference must not.
 */
static inline void act_store(float xi, uint8_t c, float s, float *out, uint8_t *code)
{
    uint32_t sign = dsv4_f32_bits(xi) & 0x80000000u;
    if ((c & 0x7Fu) == 0x7Fu)
        c = (uint8_t)((sign >> 24) | 0x7Fu);
    float o = e4m3_decode(c) * s;
    *out = (dsv4_f32_bits(o) & F32_ABS_MASK) > F32_INF_BITS ? dsv4_f32_from_bits(sign | F32_QNAN_BITS) : o;
    if (code)
        *code = c;
}

/*
 * Choices the header leaves open:
 * - NaN: amax ignores NaN elements, so a NaN changes neither the group's
 *   scale nor any other element's value; the NaN element itself gets code
 *   0x7F | sign(x) and out NaN.
 * - Inf: counted in amax. UE8M0: scale_for(Inf) = 254, so s = 2^127, the Inf
 *   element saturates to 448 * 2^127 = Inf and the finite ones are quantized
 *   against that scale (all but the huge ones become 0).
 *   FP32: s = Inf, so by the definition every out of the group is NaN
 *   (0 * Inf, Inf / Inf); finite elements keep code 0, Inf ones get 0x7F.
 * - The clamp to +-448 is the saturation built into dsv4_e4m3_bits (which also
 *   keeps NaN), so no separate clamp is needed.
 * - NONE copies x to out and leaves codes and scales untouched.
 */
void dsv4_act_quant_row(const float *x, int64_t k, dsv4_act_quant mode, float *out, uint8_t *codes,
                        float *scales)
{
    if (!x || !out || k <= 0)
        return;
    if (mode == DSV4_ACT_QUANT_NONE) {
        if (out != x)
            memmove(out, x, (size_t)k * sizeof *out);
        return;
    }
    const int64_t B = DSV4_FP8_BLOCK;
    for (int64_t g0 = 0; g0 < k; g0 += B) {
        int64_t len = k - g0 < B ? k - g0 : B;
        uint32_t mb = 0;
        for (int64_t i = 0; i < len; i++) {
            uint32_t a = dsv4_f32_bits(x[g0 + i]) & F32_ABS_MASK;
            a = a > F32_INF_BITS ? 0u : a;
            mb = a > mb ? a : mb;
        }
        float amax = dsv4_f32_from_bits(mb);
        amax = amax < DSV4_AMAX_FLOOR ? DSV4_AMAX_FLOOR : amax;
        float s;
        if (mode == DSV4_ACT_QUANT_UE8M0) {
            uint8_t b = dsv4_ue8m0_scale_for(amax, DSV4_E4M3_MAX);
            s = dsv4_ue8m0_to_f32(b);
            /* x * 2^(127-b) equals x / s exactly. */
            float inv = dsv4_ue8m0_inverse(b);
            for (int64_t i = g0; i < g0 + len; i++) {
                float xi = x[i]; /* read before the store: out may alias x */
                act_store(xi, dsv4_e4m3_bits(xi * inv), s, out + i, codes ? codes + i : NULL);
            }
        } else {
            s = amax / DSV4_E4M3_MAX;
            for (int64_t i = g0; i < g0 + len; i++) {
                float xi = x[i];
                act_store(xi, dsv4_e4m3_bits(xi / s), s, out + i, codes ? codes + i : NULL);
            }
        }
        if (scales)
            scales[g0 / B] = s;
    }
}

void dsv4_fp8_to_e4m3_128(const uint8_t *q, uint64_t row_bytes, const void *scales, dsv4_scale_format scale_format,
                          int64_t n, int64_t k, uint8_t *dst, uint64_t dst_row_bytes, float *dst_scales, int64_t s_kb,
                          int64_t s_row)
{
    dsv4_fp8_to_e4m3_blocks(q, row_bytes, scales, scale_format, n, k, 1, dst, dst_row_bytes, dst_scales, s_kb, s_row);
}

void dsv4_fp8_to_e4m3_blocks(const uint8_t *q, uint64_t row_bytes, const void *scales, dsv4_scale_format scale_format,
                             int64_t n, int64_t k, int64_t block_rows, uint8_t *dst, uint64_t dst_row_bytes,
                             float *dst_scales, int64_t s_kb, int64_t s_row)
{
    const int64_t kbs = k / 128, sk = (k + 127) / 128;
    for (int64_t r = 0; r < n; r++) {
        memcpy(dst + (uint64_t)r * dst_row_bytes, q + (uint64_t)r * row_bytes, (size_t)k);
        if (r % block_rows)
            continue; /* a block's scale is its first row's (every row of it has the same) */
        for (int64_t kb = 0; kb < kbs; kb++) {
            const int64_t i = (r / 128) * sk + kb;
            dst_scales[kb * s_kb + (r / block_rows) * s_row] =
                scale_format == DSV4_SCALE_FP32 ? ((const float *)scales)[i]
                                                : dsv4_ue8m0_to_f32(((const uint8_t *)scales)[i]);
        }
    }
}

/* Whether a 128-group's four ue8m0 bytes convert to one e4m3 scale exactly (formats.h); *hi gets
   the largest byte. */
static bool fp4_group_converts(const uint8_t *s4, int *hi_out)
{
    int lo = 255, hi = 0;
    for (int j = 0; j < 4; j++) {
        lo = s4[j] < lo ? s4[j] : lo;
        hi = s4[j] > hi ? s4[j] : hi;
    }
    *hi_out = hi;
    return hi != 255 && hi - lo <= DSV4_FP4_TO_FP8_SPREAD;
}

int64_t dsv4_fp4_scales_beyond_e4m3(const uint8_t *scales, int64_t n, int64_t k)
{
    const int64_t ng = k / DSV4_FP4_GROUP;
    int64_t bad = 0;
    int hi;
    for (int64_t r = 0; r < n; r++)
        for (int64_t kb = 0; kb < k / 128; kb++)
            bad += !fp4_group_converts(scales + r * ng + kb * 4, &hi);
    return bad;
}

int64_t dsv4_fp4_to_e4m3_128(const uint8_t *q, uint64_t row_bytes, const uint8_t *scales, int64_t n, int64_t k,
                             uint8_t *dst, uint64_t dst_row_bytes, float *dst_scales, int64_t s_kb, int64_t s_row,
                             int64_t *first_row, int64_t *first_group)
{
    return dsv4_fp4_to_e4m3_blocks(q, row_bytes, scales, n, k, 1, dst, dst_row_bytes, dst_scales, s_kb, s_row, first_row,
                                   first_group);
}

int64_t dsv4_fp4_to_e4m3_blocks(const uint8_t *q, uint64_t row_bytes, const uint8_t *scales, int64_t n, int64_t k,
                                int64_t block_rows, uint8_t *dst, uint64_t dst_row_bytes, float *dst_scales,
                                int64_t s_kb, int64_t s_row, int64_t *first_row, int64_t *first_group)
{
    /* e4m3 code of e2m1 nibble v (low 3 bits: magnitude) times 2^d, d in [-8, 6], built once */
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    uint8_t code[15][8];
    for (int d = -8; d <= 6; d++)
        for (int m = 0; m < 8; m++)
            code[d + 8][m] = dsv4_f32_to_e4m3(ldexpf(mag[m], d));
    const int64_t kbs = k / 128, ng = k / DSV4_FP4_GROUP;
    int64_t bad = 0;
    for (int64_t r0 = 0; r0 < n; r0 += block_rows) {
        const int64_t r1 = r0 + block_rows < n ? r0 + block_rows : n;
        for (int64_t kb = 0; kb < kbs; kb++) {
            /* the block's scale bytes: rows r0 .. r1 - 1, four per row */
            int hi = 0;
            bool ok = true;
            for (int64_t r = r0; r < r1 && ok; r++) {
                int h;
                ok = fp4_group_converts(scales + r * ng + kb * 4, &h);
                hi = h > hi ? h : hi;
            }
            for (int64_t r = r0; r < r1 && ok; r++)
                for (int j = 0; j < 4; j++)
                    ok = ok && hi - scales[r * ng + kb * 4 + j] <= DSV4_FP4_TO_FP8_SPREAD;
            float *sc = &dst_scales[kb * s_kb + (r0 / block_rows) * s_row];
            if (!ok) {
                if (bad++ == 0) {
                    if (first_row)
                        *first_row = r0;
                    if (first_group)
                        *first_group = kb;
                }
                for (int64_t r = r0; r < r1; r++)
                    memset(dst + (uint64_t)r * dst_row_bytes + kb * 128, 0, 128);
                *sc = NAN;
                continue;
            }
            *sc = ldexpf(1.0f, hi - 133); /* 2^-133 at least: an fp32 subnormal, exact */
            for (int64_t r = r0; r < r1; r++) {
                const uint8_t *qr = q + (uint64_t)r * row_bytes, *s4 = scales + r * ng + kb * 4;
                uint8_t *o = dst + (uint64_t)r * dst_row_bytes;
                for (int j = 0; j < 4; j++) {
                    const uint8_t *c = code[s4[j] - hi + 6 + 8];
                    for (int64_t e = kb * 128 + j * 32; e < kb * 128 + j * 32 + 32; e += 2) {
                        const uint8_t byte = qr[e / 2];
                        for (int h = 0; h < 2; h++) {
                            const uint8_t nib = (uint8_t)(h ? byte >> 4 : byte & 0xFu);
                            o[e + h] = (uint8_t)(c[nib & 7u] | ((nib & 8u) ? 0x80u : 0u));
                        }
                    }
                }
            }
        }
    }
    return bad;
}
