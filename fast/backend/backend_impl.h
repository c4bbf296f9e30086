/*
 * Internal: the backend vtable and the stages (ggml-backend / BLIS-context style).
 * Every implementation fills one dsv4_backend_vtable and an opaque handle and describes itself
 * in one registration (fast/backend/backend_reg.h); the public functions of dsv4moe/backend.h
 * only dispatch. Not installed.
 *
 * Stages. A backend that runs on a rank of a sharded plan implements the three optional stage
 * slots; the distributed driver (fast/multirank) composes them around its collectives, and the
 * single-rank forward is the same composition without the exchange:
 *
 *   route    tokens -> top-K expert ids (pruned slots E) and router weights;
 *   experts  the FFN of a list of token-slots grouped by expert (ascending), for this rank's
 *            expert range and, under tp, its range of moe_inter_dim; also the shared expert;
 *   combine  each token's expert outputs accumulated in the order given (ascending expert id),
 *            the shared expert's row added, rounded to bf16.
 *
 * The token rows travel as bf16, the way they are dispatched; expert outputs come back as fp32
 * partial down projections (summed over the rank's inter range, not rounded), so that under tp
 * the driver can all_reduce them before rounding.
 */
#ifndef DSV4MOE_FAST_BACKEND_IMPL_H
#define DSV4MOE_FAST_BACKEND_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include "dsv4moe/backend.h"
#include "dsv4moe/comm.h"
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
    /* Stream-ordered forward (dsv4_backend_enqueue; arguments checked by the caller) and the poll
       of the device error word (dsv4_backend_poll_error; out zeroed by the caller); NULL where the
       backend has no device. */
    dsv4_status (*enqueue)(void *impl, void *stream, int64_t tokens, const int32_t *valid_tokens, const void *x,
                           const int32_t *input_ids, const dsv4_forward_out *out, dsv4_error *err);
    dsv4_status (*poll_error)(void *impl, void *stream, dsv4_device_errors *out, dsv4_error *err);
} dsv4_backend_vtable;

/*
 * Device residency of a backend's stages (cuda). With it, fast/multirank keeps a rank's rows on the
 * backend's device: the token rows, the dispatched rows, the expert outputs and the metadata
 * travel as device buffers over the backend's device communicator (cuda: the device sim,
 * comm_devsim.h), and the stages get device pointers for the rows (x of route and experts, out
 * of experts, o and shared of combine); ids, weights, expert ids and token indices stay on the
 * host (the driver's slot bookkeeping). Every call is complete on return (the backend's stream
 * synchronised), so a collective issued after it sees its data.
 */
typedef struct dsv4_backend_device {
    void *(*alloc)(void *impl, size_t bytes); /* device memory, NULL when out of memory */
    void (*release)(void *impl, void *p);     /* NULL: no-op */
    /* bytes between any host and device pointers */
    dsv4_status (*copy)(void *impl, void *dst, const void *src, size_t bytes, dsv4_error *err);
    /* dst[i] = src[idx[i]] for i < n: bf16 rows of H (device), idx on the host */
    dsv4_status (*gather)(void *impl, int64_t n, int64_t H, const uint16_t *src, const int32_t *idx, uint16_t *dst,
                          dsv4_error *err);
    /* dst[idx ? idx[i] : i] = bf16(src[i]) for i < n: fp32 rows of H to bf16 (device), idx on the host */
    dsv4_status (*round)(void *impl, int64_t n, int64_t H, const float *src, const int32_t *idx, uint16_t *dst,
                         dsv4_error *err);
    /* The device communicator: a world of groups->world ranks (timeout in ms), its endpoints, its end. */
    dsv4_status (*world_create)(const dsv4_comm_groups *groups, int timeout_ms, void **world, dsv4_error *err);
    dsv4_comm *(*world_comm)(void *world, int rank);
    void (*world_free)(void *world);
} dsv4_backend_device;

/* The stages (see the top of this file): a table next to the vtable, named by the backend's
   registration; NULL slots (or no table) mean the backend runs only unsharded single-rank plans. */
typedef struct dsv4_backend_stages {
    /* Routes n tokens (0 <= n <= the plan's chunk): x bf16 [n, H], input_ids [n] on hash layers
       (checked by the caller). ids, w [n, K]; kept [n] may be NULL. */
    dsv4_status (*route)(void *impl, int64_t n, const uint16_t *x, const int32_t *input_ids, int32_t *ids, float *w,
                         int32_t *kept, dsv4_error *err);
    /* The FFN of m token-slots: x bf16 [m, H] (the tokens' rows), expert[m] grouped ascending
       (routed ids inside the plan's expert range, or DSV4_SHARED_EXPERT for every row), w[m] the
       router weights (NULL for the shared expert), inter rows [i0, i0 + ni) of the plan's inter
       range. out [m, H] fp32: the down projection summed over those rows, not rounded.
       m is at most the plan's bound for the step (dsv4_plan_workspace_bytes covers it). */
    dsv4_status (*experts)(void *impl, int64_t m, const uint16_t *x, const int32_t *expert, const float *w,
                           int64_t i0, int64_t ni, float *out, dsv4_error *err);
    /* y[t] = bf16(sum over the slots s of token t, in the order given, of o_s (before_w2) or
       w_s o_s (after_w2), plus shared[t]) for t in [0, n). o bf16 [ns, H] (expert outputs),
       tok[ns] in [0, n), w[ns]; shared bf16 [n, H] or NULL (no shared expert). */
    dsv4_status (*combine)(void *impl, int64_t n, int64_t ns, const int32_t *tok, const float *w, const uint16_t *o,
                           const uint16_t *shared, uint16_t *y, dsv4_error *err);
    const dsv4_backend_device *device; /* NULL: host buffers (ref, cpu) */
    /* CUDA graphs of the stages (cuda; NULL: none), called once a step by the driver: capture,
       this rank can replay the step, so it holds its graphs (those missing captured now, as an
       engine does at start-up); replay, the step replays (every rank agreed), so the stage calls
       that a graph holds launch it. held: the graphs the backend holds. */
    dsv4_status (*graphs)(void *impl, bool capture, bool replay, int64_t *held, dsv4_error *err);
} dsv4_backend_stages;

struct dsv4_backend_reg;

struct dsv4_backend {
    const struct dsv4_backend_reg *reg; /* its registration (fast/backend/backend_reg.h) */
    const dsv4_backend_vtable *vt;
    const dsv4_backend_stages *stages; /* the registration's, or NULL */
    void *impl;
    int64_t max_tokens; /* the plan's max_tokens_per_rank */
    bool sharded;       /* a rank of a sharded plan: stages only, no whole forward */
};

/* Creates a backend's instance of the plan (fast/backend/backend_reg.h: a registration's create);
   opt is complete (struct_size and threads checked by the caller; params is the backend's to
   parse, and empty unless its registration names keys). */
typedef dsv4_status (*dsv4_backend_create_fn)(const dsv4_plan *plan, const dsv4_checkpoint *ckpt,
                                              const dsv4_backend_options *opt, void **impl,
                                              const dsv4_backend_vtable **vt, dsv4_error *err);

/* The stages of a created backend: NULL unless route, experts and combine are all set. */
const dsv4_backend_stages *dsv4_backend_get_stages(const dsv4_backend *b);

#endif
