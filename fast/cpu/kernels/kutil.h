/*
 * Scalar helpers of the CPU backend and its kernels (internal): bit casts, bf16 rounding and
 * the ue8m0 decode bit-identical to core/formats.c, a view's row and scale pointers, and the
 * fixed-order four-sum dot product the scalar paths share.
 */
#ifndef DSV4MOE_FAST_CPU_KUTIL_H
#define DSV4MOE_FAST_CPU_KUTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

/* a . b in fp32 over four fixed partial sums, ((s0 + s1) + (s2 + s3)): the scalar paths' one order. */
static inline float dot4(const float *a, const float *b, int64_t n)
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

#endif
