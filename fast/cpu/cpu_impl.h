/*
 * The CPU backend's internal interface (not installed): the backend state shared by its
 * files. fast/cpu/cpu.c orchestrates a forward (chunks, conversions, the counting sort,
 * routed batches, the shared expert, statistics) and owns create/free; fast/cpu/router.c
 * computes logits, scores, top-k and norm top-p; fast/cpu/ffn.c holds the GEMM regimes and the
 * FFN of one group; fast/cpu/kernels/ the per-instruction-set kernels behind one table.
 */
#ifndef DSV4MOE_FAST_CPU_IMPL_H
#define DSV4MOE_FAST_CPU_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dsv4moe/alloc.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/config.h"
#include "dsv4moe/weights.h"
#include "fast/cpu/kernels/kernels.h"

#define SMALL_ROWS 256   /* fp4 on the bf16 kernel, blocked kernels: fused in blocks of this many rows */
#define FUSED_ROWS 16    /* other formats and kernels: fused up to this many rows, tiles above */
#define TILE_ROWS 256    /* weight rows per dequantized tile (tiles path) */
#define LARGE_ROWS 256   /* groups above this run alone, threads inside their GEMMs */
#define BATCH_BYTES (64ll << 20) /* group buffers of one expert-parallel batch */
#define NBUF 20

enum { B_XF, B_XQ, B_XQS, B_Y, B_LOG, B_IDS, B_W, B_KEPT, B_NONF, B_CNT, B_OFF, B_STOK, B_SW, B_XG, B_GU, B_HB, B_O,
       B_TILE, B_OC, B_SH };

typedef struct {
    dsv4_matrix_view v;
    uint8_t *own_q, *own_s; /* quantized at load (bf16 stacked checkpoint under a quantized config) */
} cmat;

typedef struct cpu_be {
    dsv4_config cfg;
    int threads;
    int64_t chunk, max_tokens;
    /* The plan's shard: experts [e_first, e_first + e_count) bound (the others left empty), and
       moe_inter_dim rows [i_first, i_first + inter) (w1, w3 rows and w2 columns bound to them). */
    int64_t e_first, e_count, i_first, inter;
    const dsv4_cpu_kernels_table *kt; /* the kernel table this backend runs */
    dsv4_allocator *persist, *ws;
    dsv4_router_tensors rt;
    cmat *experts;    /* [E][3] */
    cmat shared[3];
    struct {
        void *p;
        size_t n;
    } buf[NBUF];
    dsv4_backend_stats stats;
    _Atomic int nomem;               /* a worker could not allocate */
} cpu_be;

/* The workspace buffer `id`, grown to at least `bytes` (kept between forwards); NULL when out
   of memory. */
void *dsv4_cpu_ensure(cpu_be *b, int id, size_t bytes);

/* x bf16 rows -> fp32 xf, and the act_quant copies (qr: xq, qs: xqs; else they alias xf). */
typedef struct {
    const uint16_t *x;
    float *xf, *xq, *xqs;
    int64_t H;
    dsv4_act_quant mode;
    bool qr, qs; /* quantize into xq / xqs (else they alias xf) */
} conv_job;

void dsv4_cpu_convert_rows(void *p, int64_t lo, int64_t hi);

/* out[i] = bf16(y[i]) over [lo, hi). */
typedef struct {
    const float *y;
    uint16_t *out;
} out_job;

void dsv4_cpu_output_rows(void *p, int64_t lo, int64_t hi);

/* Router logits and routing of Tc tokens of xf (fp32 [Tc, H]): ids, w [Tc, K], kept [Tc],
   nonf [Tc] non-finite flags; in_ids on hash layers (checked by the caller). The forward's
   step 1 and the route stage. */
void dsv4_cpu_route_chunk(cpu_be *b, int64_t Tc, const float *xf, const int32_t *in_ids, float *logits, int32_t *ids,
                          float *w, int32_t *kept, unsigned char *nonf);

/* Per-worker scratch: a dequantized tile, split X rows (fp4 AVX-512 path), one decoded row. */
typedef struct {
    float *tile; /* TILE_ROWS * kmax */
    float *xs;   /* SMALL_ROWS * kmax */
    float *row;  /* kmax */
} wscratch;

/* Floats of one worker's scratch; worker w's part of base. */
size_t dsv4_cpu_wscratch_floats(const dsv4_config *c);
wscratch dsv4_cpu_worker_scratch(cpu_be *b, float *base, int w);

/* X [n, H] activations as the GEMMs see them; O [n, H] receives the fp32 down projection.
   Threads inside (ws NULL, scratch at wbase) or on the calling worker only (ws != NULL). */
