/*
 * Shared-memory mbarriers and the copy engine's bulk asynchronous copies (cp.async.bulk) for the
 * decode kernels' bulk rings (params dec_ring=bulk, bulk_ef; mma_parts.cuh dec_warp). Inline device
 * functions only; any translation unit may include it.
 */
#ifndef DSV4MOE_FAST_CUDA_BULK_COPY_CUH
#define DSV4MOE_FAST_CUDA_BULK_COPY_CUH

#include <stdint.h>

namespace dsv4cuda {

__device__ __forceinline__ uint32_t bulk_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* A shared-memory mbarrier (dec_ring=bulk's stages): init with `count` arrivals; the init made
   visible to the copy engine; lane 0's arrival announcing `bytes` of bulk copies; the bulk copy
   of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global into shared memory,
   counted on the barrier; the wait for phase `parity` to complete. fence_async_smem: this thread's
   (and, after a barrier, the block's or warp's) shared-memory accesses ordered before the async
   proxy's (a bulk copy's or wgmma's). */
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bulk_smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bulk_smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     bulk_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(bulk_smem_u32(b))
                 : "memory");
}
/* bulk_g2s with an L2 cache-hint policy (l2_evict_first's) */
__device__ __forceinline__ void bulk_g2s_hint(void *dst, const void *src, unsigned bytes, uint64_t *b, uint64_t pol)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
            bulk_smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(bulk_smem_u32(b)), "l"(pol)
        : "memory");
}
/* An L2 policy: every access it marks is evicted first. */
__device__ __forceinline__ uint64_t l2_evict_first()
{
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred p_done;\n"
                 "MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p_done, [%0], %1;\n"
                 "@!p_done bra MBAR_WAIT;\n"
                 "}\n" ::"r"(bulk_smem_u32(b)),
                 "r"(parity)
                 : "memory");
}

} // namespace dsv4cuda

#endif
