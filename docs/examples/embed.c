/*
 * A server's life cycle around one MoE layer (docs/embedding.md): plan at start-up, the server's
 * own device workspace, one CUDA graph per token bucket captured around dsv4_backend_enqueue on
 * the server's stream, replays with a device count of valid rows, and the error word polled when
 * the server chooses. Built by `make cuda` as build/cuda/embed_example.
 *
 *   usage: embed_example PRESET LAYER WEIGHTS      (exit 0 served, 1 an error, 3 no usable GPU)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/backend.h"

#define NB 3
static const int64_t BUCKET[NB] = {1, 32, 256};

static int fail(const char *what, const char *why)
{
    fprintf(stderr, "embed_example: %s: %s\n", what, why);
    return 1;
}

#define CUDA(call)                                                 \
    do {                                                           \
        cudaError_t ce_ = (call);                                  \
        if (ce_ != cudaSuccess)                                    \
            return fail(#call, cudaGetErrorString(ce_));           \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: embed_example PRESET LAYER WEIGHTS\n");
        return 2;
    }
    dsv4_error e;
    dsv4_config cfg;
    if (dsv4_config_preset(argv[1], &cfg, &e))
        return fail("config", e.message);
    cfg.layer = atoll(argv[2]);

    /* 1. start-up: one plan for the largest bucket */
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = DSV4_BACKEND_CUDA;
    topo.max_tokens_per_rank = BUCKET[NB - 1];
    dsv4_budget bud;
    dsv4_budget_init(&bud);
    dsv4_plan *plan = NULL;
    if (dsv4_plan_create(&cfg, &topo, &bud, &plan, &e))
        return fail("plan", e.message);
    if (dsv4_backend_plan_supported(plan, &e)) {
        printf("embed_example: the cuda backend cannot run here: %s\n", e.message);
        dsv4_plan_free(plan);
        return 3;
    }
    dsv4_checkpoint *ck = NULL;
    if (dsv4_checkpoint_open(argv[3], &ck, &e))
        return fail("checkpoint", e.message);

    /* 2. the workspace belongs to the server: sized by the library, allocated once */
    uint64_t ws_bytes = 0;
    if (dsv4_backend_workspace_size(plan, BUCKET[NB - 1], &ws_bytes, &e))
        return fail("workspace size", e.message);
    void *ws = NULL;
    CUDA(cudaMalloc(&ws, ws_bytes));
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    opt.threads = 8;
    opt.workspace = ws;
    opt.workspace_bytes = ws_bytes;
    dsv4_backend *moe = NULL;
    if (dsv4_backend_create_with(plan, ck, &opt, &moe, &e))
        return fail("backend", e.message);

    /* 3. the step's tensors (the largest bucket's), and one graph per bucket on the server's stream */
    const int64_t H = cfg.dim, K = cfg.n_activated, TM = BUCKET[NB - 1];
    void *x = NULL, *y = NULL, *ids = NULL, *w = NULL, *in_ids = NULL, *valid = NULL;
    CUDA(cudaMalloc(&x, (size_t)(TM * H) * 2));
    CUDA(cudaMalloc(&y, (size_t)(TM * H) * 2));
    CUDA(cudaMalloc(&ids, (size_t)(TM * K) * 4));
    CUDA(cudaMalloc(&w, (size_t)(TM * K) * 4));
    CUDA(cudaMalloc(&in_ids, (size_t)TM * 4));
    CUDA(cudaMalloc(&valid, 4));
    CUDA(cudaMemset(in_ids, 0, (size_t)TM * 4)); /* token id 0 everywhere (hash layers read them) */
    cudaStream_t s = NULL;
    CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dsv4_forward_out out = {(uint16_t *)y, (int32_t *)ids, (float *)w, NULL};
    cudaGraphExec_t exec[NB];
    for (int b = 0; b < NB; b++) {
        cudaGraph_t g = NULL;
        CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        /* the server's own kernels would be captured here too, before and after the layer */
        dsv4_status st = dsv4_backend_enqueue(moe, s, BUCKET[b], (const int32_t *)valid, x, (const int32_t *)in_ids,
                                              &out, &e);
        CUDA(cudaStreamEndCapture(s, &g));
        if (st)
            return fail("enqueue", e.message);
        CUDA(cudaGraphInstantiate(&exec[b], g, 0));
        CUDA(cudaGraphDestroy(g));
    }

    /* 4. serving: each step writes x and its row count, then replays the smallest bucket holding it */
    const int32_t steps[3] = {1, 20, 200};
    uint16_t *hx = malloc((size_t)(TM * H) * 2);
    if (!hx)
        return fail("host buffer", "out of memory");
    uint32_t r = 12345;
    for (int64_t i = 0; i < TM * H; i++) {
        r = r * 1664525u + 1013904223u;
        hx[i] = (uint16_t)(0x3C00 + (r >> 24)) | (uint16_t)((r >> 8) & 0x8000); /* bf16 in +-[2^-7, 2^-6) */
    }
    for (int i = 0; i < 3; i++) {
        int b = 0;
        while (BUCKET[b] < steps[i])
            b++;
        CUDA(cudaMemcpyAsync(x, hx, (size_t)(steps[i] * H) * 2, cudaMemcpyHostToDevice, s));
        CUDA(cudaMemcpyAsync(valid, &steps[i], 4, cudaMemcpyHostToDevice, s));
        CUDA(cudaGraphLaunch(exec[b], s));
        /* 5. errors: latched on the device, read when the server looks (this waits for s) */
        dsv4_device_errors de;
        de.struct_size = sizeof de;
        if (dsv4_backend_poll_error(moe, s, &de, &e))
            return fail("poll", e.message);
        int32_t id0 = -1;
        CUDA(cudaMemcpy(&id0, ids, 4, cudaMemcpyDeviceToHost));
        printf("embed_example: step of %d tokens in bucket %lld: first token's first expert %d\n", steps[i],
               (long long)BUCKET[b], id0);
    }
    printf("embed_example: served 3 steps on a %llu-byte server workspace\n", (unsigned long long)ws_bytes);

    for (int b = 0; b < NB; b++)
        cudaGraphExecDestroy(exec[b]);
    cudaStreamDestroy(s);
    free(hx);
    cudaFree(x), cudaFree(y), cudaFree(ids), cudaFree(w), cudaFree(in_ids), cudaFree(valid);
    dsv4_backend_free(moe);
    cudaFree(ws);
    dsv4_checkpoint_close(ck);
    dsv4_plan_free(plan);
    return 0;
}
