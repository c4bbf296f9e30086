/*
 * k_tileh (fast/cuda/tileh.cu): the fp8 path's large groups (and mid-size ones, params mid=) on
 * exact f16 wgmma, in the variants the creation chooses from by name (params tileh=, mid=).
 */
#ifndef DSV4MOE_FAST_CUDA_TILEH_CUH
#define DSV4MOE_FAST_CUDA_TILEH_CUH

#include <stddef.h>

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* fp4 scale bytes the f16 conversion takes exactly (one f16 multiply by 2^(s - 127) of an e2m1
   value stays exact for s in [LO, HI]); the creation checks every expert's, and large groups of an
   expert outside the range run on k_tile (mma_tileh.cuh explains the conversion). */
#define DSV4_FH_SCALE_LO 107
#define DSV4_FH_SCALE_HI 136

typedef void (*fast_kernel)(FastArgs);

/* One variant: its name, the kernel (launched plainly: grid (N / 128, the regime's tile capacity),
   256 threads, smem bytes of shared memory), its tokens per block. */
struct TileHVar {
    const char *name;
    fast_kernel k;
    int bn;
    size_t smem;
};

/* large groups: tokens per block 64 or 128, A decode serial or pipelined under the wgmmas, blocks
   per SM (first: the default; docs/cuda.md has the measured comparison) */
constexpr int N_TILEH_BIG = 5;
extern const TileHVar tileh_big[N_TILEH_BIG];
/* mid-size groups (32-token tiles): mma.sync (k_tile, bn 0, no kernel here) or k_tileh (first: the default) */
constexpr int N_TILEH_MID = 3;
extern const TileHVar tileh_mid[N_TILEH_MID];

} // namespace dsv4cuda

#endif
