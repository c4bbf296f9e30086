/*
 * Internal: how a backend describes and registers itself (ggml's backend registration as the
 * model), not installed. Each backend's folder exports one function returning its registration,
 * a struct filled with designated initializers; fast/backend/registry.c is the list of those
 * functions. The planner reads capabilities and memory models from here and knows no backend by
 * name; dsv4_backend_create creates through `create`.
 *
 * Adding a backend: a folder with the backend's vtable and stages (backend_impl.h), one
 * registration function, and its entry in registry.c's list (or, for a backend that lives outside
 * the library, such as a test's, dsv4_backend_register before the first plan).
 */
#ifndef DSV4MOE_FAST_BACKEND_REG_H
#define DSV4MOE_FAST_BACKEND_REG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fast/backend/backend_impl.h"
#include "fast/plan/record.h"

/* Graph capture on one architecture: which executors may run inside a captured graph (static
   shapes, no host reads of device counts). Contiguous never is: its group sizes are read on the
   host. */
typedef struct dsv4_backend_sm {
    int sm;                  /* 90, 100, ... */
    bool masked_graph;       /* masked validated under graph capture (any ep) */
    bool per_token_graph;    /* per_token graph-safe with ep 1 */
    bool per_token_graph_ep; /* per_token graph-safe with ep > 1 */
} dsv4_backend_sm;

/* An extension's function, as get_proc returns it. */
typedef void (*dsv4_backend_proc)(void);
/* get_proc("kernels"): the name of the kernel table an instance runs (dsv4_backend_kernels). */
typedef const char *(*dsv4_backend_kernels_fn)(const void *impl);

typedef struct dsv4_backend_caps {
    bool gemm_fp8;    /* runs gemm fp8 (FP8 tensor cores, SPEC.md section 9); auto resolves to it */
    bool graphs;      /* captures and replays CUDA graphs (topology cuda_graph) */
    bool device_rows; /* its stages keep a rank's rows on its device (the driver's device buffers) */
    bool sharding;    /* runs ranks of sharded plans through its stages */
    /* The architectures it runs (topology sm), with their graph capabilities; n_sms 0: the
       backend has no architecture (the host). */
    const dsv4_backend_sm *sms;
    int n_sms;
} dsv4_backend_caps;

typedef struct dsv4_backend_reg {
    const char *name; /* "ref", "cpu", "cuda" */
    dsv4_backend_kind kind;
    dsv4_backend_caps caps;
    /* Whether this machine can run it (a device present, ...); NULL: always. why gets the reason. */
    bool (*available)(char *why, size_t n);
    /* The workspace of one chunk of `tokens` > 0 tokens of the rank `shard` of the layer, with
       executor ex: everything the backend allocates per forward or per stage call. The planner adds
       the multi-rank driver's buffers on a rank of several. NULL: the executor layout model
       (fast/plan/memory.h), which counts its own dispatch buffers. */
    uint64_t (*workspace_bytes)(const dsv4_config *cfg, const dsv4_shard *shard, int64_t tokens,
                                dsv4_executor_kind ex);
    /* Device bytes of the weights a backend of the shard binds at creation (the router's, its
       experts, its inter rows). NULL: 0 (the checkpoint is read in host memory). */
    uint64_t (*weight_bytes)(const dsv4_config *cfg, const dsv4_shard *shard);
    /* Whether it can execute the shard; why names what it cannot. NULL: every shard. */
    bool (*supports)(const dsv4_config *cfg, const dsv4_shard *shard, char *why, size_t n);
    /* NULL: described (the planner plans for it) but not in this build (cuda without `make cuda`). */
    dsv4_backend_create_fn create;
    const dsv4_backend_stages *stages; /* NULL: none (one unsharded rank only) */
    /* dsv4_backend_workspace_size: device workspace bytes of a backend of the plan for calls of up
       to max_tokens tokens. NULL: 0 (no device). */
    uint64_t (*device_workspace)(const dsv4_plan *plan, int64_t max_tokens);
    /* Extensions by name, NULL when the backend has none of that name (cast to the extension's
       type). "kernels": dsv4_backend_kernels_fn. */
    dsv4_backend_proc (*get_proc)(const char *name);
    /* The keys of dsv4_backend_options.params it parses at creation, for people ("kernels"); NULL:
       it takes none, and a non-empty list is refused before create. */
    const char *params;
} dsv4_backend_reg;

typedef const dsv4_backend_reg *(*dsv4_backend_reg_fn)(void);

/* The registrations of this library's backends (each in its own folder). */
const dsv4_backend_reg *dsv4_ref_backend_reg(void);
const dsv4_backend_reg *dsv4_cpu_backend_reg(void);
const dsv4_backend_reg *dsv4_cuda_backend_reg(void);

/* Registers one more backend (kind: the next after the registered ones, count() before the call),
   for a backend outside the library; before any plan or backend is created, from one thread.
   DSV4_ERR_RANGE when the registry is full (4 added), DSV4_ERR_INVALID_ARG for a kind that is not
   the next one or a name already taken. */
dsv4_status dsv4_backend_register(const dsv4_backend_reg *reg, dsv4_error *err);

/* Takes back the last registration of dsv4_backend_register (a test's, at its end), under the same
   rules; DSV4_ERR_INVALID_ARG when reg is not the last one added. */
dsv4_status dsv4_backend_unregister(const dsv4_backend_reg *reg, dsv4_error *err);

/* The registration of `kind`, NULL when no backend has that kind. */
const dsv4_backend_reg *dsv4_backend_registry_find(dsv4_backend_kind kind);
/* The index-th registration in kind order (0 .. dsv4_backend_count() - 1), NULL outside. */
const dsv4_backend_reg *dsv4_backend_registry_at(int index);
/* The names of the registered backends with a capability, for refusals: "cuda", "ref, cpu or
   cuda" (all when want is NULL). */
void dsv4_backend_names_with(bool (*want)(const dsv4_backend_reg *), const char *last_sep, char *buf, size_t n);

#endif
