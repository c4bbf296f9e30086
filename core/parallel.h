/* Internal: a minimal fork-join loop over pthreads. Not installed. */
#ifndef DSV4MOE_CORE_PARALLEL_H
#define DSV4MOE_CORE_PARALLEL_H

#include <stdint.h>

/* Body of a parallel loop: handles [begin, end). */
typedef void (*dsv4_range_fn)(void *ctx, int64_t begin, int64_t end);

/*
 * Splits [0, n) into `threads` contiguous ranges whose edges are multiples of
 * `grain` (except the last) and runs fn on each, the first on the calling
 * thread. Falls back to one thread when threads cannot be created; the
 * result must therefore never depend on how the range was split.
 */
void dsv4_parallel_for(int threads, int64_t n, int64_t grain, dsv4_range_fn fn, void *ctx);

#endif
