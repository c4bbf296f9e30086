/*
 * dsv4moe: counter-based deterministic random numbers.
 *
 * A value is a pure function of (seed, stream name, element index): any
 * element of any tensor can be produced alone, in any order, on any number
 * of threads, and always gives the same bits. Only integer arithmetic and
 * exact float operations are used, so the values are identical on every
 * machine and compiler.
 */
#ifndef DSV4MOE_RNG_H
#define DSV4MOE_RNG_H

#include <stdint.h>
#include "dsv4moe/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Key of the stream `name` under `seed` (FNV-1a of the name, mixed with the seed). */
DSV4_API uint64_t dsv4_rng_key(uint64_t seed, const char *name);
/* 64 random bits for element `index` of a stream. */
DSV4_API uint64_t dsv4_rng_u64(uint64_t key, uint64_t index);
/* Uniform in [0, 1) with 24 bits of resolution (exactly representable). */
DSV4_API float dsv4_rng_uniform(uint64_t key, uint64_t index);
/* Uniform integer in [0, n) (n >= 1), by multiply-shift of 32 bits. */
DSV4_API uint32_t dsv4_rng_below(uint64_t key, uint64_t index, uint32_t n);
/*
 * Approximately standard normal: the Irwin-Hall sum of four 16-bit uniforms,
 * centred and scaled to unit variance (support +-3.46). Exact arithmetic.
 */
DSV4_API float dsv4_rng_normal(uint64_t key, uint64_t index);

#ifdef __cplusplus
}
#endif
#endif
