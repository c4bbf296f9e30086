/*
 * test_cuda's per-kernel test of params quant=down's quantization (fast/cuda/dec_qin.cuh,
 * dec_quant_rows: a decode block's group of bf16 h rows into e4m3 codes and 1x128 scales in its
 * shared memory): the host half (test_cuda.c) makes the rows and compares against the host's
 * quantizer (dsv4_act_quant_row); the device half (dec_qin_hw.cu) runs one block of k_dec's
 * threads over them and copies the buffer out. Test code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_DEC_QIN_HW_H
#define DSV4MOE_TESTS_CUDA_DEC_QIN_HW_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Quantizes rows 0 .. n - 1 of bf16 h ([n, K], K a multiple of 128, n at most 8) by qmode (1 ue8m0,
   2 fp32) with one block of 256 threads: codes [n, K] and scales [n, K / 128], each starting as
   0xA5 bytes in the block's buffer. 0, or a CUDA error code. */
int dsv4_test_dec_qin(const uint16_t *h, int n, int K, int qmode, uint8_t *codes, float *scales);
#ifdef __cplusplus
}
#endif

#endif
