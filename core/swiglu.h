/*
 * Internal: SPEC.md section 4, step 3, the SwiGLU clamp of one (g, u) pair of bf16 values: g from
 * above, u on both sides, to the limit L > 0; each clamped value counted (the clamp statistics).
 * One copy for the reference (ref/ref.c) and the cpu backend's scalar path (fast/cpu/ffn.c); no
 * arithmetic, so the reference's bit-reproducibility does not depend on how it is compiled.
 */
#ifndef DSV4MOE_CORE_SWIGLU_H
#define DSV4MOE_CORE_SWIGLU_H

#include <stdint.h>

static inline void dsv4_swiglu_clamp(float *g, float *u, float L, uint64_t *gc, uint64_t *uc)
{
    if (*g > L) {
        *g = L;
        (*gc)++;
    }
    if (*u > L || *u < -L) {
        *u = *u > L ? L : -L;
        (*uc)++;
    }
}

#endif
