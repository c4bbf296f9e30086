/*
 * The fragment-native weight layout of the CUDA backend's tensor-core path (fast/cuda/mma_parts.cuh),
 * shared by the host repacking (fast/cuda/repack.c, plain C, unit-tested on the CPU by
 * tests/test_repack.c) and the kernels. docs/cuda.md, "The fp8 tensor-core path", explains it.
 *
 * The kernels multiply 8-bit floats on the tensor cores (mma.sync.m16n8k32 or wgmma m64nNk32, e4m3
 * x e4m3, fp32 accumulate) with the weights as the A operand held in registers and the tokens as
 * the N columns. A lane (gid = lane / 4, tig = lane % 4) of a 16-row tile holds, per 32-wide K
 * step, elements k = 4 tig .. 4 tig + 3 (register 0 for row gid, 1 for row gid + 8) and
 * 16 + 4 tig .. 16 + 4 tig + 3 (registers 2 and 3) in the natural K order, so the activations
 * need no permutation (B fragments and wgmma's shared-memory B read them as they are). The
 * weights are stored per (16-row tile, 128-wide K block) so that each lane reads its bytes with
 * 16-byte loads and a warp reads one contiguous chunk:
 *
 *   fp4: 1024 bytes = [row half h (rows gid / gid + 8)][lane][4 k32 steps x one 32-bit word];
 *        byte i of step c's word holds two nibbles (s e1 e0 m): element 4 tig + i ("run A") with
 *        its bits at (s 5, e1 6, e0 1, m 0), element 16 + 4 tig + i ("run B") at (s 7, e1 4,
 *        e0 3, m 2), which is run B's e4m3 bit pattern in place; scales 64 bytes = [gid][h][c],
 *        each the ue8m0 byte plus 6.
 *   fp8: 2048 bytes = [plane p = 2 h + c / 2][lane][16 bytes: step c's 8 bytes, step c+1's 8],
 *        a step's 8 bytes being elements 4 tig .. 4 tig + 3, then 16 + 4 tig .. 16 + 4 tig + 3;
 *        scales 8 bytes = [h] fp32 (the 128x128 block's scale, ue8m0 widened exactly).
 *
 * An fp4 nibble becomes the e4m3 byte s 0 0 e1 e0 m 0 0, whose value is e2m1 * 2^-6 for every
 * code (the subnormal 0.5 included): run B by one AND, run A by two shifts and two logic ops. The
 * kernel multiplies each step's fp32 partial by 2^(s - 127 + 6), a normal fp32 power of two for
 * every scale byte s in [0, 248], built by shifting the stored byte (s + 6) into the exponent.
 */
#ifndef DSV4MOE_FAST_CUDA_FRAGMENT_H
#define DSV4MOE_FAST_CUDA_FRAGMENT_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_FN_HD static __host__ __device__ __forceinline__
#else
#define DSV4_FN_HD static inline
#endif

#define DSV4_FN_FP4_CHUNK 1024 /* bytes of one (16-row tile, k128 block) */
#define DSV4_FN_FP4_SCHUNK 64
#define DSV4_FN_FP8_CHUNK 2048
#define DSV4_FN_FP8_SCHUNK 8
#define DSV4_FN_FP4_SCALE_MAX 248 /* 2^(s - 121) stays a normal fp32 */

/* The e4m3 bytes (value e2m1 * 2^-6) of run A of w's four bytes. */
DSV4_FN_HD uint32_t dsv4_fn_lo(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }
/* ... and of run B. */
DSV4_FN_HD uint32_t dsv4_fn_hi(uint32_t w) { return w & 0x9C9C9C9Cu; }

/* The stored byte of one run-A nibble and one run-B nibble (e2m1 codes s e1 e0 m, bit 3 the sign). */
DSV4_FN_HD uint32_t dsv4_fn_fp4_byte(uint32_t a, uint32_t b)
{
    const uint32_t ra = (a & 3u) | ((a & 8u) << 2) | ((a & 4u) << 4);
    const uint32_t rb = ((b & 8u) << 4) | ((b & 7u) << 2);
    return ra | rb;
}

/*
 * The fragment word of two runs of 4 packed fp4 elements (natural storage: a byte holds element
 * 2j in its low nibble and 2j + 1 in its high nibble): n's low 16 bits hold run A (elements
 * a0..a3), its high 16 bits run B (b0..b3); byte i of the result holds a_i and b_i.
 */
DSV4_FN_HD uint32_t dsv4_fn_fp4_word(uint32_t n)
{
    uint32_t w = 0;
    for (int i = 0; i < 4; i++) {
        const uint32_t a = (n >> (4 * i)) & 15u, b = (n >> (16 + 4 * i)) & 15u;
        w |= dsv4_fn_fp4_byte(a, b) << (8 * i);
    }
    return w;
}

/* The stored step-scale byte of a ue8m0 scale byte s <= DSV4_FN_FP4_SCALE_MAX. */
DSV4_FN_HD uint32_t dsv4_fn_fp4_scale_store(uint32_t s) { return s + 6u; }

/* The fp32 bits of 2^(s - 121) from four stored bytes (step c's byte): scale times the 2^6 of lo/hi. */
DSV4_FN_HD uint32_t dsv4_fn_fp4_scale_bits(uint32_t bytes, int c)
{
    return c < 3 ? (bytes << (23 - 8 * c)) & 0x7F800000u : (bytes >> 1) & 0x7F800000u;
}

#endif