dsv4_status dsv4_cpu_ffn(cpu_be *b, float *wbase, const wscratch *ws, const cmat *m, bool clamp, int64_t n,
                         const float *X, const float *tw, float *GU, float *HB, float *O, _Atomic uint64_t *gcl,
                         _Atomic uint64_t *ucl, dsv4_error *err);

/* The fused decode-dot a forward on table kt would run, of all rows of m against n <= 256
   activation rows X [n, k]: C[q * m->n + j] = X[q] . W[j]. Returns 1 when out of memory or
   n > 256, else 0. For the kernel tests (tests/test_cpu.c), which run every table. */
int dsv4_cpu_fused_dot(const dsv4_cpu_kernels_table *kt, const dsv4_matrix_view *m, int64_t n, const float *X,
                       float *C);

/* y[tok[q]] += bf16(O[q]) (or w bf16(O[q]) after_w2) for the rows of groups in order; columns in parallel. */
typedef struct {
    float *y;
    const float *O;
    const int32_t *tok; /* NULL: row q is token q */
    const float *tw;    /* NULL: weight 1 */
    int64_t n, H;
} comb_job;

void dsv4_cpu_combine(void *p, int64_t lo, int64_t hi);

/* Expert-parallel batches of routed groups: one expert per worker at a time. */
typedef struct {
    cpu_be *b;
    float *wbase;
    int64_t e0, e1;     /* experts [e0, e1) of the batch, ascending */
    const int64_t *off; /* slot offsets per expert */
    int64_t base;       /* off[e0]: the batch's first slot */
    const int32_t *stok;
    const float *sw, *xq;
    float *XG, *GU, *HB, *O; /* indexed by slot - base */
    _Atomic int64_t next;
    _Atomic uint64_t gc, uc;
} batch_job;

void dsv4_cpu_batch_worker(void *p, int64_t w, int64_t wend);

/* One expert-parallel batch from expert e (its group at most LARGE_ROWS rows): e and the
   consecutive experts below e_end whose groups fit `cap` rows together, one expert per worker;
   row q of the batch (slot off[e] + q) is read from xq at stok's row and written to O + q H.
   Returns the batch's end; adds its rows to *rows, its non-empty groups to *groups, its empty
   experts to *skips and its clamp counts to *gc, *uc. */
int64_t dsv4_cpu_run_batch(cpu_be *b, float *wbase, int64_t e, int64_t e_end, const int64_t *off, int64_t cap,
                           const int32_t *stok, const float *sw, const float *xq, float *XG, float *GU, float *HB,
                           float *O, int64_t *rows, uint64_t *groups, uint64_t *skips, uint64_t *gc, uint64_t *uc);

/* Router (SPEC.md 2-3) over tokens [lo, hi): ids, weights, kept counts, non-finite flags. */
typedef struct {
    cpu_be *b;
    const float *xf, *logits;
    const int32_t *in_ids;
    int32_t *ids, *kept;
    float *w;
    unsigned char *nonf;
} route_job;

void dsv4_cpu_route(void *p, int64_t lo, int64_t hi);

/* Router logits of a chunk: by rows (sgemm over tokens [lo, hi)) or, for few tokens, by
   columns (sgemv over experts [lo, hi) of every token). */
typedef struct {
    const cpu_be *b;
    const float *xf;
    float *logits;
    int64_t Tc;
} logit_job;

void dsv4_cpu_logits_rows(void *p, int64_t lo, int64_t hi);
void dsv4_cpu_logits_cols(void *p, int64_t lo, int64_t hi);

/* ---------------- what the registration (fast/cpu/reg.c) lists ---------------- */

struct dsv4_shard;
struct dsv4_backend_vtable;
struct dsv4_backend_stages;

/* Creates an instance of the plan (cpu.c). */
dsv4_status dsv4_cpu_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt,
                                    const dsv4_backend_options *opt, void **impl,
                                    const struct dsv4_backend_vtable **vt, dsv4_error *err);
/* The name of the kernel table an instance runs (cpu.c). */
const char *dsv4_cpu_backend_kernels(const void *impl);
/* The stages of a rank of a sharded plan (stages.c). */
extern const struct dsv4_backend_stages dsv4_cpu_backend_stages;
/* The memory model: one chunk of `tokens` tokens of the shard (stages.c). */
uint64_t dsv4_cpu_backend_workspace_bytes(const dsv4_config *cfg, const struct dsv4_shard *shard, int64_t tokens,
                                          dsv4_executor_kind ex);

#endif
