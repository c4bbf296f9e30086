/*
 * The CPU backend's kernel table (internal, not installed). BLIS's context as the model:
 * one table of function pointers per instruction-set level, filled reference-first and then
 * overridden, level by level, by the instruction sets this CPU has, at backend creation.
 * The orchestration (fast/cpu/cpu.c), the GEMM regimes and the FFN (fast/cpu/ffn.c) call the
 * kernels through the table only; no kernel file knows a regime, and no code outside
 * fast/cpu/kernels/ names an instruction set.
 *
 * API:
 *   dsv4_cpu_kernels_get(level, &table, err)   the table of one level (DSV4_CPU_KERNELS_AUTO:
 *                                              the best this CPU has); DSV4_ERR_UNSUPPORTED
 *                                              when the CPU lacks an instruction the level needs.
 *   dsv4_cpu_kernels_available(level)          does this CPU run it.
 *   dsv4_cpu_kernels_ref()                     the reference table (portable C).
 *
 * Levels nest: ref < avx2 (AVX2 + FMA + F16C) < avx512 (F, BW, VL) < avx512-bf16 (+ BF16)
 * < avx512-vbmi (+ VBMI); each file fills the entries of its instruction set:
 *   kernels/ref.c         dequant, dot (decode one row, then a four-sum fp32 dot)
 *   kernels/avx2.c        dequant, dot, pack_fp4 + dot_fp4_packed, dot_fp8 (register-blocked for
 *                         a few activation rows, blocked through L1 for more: dot_blocked)
 *   kernels/avx512.c      pack_fp4 + dot_fp4_packed, dot_fp8, swiglu_row (16-lane tiles)
 *   kernels/avx512bf16.c  dot_fp4_bf16, dot_fp8_bf16 (vdpbf16ps)
 *   kernels/avx512vbmi.c  dot_fp4_bf16_k128 (grouped-scale fp4 on byte permutes)
 * An entry left NULL is a kernel this level does not have; the caller takes the next regime.
 *
 * Every entry computes C[q * ldc + j] = X[q, :] . W[r0 + j, :] (the dot entries) for weight
 * rows j < nr of m and activation rows q < n, or the rows' fp32 values (dequant), with the same
 * decoded weights as dsv4_matrix_dequant_rows (the tests check every table against it).
 * Activation layouts: natural fp32 (dot, dot_fp8), fp32 as the table's own pack_fp4 lays it out
 * (dot_fp4_packed; BLIS's packing: each instruction set permutes X to match the order its
 * decoder produces weights in), bf16 permuted per 64-block (dot_fp4_bf16), bf16 in
 * tilebf4's 128-block layout (dot_fp4_bf16_k128, see avx512vbmi.c), bf16 natural (dot_fp8_bf16).
 */
#ifndef DSV4MOE_FAST_CPU_KERNELS_H
#define DSV4MOE_FAST_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4moe/backend.h"

/*
 * The CPU backend's kernel tables, one per instruction-set level (the backend's parameter
 * kernels=NAME, docs/cpu.md); each level includes the ones below it. AUTO runs the best this CPU has; a lower level is for comparison (on an
 * AVX-512 machine, AVX2 runs the kernels an AVX2-only server would) and for tests, which run
 * every level the machine has. Outputs of different levels agree within the backend's
 * tolerance (SPEC.md 7); one level is deterministic run to run.
 */
typedef enum dsv4_cpu_kernels {
    DSV4_CPU_KERNELS_AUTO = 0,
    DSV4_CPU_KERNELS_REF,          /* portable C */
    DSV4_CPU_KERNELS_AVX2,         /* AVX2 + FMA + F16C */
    DSV4_CPU_KERNELS_AVX512,       /* AVX-512 F, BW, VL */
    DSV4_CPU_KERNELS_AVX512_BF16,  /* + AVX512-BF16 */
    DSV4_CPU_KERNELS_AVX512_VBMI   /* + AVX512-VBMI */
} dsv4_cpu_kernels;

/* "auto", "ref", "avx2", "avx512", "avx512-bf16", "avx512-vbmi"; "unknown" outside the enum. */
const char *dsv4_cpu_kernels_name(dsv4_cpu_kernels kernels);
/* The level of a name above; DSV4_ERR_INVALID_ARG (naming the accepted names) otherwise. */
dsv4_status dsv4_cpu_kernels_from_name(const char *name, dsv4_cpu_kernels *out, dsv4_error *err);
/* Whether this CPU runs the level (AUTO and REF: always). */
bool dsv4_cpu_kernels_available(dsv4_cpu_kernels kernels);

