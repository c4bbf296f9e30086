/*
 * dsv4_parallel_for on a persistent pool (parallel.h).
 *
 * Why a pool: the CPU backend issues hundreds of small parallel loops per forward at mini
 * sizes (one per GEMM, epilogue and combine); creating and joining a thread per loop cost
 * 30-60 us each and dominated those forwards.
 *
 * Protocol: one caller at a time owns the pool (`busy`). It writes range i for worker i
 * (1-based), then the loop's sequence number into that worker's `todo[i]` (under `mu`,
 * broadcasting `go` for sleeping workers), and runs range 0 itself; a worker runs its range
 * when its `todo` passes the last one it ran and decrements `pending`; the last one signals
 * `done`. A worker without a range in a loop is never told about it, so it cannot run a
 * range twice or a stale one. Workers and the caller spin on the atomics for a short while
 * before sleeping, so back-to-back loops do not pay a futex wake-up each.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "core/parallel.h"

#define MAX_THREADS 256
#define SPIN_NS 100000 /* how long a worker or the caller spins before sleeping */

typedef struct {
    dsv4_range_fn fn;
    void *ctx;
    int64_t begin, end;
} job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_flag busy;        /* a caller owns the pool */
    uint64_t seq;            /* loops issued on the pool (owner only) */
    _Atomic int pending;     /* ranges of the current loop not finished by workers */
    _Atomic bool stop;
    int nthreads;            /* workers started: they hold ranges 1..nthreads */
    int njobs;               /* ranges of the current loop, range 0 on the caller */
    job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    _Atomic uint64_t todo[MAX_THREADS]; /* per worker: the loop whose range it must run */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, ATOMIC_FLAG_INIT,
          0, 0, false, 0, 0, {{0}}, {0}, {0}};

static _Thread_local bool in_worker; /* set on pool workers: nested loops run serially there */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void run_job(const job *j) { j->fn(j->ctx, j->begin, j->end); }

