/* The fp8 mode's grouped GEMM with weight scales of 128x128 blocks (fp8 checkpoints; fp4 groups whose
   blocks convert exactly): gemm_fp8/op.cuh instantiated for SFN = 128. */
#include "fast/cuda/gemm_fp8/entries.h"
#include "fast/cuda/gemm_fp8/op.cuh"

namespace dsv4cuda {
namespace {
DSV4C_FP8_CFG(CfgBlocks, 128);
template <> struct CfgOf<128> : CfgBlocks {};
} // namespace

DSV4C_FP8_ENTRIES(blocks, 128)

} // namespace dsv4cuda