#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"
#include "dsv4moe/status.h"

typedef void (*dsv4_cpu_dequant_fn)(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out);
/* tmp: k floats of scratch for the reference entry (NULL is fine where dsv4_cpu_kernels_vector). */
typedef void (*dsv4_cpu_dot_fn)(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                                int64_t ldx, float *C, int64_t ldc, float *tmp);
typedef void (*dsv4_cpu_dot_bf16_fn)(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                     int64_t ldx, float *C, int64_t ldc);
/* The SwiGLU epilogue of one row (SPEC.md 4): h = bf16(silu(g) u [w]), clamps counted into gc/uc. */
typedef void (*dsv4_cpu_swiglu_fn)(const float *gr, const float *ur, float *h, int64_t I, bool clamp, float L,
                                   bool mulw, float w, uint64_t *gc, uint64_t *uc);

typedef struct dsv4_cpu_kernels_table {
    dsv4_cpu_kernels level;
    const char *name;                     /* dsv4_cpu_kernels_name(level) */
    dsv4_cpu_dequant_fn dequant;          /* any format, any k */
    dsv4_cpu_dot_fn dot;                  /* any format, any k; natural fp32 X */
    dsv4_cpu_dot_fn dot_fp4_packed;       /* fp4, k % 32 == 0; X as pack_fp4 writes it (tmp unused) */
    /* X [n, k] (rows ldx apart) into XP [n, k] in dot_fp4_packed's order, k % 32 == 0. */
    void (*pack_fp4)(const float *X, int64_t ldx, int64_t n, int64_t k, float *XP);
    dsv4_cpu_dot_fn dot_fp8;              /* fp8, k % 32 == 0; natural fp32 X (tmp unused) */
    dsv4_cpu_dot_bf16_fn dot_fp4_bf16;    /* fp4, k % 64 == 0 */
    dsv4_cpu_dot_bf16_fn dot_fp4_bf16_k128; /* fp4, k % 128 == 0 */
    dsv4_cpu_dot_bf16_fn dot_fp8_bf16;    /* fp8, k % 128 == 0 */
    dsv4_cpu_swiglu_fn swiglu_row;        /* NULL: the scalar loop of fast/cpu/ffn.c */
    /* dot_fp4_packed and dot_fp8 are blocked GEMM kernels (decoded weight slices reused by every
       activation row): the regimes give them groups of any size, in blocks of at most 256 rows,
       instead of dequantize + sgemm above 16 rows. */
    bool dot_blocked;
} dsv4_cpu_kernels_table;

dsv4_status dsv4_cpu_kernels_get(dsv4_cpu_kernels level, const dsv4_cpu_kernels_table **out, dsv4_error *err);
const dsv4_cpu_kernels_table *dsv4_cpu_kernels_ref(void);

/* True where t's dequant/dot run vector code on m (no tmp row needed). */
static inline bool dsv4_cpu_kernels_vector(const dsv4_cpu_kernels_table *t, const dsv4_matrix_view *m)
{
    return t->level >= DSV4_CPU_KERNELS_AVX2 && m->k % 32 == 0;
}

/* The fills, one per file, each overriding the entries of its instruction set (kernels.c calls
   them in level order, only for the levels this CPU has). */
void dsv4_cpu_kernels_fill_ref(dsv4_cpu_kernels_table *t);
void dsv4_cpu_kernels_fill_avx2(dsv4_cpu_kernels_table *t);
void dsv4_cpu_kernels_fill_avx512(dsv4_cpu_kernels_table *t);
void dsv4_cpu_kernels_fill_avx512bf16(dsv4_cpu_kernels_table *t);
void dsv4_cpu_kernels_fill_avx512vbmi(dsv4_cpu_kernels_table *t);

/* The reference dot, the ISA entries' fallback for k % 32 != 0. */
void dsv4_cpu_ref_dot(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X, int64_t ldx,
                      float *C, int64_t ldc, float *tmp);

/* Shared constant tables, filled once before any table is handed out (kernels.c). */
extern float dsv4_cpu_ue8m0_f32[256];     /* ue8m0 byte -> fp32 (255: NaN) */
extern uint16_t dsv4_cpu_e2m1_bf16[32];   /* entry i: bf16 of e2m1 code i & 15 */

#endif
