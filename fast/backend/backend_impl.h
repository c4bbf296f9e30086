/*
 * Internal: the backend vtable (ggml-backend / BLIS-context style). Every
 * implementation fills one dsv4_backend_vtable and an opaque handle; the
 * public functions of dsv4moe/backend.h only dispatch. Not installed.
 */
#ifndef DSV4MOE_FAST_BACKEND_IMPL_H
#define DSV4MOE_FAST_BACKEND_IMPL_H

#include "dsv4moe/backend.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"

typedef struct dsv4_backend_vtable {
    const char *name; /* "ref", "cpu", ... */
    /* One forward; T >= 0 already checked against the plan's max_tokens_per_rank, out->y non-NULL. */
    dsv4_status (*forward)(void *impl, int64_t tokens, const uint16_t *x, const int32_t *input_ids,
                           dsv4_forward_out *out, dsv4_error *err);
    dsv4_backend_stats (*stats)(const void *impl);
    void (*free)(void *impl);
    /* Device-pointer forward (dsv4_backend_forward_device); NULL where the backend has no device. */
    dsv4_status (*forward_device)(void *impl, int64_t tokens, const void *x, const int32_t *input_ids,
                                  const dsv4_forward_out *out, dsv4_error *err);
} dsv4_backend_vtable;

struct dsv4_backend {
    const dsv4_backend_vtable *vt;
    void *impl;
    int64_t max_tokens; /* the plan's max_tokens_per_rank */
};

/* The CPU backend (fast/cpu/cpu.c): fills *impl and returns its vtable through *vt; opt is
   complete (struct_size, threads and cpu_kernels checked by the caller). */
dsv4_status dsv4_cpu_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt,
                                    const dsv4_backend_options *opt, void **impl, const dsv4_backend_vtable **vt,
                                    dsv4_error *err);
/* The name of the kernel table a CPU backend impl runs. */
const char *dsv4_cpu_backend_kernels(const void *impl);

#ifdef DSV4_WITH_CUDA
/* The CUDA backend (fast/cuda/cuda.cu, `make cuda` builds only). */
dsv4_status dsv4_cuda_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt, int threads, void **impl,
                                     const dsv4_backend_vtable **vt, dsv4_error *err);
#endif

#endif