static void *worker_main(void *arg)
{
    int id = (int)(intptr_t)arg; /* 1..MAX_THREADS-1 */
    in_worker = true;
    uint64_t last = 0; /* grow() cleared todo[id] before creating this thread */
    for (;;) {
        uint64_t t = atomic_load_explicit(&pool.todo[id], memory_order_acquire);
        if (t == last && !atomic_load_explicit(&pool.stop, memory_order_acquire)) {
            int64_t t0 = now_ns();
            for (int spin = 0; t == last; spin++) {
                cpu_relax();
                t = atomic_load_explicit(&pool.todo[id], memory_order_acquire);
                if ((spin & 63) == 63 && now_ns() - t0 > SPIN_NS)
                    break;
            }
            if (t == last) {
                pthread_mutex_lock(&pool.mu);
                while ((t = atomic_load_explicit(&pool.todo[id], memory_order_acquire)) == last &&
                       !atomic_load_explicit(&pool.stop, memory_order_acquire))
                    pthread_cond_wait(&pool.go, &pool.mu);
                pthread_mutex_unlock(&pool.mu);
            }
        }
        if (t == last) /* woken for shutdown with nothing to run */
            return NULL;
        last = t;
        run_job(&pool.jobs[id]);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

/* A forked child has none of the parent's workers: it starts with an empty pool. */
static void atfork_child(void)
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    pool.mu = m;
    pool.go = c;
    pool.done = c;
    atomic_flag_clear(&pool.busy);
    atomic_store(&pool.pending, 0);
    atomic_store(&pool.stop, false);
    pool.nthreads = 0;
    pool.njobs = 0;
    for (int i = 0; i < MAX_THREADS; i++)
        atomic_store(&pool.todo[i], 0);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* Grows the pool to `want` workers (caller owns it); returns how many exist. */
static int grow(int want)
{
    while (pool.nthreads < want) {
        int id = pool.nthreads + 1;
        atomic_store_explicit(&pool.todo[id], 0, memory_order_relaxed);
        if (pthread_create(&pool.tid[id], NULL, worker_main, (void *)(intptr_t)id) != 0)
            break;
        pool.nthreads++;
    }
    return pool.nthreads;
}

static void split(int threads, int64_t n, int64_t grain, dsv4_range_fn fn, void *ctx, job *jobs)
{
    int64_t chunks = (n + grain - 1) / grain;
    for (int i = 0; i < threads; i++) {
        int64_t b = chunks * i / threads * grain, e = chunks * (i + 1) / threads * grain;
        jobs[i] = (job){fn, ctx, b < n ? b : n, e < n ? e : n};
    }
}

static void *run_detached(void *p)
{
    run_job(p);
    return NULL;
}

/* The pool is taken: threads of this call's own (the behaviour before the pool). */
static void run_own_threads(int threads, const job *jobs)
{
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&tid[i], NULL, run_detached, (void *)&jobs[i]) == 0;
    run_job(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            run_job(&jobs[i]);
    }
}

void dsv4_parallel_for(int threads, int64_t n, int64_t grain, dsv4_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t chunks = (n + grain - 1) / grain;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > chunks)
        threads = (int)chunks;
    if (threads <= 1) {
        fn(ctx, 0, n);
        return;
    }
    job jobs[MAX_THREADS];
    split(threads, n, grain, fn, ctx, jobs);
    if (in_worker) { /* nested inside a pool job: in turn, on this worker */
        for (int i = 0; i < threads; i++)
            run_job(&jobs[i]);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    if (atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire)) {
        run_own_threads(threads, jobs);
        return;
    }
    int have = grow(threads - 1);
    int onpool = have + 1 < threads ? have + 1 : threads; /* ranges the pool's workers take */
    for (int i = 0; i < onpool; i++)
        pool.jobs[i] = jobs[i];
    pool.njobs = onpool;
    atomic_store_explicit(&pool.pending, onpool - 1, memory_order_relaxed);
    if (onpool > 1) {
        uint64_t s = ++pool.seq;
        pthread_mutex_lock(&pool.mu);
        for (int i = 1; i < onpool; i++)
            atomic_store_explicit(&pool.todo[i], s, memory_order_release);
        pthread_cond_broadcast(&pool.go);
        pthread_mutex_unlock(&pool.mu);
    }
    run_job(&jobs[0]);
    for (int i = onpool; i < threads; i++) /* workers that could not be created */
        run_job(&jobs[i]);
    if (onpool > 1 && atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
        int64_t t0 = now_ns();
        for (int spin = 0; atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; spin++) {
            cpu_relax();
            if ((spin & 63) == 63 && now_ns() - t0 > SPIN_NS)
                break;
        }
        pthread_mutex_lock(&pool.mu);
        while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0)
            pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pool.njobs = 0;
    atomic_flag_clear_explicit(&pool.busy, memory_order_release);
}

void dsv4_parallel_shutdown(void)
{
    if (atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire))
        return; /* in use (a contract violation): leave it running rather than race */
    if (pool.nthreads > 0) {
        pthread_mutex_lock(&pool.mu);
        atomic_store_explicit(&pool.stop, true, memory_order_release);
        pthread_cond_broadcast(&pool.go);
        pthread_mutex_unlock(&pool.mu);
        for (int i = 1; i <= pool.nthreads; i++)
            pthread_join(pool.tid[i], NULL);
        pool.nthreads = 0;
        atomic_store_explicit(&pool.stop, false, memory_order_release);
    }
    atomic_flag_clear_explicit(&pool.busy, memory_order_release);
}

int dsv4_parallel_pool_size(void) { return pool.nthreads; }

/* Workers are joined at exit and on dlclose, so leak checkers and unloaders see no threads. */
__attribute__((destructor)) static void pool_fini(void) { dsv4_parallel_shutdown(); }
