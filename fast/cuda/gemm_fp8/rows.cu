/* The fp8 mode's grouped GEMM with weight scales of one row x 128 of K (the 1x128 conversion of fp4
   groups): gemm_fp8/op.cuh instantiated for SFN = 1. */
#include "fast/cuda/gemm_fp8/entries.h"
#include "fast/cuda/gemm_fp8/op.cuh"

namespace dsv4cuda {
namespace {
DSV4C_FP8_CFG(CfgRows, 1);
template <> struct CfgOf<1> : CfgRows {};
} // namespace

DSV4C_FP8_ENTRIES(rows, 1)

} // namespace dsv4cuda
