#include "dsv4moe/rng.h"
#include "core/hash.h"

/* The splitmix64 finaliser: a bijection on 64 bits with full avalanche. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dsv4_rng_key(uint64_t seed, const char *name)
{
    uint64_t h = dsv4_fnv1a_str(DSV4_FNV_OFFSET, name ? name : "");
    return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ULL));
}

uint64_t dsv4_rng_u64(uint64_t key, uint64_t index)
{
    /* Two rounds so that nearby (key, index) pairs share no low-order structure. */
    return mix64(mix64(key ^ (index * 0x9e3779b97f4a7c15ULL)) + index);
}

float dsv4_rng_uniform(uint64_t key, uint64_t index)
{
    return (float)(dsv4_rng_u64(key, index) >> 40) * (1.0f / 16777216.0f);
}

uint32_t dsv4_rng_below(uint64_t key, uint64_t index, uint32_t n)
{
    uint64_t r = dsv4_rng_u64(key, index) >> 32;
    return (uint32_t)((r * (uint64_t)n) >> 32);
}

float dsv4_rng_normal(uint64_t key, uint64_t index)
{
    uint64_t r = dsv4_rng_u64(key, index);
    /* Sum of four 16-bit integers is exact in fp32 (< 2^18). */
    uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) + (uint32_t)((r >> 32) & 0xffff) +
                 (uint32_t)(r >> 48);
    /* Mean 2 * 65535, variance 4 * (65536^2 - 1) / 12; 1.7320508f = sqrt(3). */
    float centred = ((float)s - 131070.0f) * (1.0f / 65536.0f);
    return centred * 1.7320508f;
}
