/*
 * Internal: the fp32 <-> bit-pattern casts the number formats (core/formats.c) and the CPU
 * kernels (fast/cpu/kernels/kutil.h) work with; memcpy, so no aliasing rule is broken and the
 * compiler emits a register move. Also the integer-exact ue8m0 helpers of SPEC.md section 5 that
 * the host (core/formats.c) and the device (fast/cuda/kernels.cuh) both run, and the e4m3
 * encoding the host runs and the device test holds the hardware conversion to: one copy, compiled
 * as static inline C and, under nvcc, as __host__ __device__ functions, so the two sides cannot
 * drift apart.
 */
#ifndef DSV4MOE_CORE_BITS_H
#define DSV4MOE_CORE_BITS_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DSV4_HD static __host__ __device__ __forceinline__
#else
#define DSV4_HD static inline
#endif

/* fp32 <-> its bit pattern: the device's reinterpreting intrinsics; on the host a memcpy, which
   keeps the aliasing rule and compiles to a register move. */
#ifdef __CUDA_ARCH__
DSV4_HD uint32_t dsv4_f32_bits(float x) { return __float_as_uint(x); }
DSV4_HD float dsv4_f32_from_bits(uint32_t u) { return __uint_as_float(u); }
#else
DSV4_HD uint32_t dsv4_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
DSV4_HD float dsv4_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
#endif

/* fp32 -> bf16 bits, round to nearest even (SPEC.md section 5); a NaN keeps a quiet payload
   (truncating one could leave an all-zero payload, = Inf). A carry into the exponent is the
   correct rounding, Inf included. */
DSV4_HD uint16_t dsv4_bf16_bits(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* The ue8m0 scale byte b as fp32: 2^(b - 127), NaN for 255 (b = 0 is 2^-127, an fp32 subnormal:
   only the top mantissa bit). */
DSV4_HD float dsv4_ue8m0_decode(uint32_t b)
{
    if (b == 255u)
        return dsv4_f32_from_bits(0x7FC00000u);
    return dsv4_f32_from_bits(b ? b << 23 : 0x00400000u);
}

/* 2^(127 - b) for b in [0, 254]: the exact reciprocal of the scale (2^-127 is a subnormal). */
DSV4_HD float dsv4_ue8m0_inverse(uint32_t b)
{
    uint32_t e = 254u - b;
    return dsv4_f32_from_bits(e ? e << 23 : 0x00400000u);
}

/* Positive finite nonzero magnitude bits a = m * 2^e with m in [2^23, 2^24); returns e. */
DSV4_HD int dsv4_f32_split(uint32_t a, uint32_t *m)
{
    int e = (int)(a >> 23);
    uint32_t f = a & 0x7FFFFFu;
    if (e) {
        *m = f | 0x800000u;
        return e - 150;
    }
    e = -149;
    while (!(f & 0x800000u)) {
        f <<= 1;
        e--;
    }
    *m = f;
    return e;
}

/*
 * The ue8m0 scale byte of a positive finite amax (bits ua, already floored) for a positive finite
 * limit (bits ul): with amax = ma * 2^ea and limit = ml * 2^el (both significands normalised to
 * [2^23, 2^24)), amax <= limit * 2^k holds first at k = ea - el when ma <= ml, else at
 * k = ea - el + 1: integer-exact, no division, no log2. Clamped to [0, 254].
 */
DSV4_HD uint32_t dsv4_ue8m0_exponent(uint32_t ua, uint32_t ul)
{
    uint32_t ma, ml;
    int ea = dsv4_f32_split(ua, &ma);
    int el = dsv4_f32_split(ul, &ml);
    int b = ea - el + (ma > ml) + 127;
    return (uint32_t)(b < 0 ? 0 : b > 254 ? 254 : b);
}


/*
 * fp32 -> e4m3fn code (SPEC.md section 5): ties to even, |x| >= 448 and Inf saturate to 448, NaN
 * to 0x7F with its sign. One formula for normals and subnormals: t holds the significand aligned
 * so that a right shift by sh leaves the e4m3 code (exponent field and mantissa) in units of the
 * target's last place; the shift rounds to nearest even. Normals (fp32 exponent >= 121, i.e.
 * >= 2^-6) rebias and drop 20 bits; below that the explicit significand is shifted further, and
 * anything under 2^-10 (sh capped at 31 to stay defined) rounds to zero. A carry out of the
 * mantissa moves to the next binade by itself. Selects rather than branches, because this runs
 * over every weight of a checkpoint. The device quantizers use the hardware conversion instead;
 * tests/cuda/e4m3_hw.cu holds it to this one on every input.
 */
DSV4_HD uint8_t dsv4_e4m3_bits(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t e = a >> 23;
    uint32_t normal = e >= 121u;
    uint32_t t = normal ? a - (120u << 23) : (a & 0x7FFFFFu) | 0x800000u;
    uint32_t sh = normal ? 20u : (141u - e > 31u ? 31u : 141u - e);
    uint32_t r = (t + (1u << (sh - 1u)) - 1u + ((t >> sh) & 1u)) >> sh;
    r = a >= 0x43E00000u ? 0x7Eu : r; /* >= 448, Inf too: saturate */
    r = a > 0x7F800000u ? 0x7Fu : r;
    return (uint8_t)(((u >> 24) & 0x80u) | r);
}

#endif
