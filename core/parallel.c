#include <pthread.h>

#include "parallel.h"

#define MAX_THREADS 256

typedef struct {
    dsv4_range_fn fn;
    void *ctx;
    int64_t begin, end;
} job;

static void *run_job(void *p)
{
    job *j = p;
    j->fn(j->ctx, j->begin, j->end);
    return NULL;
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
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < threads; i++) {
        int64_t b = chunks * i / threads * grain, e = chunks * (i + 1) / threads * grain;
        jobs[i] = (job){fn, ctx, b < n ? b : n, e < n ? e : n};
    }
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&tid[i], NULL, run_job, &jobs[i]) == 0;
    run_job(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            run_job(&jobs[i]);
    }
}
