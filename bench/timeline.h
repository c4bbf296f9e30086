/*
 * bench/timeline.h: a decode step's kernels as the GPU ran them, from CUPTI's kernel activity
 * records (start and end timestamps the hardware takes), for bench_cuda --timeline: each kernel's
 * duration inside a replayed graph (weights streamed through L2 by the kernels before it, launch
 * and programmatic-dependent-launch gaps included), which Nsight Compute's one-kernel replays do
 * not show. Not part of the library.
 *
 * The summary (tl_summarize) is plain C over the records, tested on the CPU (tests/test_timeline.c);
 * the collection (tl_begin, tl_end) exists only in the CUDA build of bench_cuda where CUPTI was
 * found (DSV4_BENCH_CUPTI, Makefile).
 */
#ifndef DSV4MOE_BENCH_TIMELINE_H
#define DSV4MOE_BENCH_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#define TL_NAME 64
#define TL_MAX_ROWS 64

/* One kernel as recorded. */
typedef struct {
    char name[TL_NAME]; /* short name (tl_short_name) */
    uint64_t start, end; /* ns, the GPU's clock */
    uint32_t stream;     /* CUPTI's stream id */
    uint32_t corr;       /* correlation id: the API call that launched it (a graph's: its cudaGraphLaunch) */
} tl_kernel;

/* Kernel i of every step (by start time within its step), medians over the steps. */
typedef struct {
    char name[TL_NAME];
    int stream;      /* the step's streams numbered by first use, 0 = the step's first kernel's */
    double start_us; /* from the step's first kernel start */
    double dur_us;
    double gap_us; /* the GPU idle before it: its start less the latest end of the kernels before it, or 0 */
} tl_row;

typedef struct {
    int steps;   /* steps summarised */
    int kernels; /* kernels per step */
    double span_us; /* medians: first kernel start to last kernel end */
    double busy_us; /* the union of the kernels' intervals */
    double sum_us;  /* the kernels' durations added (above busy_us where kernels overlap) */
    tl_row rows[TL_MAX_ROWS];
} tl_summary;

/* The short name of a kernel from its mangled name: the first identifier starting with "k_" and
   its integral template arguments ("k_dec<2,1,0,3,0>"), else the first two names of the nested
   name ("cutlass::device_kernel"), else the name as it is; at most n - 1 characters. */
void tl_short_name(const char *mangled, char *out, size_t n);

/*
 * Splits recs (n records of `steps` launches of one step, any order) into steps and summarises
 * them: by correlation id when there are exactly `steps` of them (graph replays), else in equal
 * runs of n / steps kernels by start time (eager launches). Returns 0; -1 with a message in err
 * when the records do not split into `steps` steps of the same kernels (by name, in start order),
 * or a step has more than TL_MAX_ROWS kernels.
 */
int tl_summarize(const tl_kernel *recs, int n, int steps, tl_summary *s, char *err, size_t errn);

#ifdef DSV4_BENCH_CUPTI
/* Starts recording every kernel the process runs (CUPTI concurrent-kernel activity). 0, or -1
   with err. */
int tl_begin(char *err, size_t errn);
/* Flushes and stops; *recs (malloc'd, the caller frees) and *n get what was recorded since
   tl_begin. Call after the work has finished (a stream synchronisation). 0, or -1 with err. */
int tl_end(tl_kernel **recs, int *n, char *err, size_t errn);
#endif

#endif
