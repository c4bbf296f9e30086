/*
 * Internal: the fp32 <-> bit-pattern casts the number formats (core/formats.c) and the CPU
 * kernels (fast/cpu/kernels/kutil.h) work with; memcpy, so no aliasing rule is broken and the
 * compiler emits a register move.
 */
#ifndef DSV4MOE_CORE_BITS_H
#define DSV4MOE_CORE_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t dsv4_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float dsv4_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
