/* Internal: a fork-join loop over a persistent pool of pthreads. Not installed. */
#ifndef DSV4MOE_CORE_PARALLEL_H
#define DSV4MOE_CORE_PARALLEL_H

#include <stdint.h>

/* Body of a parallel loop: handles [begin, end). */
typedef void (*dsv4_range_fn)(void *ctx, int64_t begin, int64_t end);

/*
 * Splits [0, n) into `threads` contiguous ranges whose edges are multiples of
 * `grain` (except the last) and runs fn on each, the first on the calling
 * thread. The split depends only on (threads, n, grain), never on timing.
 *
 * The other ranges run on a process-wide pool of worker threads, created
 * lazily on first use (grown to the largest `threads` asked for, at most 256)
 * and kept: a call costs a wake-up, not a thread creation. Workers spin
 * briefly after a job, then sleep on a condition variable. The pool is shut
 * down (workers joined) at process exit or library unload, and by
 * dsv4_parallel_shutdown; a forked child starts with no pool.
 *
 * Safe to call from several threads at once and from inside fn: a call that
 * finds the pool busy runs its ranges on threads of its own (created for the
 * call), a call from a pool worker runs them in turn on that worker. When
 * threads cannot be created, ranges run on the calling thread. The result of
 * fn must therefore never depend on which thread ran which range.
 */
void dsv4_parallel_for(int threads, int64_t n, int64_t grain, dsv4_range_fn fn, void *ctx);

/* Joins the pool's workers and frees it (idempotent; the next dsv4_parallel_for creates a new
   pool). Must not race with a running dsv4_parallel_for. */
void dsv4_parallel_shutdown(void);

/* Workers the pool holds now (0 before first use or after shutdown); for tests. */
int dsv4_parallel_pool_size(void);

#endif
