/*
 * Internal: 64-bit FNV-1a, the one hash of the library's fingerprints (rng keys, the reference's
 * output hash, collective fingerprints) and its name table. Not installed.
 */
#ifndef DSV4MOE_CORE_HASH_H
#define DSV4MOE_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define DSV4_FNV_OFFSET 0xcbf29ce484222325ULL
#define DSV4_FNV_PRIME 0x100000001b3ULL

/* h extended by the n bytes at p. */
static inline uint64_t dsv4_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= DSV4_FNV_PRIME;
    }
    return h;
}

/* h extended by the bytes of the NUL-terminated s. */
static inline uint64_t dsv4_fnv1a_str(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= DSV4_FNV_PRIME;
    }
    return h;
}

/* h extended by the 8 bytes of v, least significant first (the same on any host). */
static inline uint64_t dsv4_fnv1a_u64(uint64_t h, uint64_t v)
{
    for (int b = 0; b < 8; b++) {
        h ^= (v >> (8 * b)) & 0xffu;
        h *= DSV4_FNV_PRIME;
    }
    return h;
}

#endif
