/*
 * dsv4moe: the device sim communicator, ranks as host threads of one process sharing one GPU,
 * each with its own CUDA stream, behind the dsv4_comm interface (comm.h). Built only into the
 * CUDA variant (`make cuda`); the CPU-only library has none of it.
 *
 * Buffers are DEVICE buffers of the world's GPU. A collective on rank r first waits for r's
 * stream (set with dsv4_devsim_set_stream; default the legacy default stream), copies r's
 * send data to pinned host memory on that stream, runs the collective of an inner `sim` world
 * (the same rendezvous, the same fingerprint checks before any data moves, the same deadlock
 * reports after timeout_ms, the same ascending-rank all_reduce), and copies the result back to
 * r's device buffer on r's stream before it returns. So a sequence of eager steps of several
 * ranks runs on one H200 with the sim's guarantees: a rank that skips or reorders a collective
 * produces DSV4_ERR_COMM naming the ranks and collectives on every rank, never a hang. Not for
 * capture: the host copies cannot be recorded into a CUDA graph (a capturing stream is refused
 * with DSV4_ERR_UNSUPPORTED, naming the collective).
 *
 * A CUDA error on a copy poisons the world (the peers fail at once) and returns DSV4_ERR_DEVICE.
 */
#ifndef DSV4MOE_COMM_DEVSIM_H
#define DSV4MOE_COMM_DEVSIM_H

#include "dsv4moe/api.h"
#include "dsv4moe/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_devsim_world dsv4_devsim_world;

typedef struct dsv4_devsim_options {
    uint32_t struct_size; /* sizeof(dsv4_devsim_options), set by init */
    int timeout_ms;       /* the inner sim's deadlock timeout */
    int device;           /* the GPU every rank uses (cudaSetDevice before each collective) */
} dsv4_devsim_options;

/* timeout 5000 ms, device 0. NULL is a no-op. */
DSV4_API void dsv4_devsim_options_init(dsv4_devsim_options *opt);

/* A world of groups->world ranks on one GPU. opt may be NULL (defaults). DSV4_ERR_DEVICE when the
   device cannot be selected. */
DSV4_API dsv4_status dsv4_devsim_world_create(const dsv4_comm_groups *groups, const dsv4_devsim_options *opt,
                                              dsv4_devsim_world **out, dsv4_error *err);
/* NULL is a no-op. Every rank's thread must have returned from its collectives. */
DSV4_API void dsv4_devsim_world_free(dsv4_devsim_world *world);
/* Rank r's endpoint, owned by the world; used by one thread at a time. NULL outside [0, world). */
DSV4_API dsv4_comm *dsv4_devsim_world_comm(dsv4_devsim_world *world, int rank);
/* The stream (a cudaStream_t) rank's collectives order against. DSV4_ERR_INVALID_ARG for a comm
   that is not a devsim endpoint. */
DSV4_API dsv4_status dsv4_devsim_set_stream(dsv4_comm *comm, void *stream, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
