/*
 * dsv4moe: an accounting allocator. Backends and drivers take their
 * workspace through it, so the measured peak can be compared with the
 * plan's workspace, and an optional limit turns an over-budget allocation
 * into a clean failure instead of an OOM later. Thread-safe.
 */
#ifndef DSV4MOE_ALLOC_H
#define DSV4MOE_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_alloc_stats {
    uint64_t current;  /* bytes held now */
    uint64_t peak;     /* the most held at once since creation or the last reset */
    uint64_t total;    /* bytes handed out in all */
    uint64_t count;    /* successful allocations */
    uint64_t refused;  /* allocations refused by the limit or by the system */
    uint64_t limit;    /* 0: none */
} dsv4_alloc_stats;

typedef struct dsv4_allocator dsv4_allocator;

/* limit_bytes 0 means no limit. */
DSV4_API dsv4_status dsv4_allocator_create(uint64_t limit_bytes, dsv4_allocator **out, dsv4_error *err);
/* NULL is a no-op. Every block must have been released. */
DSV4_API void dsv4_allocator_free(dsv4_allocator *a);
/*
 * `bytes` zeroed bytes (bytes may be 0: a unique non-NULL block), or NULL when
 * the limit would be passed or the system has no memory (counted as refused).
 * A NULL allocator falls back to the system allocator without accounting.
 */
DSV4_API void *dsv4_alloc(dsv4_allocator *a, size_t bytes);
/* NULL is a no-op. `p` must come from dsv4_alloc on the same allocator. */
DSV4_API void dsv4_release(dsv4_allocator *a, void *p);
DSV4_API dsv4_alloc_stats dsv4_allocator_stats(const dsv4_allocator *a);
/* Sets peak to current (to measure one phase). */
DSV4_API void dsv4_allocator_reset_peak(dsv4_allocator *a);

#ifdef __cplusplus
}
#endif
#endif
