/*
 * bench/group_fill.h: how full the grouped FP8 GEMM's tiles are in one forward, from its routing,
 * for bench_cuda (the padding of the last tile of every expert's group is MMA work that computes
 * nothing). Header only; not part of the library; tested on the CPU (tests/test_timeline.c).
 *
 * The cuda backend's gemm fp8 mode sends, chunk by chunk, every routed expert's group of more
 * than fp8_cut rows (params fp8_cut, docs/cuda.md) to the grouped GEMM, which computes it in tiles
 * of `tile` rows (CUTLASS's 128); the smaller groups run on the decode and 32-row tile kernels.
 */
#ifndef DSV4MOE_BENCH_GROUP_FILL_H
#define DSV4MOE_BENCH_GROUP_FILL_H

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint64_t groups; /* routed groups on the grouped GEMM, over every chunk */
    uint64_t rows;   /* their rows (kept slots) */
    uint64_t padded; /* their rows rounded up to whole tiles */
    uint64_t slots;  /* every kept slot of the forward, wherever it runs */
} bench_fill;

/*
 * Fills f from ids [T, K] (an id outside [0, E) is a pruned slot): the tokens in chunks of
 * `chunk` in order, each chunk's groups by expert. Returns 0, or -1 for an argument out of range
 * (T < 0, K < 1, E < 1, chunk < 1, cut < 0, tile < 1) or out of memory.
 */
static inline int bench_group_fill(const int32_t *ids, int64_t T, int K, int E, int64_t chunk, int cut, int tile,
                                   bench_fill *f)
{
    if (!f || (T > 0 && !ids) || T < 0 || K < 1 || E < 1 || chunk < 1 || cut < 0 || tile < 1)
        return -1;
    f->groups = f->rows = f->padded = f->slots = 0;
    int64_t *cnt = (int64_t *)calloc((size_t)E, sizeof *cnt);
    if (!cnt)
        return -1;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t t1 = t0 + chunk < T ? t0 + chunk : T;
        for (int e = 0; e < E; e++)
            cnt[e] = 0;
        for (int64_t i = t0 * K; i < t1 * K; i++)
            if (ids[i] >= 0 && ids[i] < E) {
                cnt[ids[i]]++;
                f->slots++;
            }
        for (int e = 0; e < E; e++)
            if (cnt[e] > cut) {
                f->groups++;
                f->rows += (uint64_t)cnt[e];
                f->padded += (uint64_t)((cnt[e] + tile - 1) / tile * tile);
            }
    }
    free(cnt);
    return 0;
}

#endif
