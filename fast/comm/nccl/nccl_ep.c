/*
 * EP dispatch and combine over an NCCL endpoint (comm_nccl.h, "EP dispatch
 * and combine"). The collectives go through the public dsv4_comm_* calls, so
 * they are traced, sequence-numbered and fingerprinted like any other.
 *
 * Layout (one row per token-slot): the route kernel gives slot s = t*K + k
 * its row pos[s] in the send buffer; the same pos brings its output back in
 * combine, because the reverse all_to_allv returns every row to the place it
 * left from.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/comm_nccl.h"
#include "core/err.h"
#include "fast/comm/nccl/nccl_internal.h"

struct dsv4_nccl_ep {
    dsv4_comm *comm;
    dsv4_nccl_ep_config cfg;
    int n, me;
    int begin[DSV4_COMM_MAX_RANKS + 1];
    int64_t cap;                   /* slots per (source, destination) pair */
    int64_t send_slots, recv_slots; /* buffer rows */
    int *d_begin;
    int32_t *d_pos;                /* [max_tokens * K] */
    int64_t *d_cmat;               /* [n * n] */
    int32_t *d_overflow;
    void *send_rows, *recv_rows, *back_rows;
    int32_t *send_ids, *recv_ids;
    float *send_w, *recv_w;
    int64_t *h_cmat;               /* pinned [n * n] */
    size_t bytes;
    /* the last dispatch, for combine */
    bool dispatched;
    int64_t tokens;
    uint64_t sc[DSV4_COMM_MAX_RANKS], rc[DSV4_COMM_MAX_RANKS]; /* slots */
    char tag[DSV4_COMM_TAG_MAX];
};

void dsv4_nccl_ep_config_init(dsv4_nccl_ep_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
}

void dsv4_nccl_ep_free(dsv4_nccl_ep *ep)
{
    if (!ep)
        return;
    cudaFree(ep->d_begin);
    cudaFree(ep->d_pos);
    cudaFree(ep->d_cmat);
    cudaFree(ep->d_overflow);
    cudaFree(ep->send_rows);
    cudaFree(ep->recv_rows);
    cudaFree(ep->back_rows);
    cudaFree(ep->send_ids);
    cudaFree(ep->recv_ids);
    cudaFree(ep->send_w);
    cudaFree(ep->recv_w);
    cudaFreeHost(ep->h_cmat);
    free(ep);
}

size_t dsv4_nccl_ep_device_bytes(const dsv4_nccl_ep *ep)
{
    return ep ? ep->bytes : 0;
}

static int dalloc(dsv4_nccl_ep *ep, void **p, size_t bytes)
{
    if (bytes == 0)
        bytes = 16;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        *p = NULL;
        return -1;
    }
    ep->bytes += bytes;
    return 0;
}

dsv4_status dsv4_nccl_ep_create(dsv4_comm *comm, const dsv4_nccl_ep_config *cfg, dsv4_nccl_ep **out,
                                dsv4_error *err)
{
    static const char fn[] = "dsv4_nccl_ep_create";
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "out is NULL");
    *out = NULL;
    if (!dsv4_nccl_is_nccl(comm))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "comm is not an NCCL endpoint");
    if (!cfg || cfg->struct_size != sizeof *cfg)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "cfg is NULL or its struct_size is not %zu (call "
                           "dsv4_nccl_ep_config_init)", sizeof *cfg);
    int n = dsv4_comm_group_size(comm, DSV4_GROUP_EP);
    if (cfg->n_experts < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'n_experts'", "%d must be >= 1",
                           cfg->n_experts);
    if (cfg->topk < 1 || cfg->topk > cfg->n_experts)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'topk'", "%d is outside [1, n_experts %d]",
                           cfg->topk, cfg->n_experts);
    if (cfg->max_tokens < 0 || cfg->max_tokens > (1 << 24))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'max_tokens'", "%lld is outside [0, 2^24]",
                           (long long)cfg->max_tokens);
    if (!cfg->row_bytes_in || cfg->row_bytes_in % 16 || !cfg->row_bytes_out || cfg->row_bytes_out % 16)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'row_bytes_in'",
                           "row_bytes_in %zu and row_bytes_out %zu must be positive multiples of 16",
                           cfg->row_bytes_in, cfg->row_bytes_out);
    if (!cfg->expert_begin)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'expert_begin'", "is NULL");
    if (cfg->expert_begin[0] != 0 || cfg->expert_begin[n] != cfg->n_experts)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'expert_begin'",
                           "must start at 0 and end at n_experts %d over the %d ep ranks (got %d .. %d)",
                           cfg->n_experts, n, cfg->expert_begin[0], cfg->expert_begin[n]);
    int emax = 0;
    for (int d = 0; d < n; d++) {
        int e = cfg->expert_begin[d + 1] - cfg->expert_begin[d];
        if (e < 0)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ep config field 'expert_begin'",
                               "entry %d (%d) is below entry %d (%d): ranges must ascend", d + 1,
                               cfg->expert_begin[d + 1], d, cfg->expert_begin[d]);
        if (e > emax)
            emax = e;
    }
    dsv4_nccl_ep *ep = calloc(1, sizeof *ep);
    if (!ep)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory");
    ep->comm = comm;
    ep->cfg = *cfg;
    ep->cfg.expert_begin = NULL; /* copied below; the caller's array need not outlive us */
    ep->n = n;
    ep->me = dsv4_comm_group_rank(comm, DSV4_GROUP_EP);
    memcpy(ep->begin, cfg->expert_begin, (size_t)(n + 1) * sizeof *ep->begin);
    int k = cfg->topk;
    ep->cap = cfg->max_tokens * (k < emax ? k : emax);
    ep->send_slots = cfg->padded ? n * ep->cap : cfg->max_tokens * k;
    ep->recv_slots = n * ep->cap;
    size_t ss = (size_t)ep->send_slots, rs = (size_t)ep->recv_slots;
    int bad = dalloc(ep, (void **)&ep->d_begin, (size_t)(n + 1) * sizeof(int)) ||
              dalloc(ep, (void **)&ep->d_pos, (size_t)cfg->max_tokens * k * sizeof(int32_t)) ||
              dalloc(ep, (void **)&ep->d_cmat, (size_t)n * n * sizeof(int64_t)) ||
              dalloc(ep, (void **)&ep->d_overflow, sizeof(int32_t)) ||
              dalloc(ep, &ep->send_rows, ss * cfg->row_bytes_in) || dalloc(ep, &ep->recv_rows, rs * cfg->row_bytes_in) ||
              dalloc(ep, &ep->back_rows, ss * cfg->row_bytes_out) ||
              dalloc(ep, (void **)&ep->send_ids, ss * 4) || dalloc(ep, (void **)&ep->recv_ids, rs * 4) ||
              dalloc(ep, (void **)&ep->send_w, ss * 4) || dalloc(ep, (void **)&ep->recv_w, rs * 4) ||
              cudaMallocHost((void **)&ep->h_cmat, (size_t)n * n * sizeof(int64_t)) != cudaSuccess;
    if (bad) {
        size_t want = ep->bytes;
        dsv4_nccl_ep_free(ep);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "device allocation failed after %zu bytes (max_tokens %lld, "
                           "%lld send and %lld receive slots)", want, (long long)cfg->max_tokens,
                           (long long)ss, (long long)rs);
    }
    cudaMemcpy(ep->d_begin, ep->begin, (size_t)(n + 1) * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemset(ep->d_overflow, 0, sizeof(int32_t));
    *out = ep;
    return DSV4_OK;
}

static void subtag(char *buf, size_t n, const char *tag, const char *what)
{
    snprintf(buf, n, "%.*s %s", (int)(DSV4_COMM_TAG_MAX - 12), tag ? tag : "", what);
}

static dsv4_status kerr(dsv4_nccl_ep *ep, int e, const char *kernel, dsv4_error *err)
{
    char where[64];
    snprintf(where, sizeof where, "nccl ep rank %d", dsv4_comm_rank(ep->comm));
    return dsv4_seterr(err, DSV4_ERR_DEVICE, where, "the %s kernel failed to launch: %s", kernel,
                       cudaGetErrorString((cudaError_t)e));
}

dsv4_status dsv4_nccl_ep_dispatch(dsv4_nccl_ep *ep, int64_t tokens, const void *x, const int32_t *topk_ids,
                                  const float *topk_weights, const char *tag, dsv4_nccl_ep_recv *recv,
                                  dsv4_error *err)
{
    static const char fn[] = "dsv4_nccl_ep_dispatch";
    if (!ep || !recv)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "%s is NULL", !ep ? "ep" : "recv");
    /* Argument errors are local, so they abort the endpoint (peers would wait for us otherwise). */
    const char *bad = NULL;
    if (tokens < 0 || tokens > ep->cfg.max_tokens)
        bad = "tokens is outside [0, max_tokens]";
    else if (tokens > 0 && (!x || !topk_ids || !topk_weights))
        bad = "x, topk_ids or topk_weights is NULL with tokens > 0";
    else if (tokens > 0 && ((uintptr_t)x % 16))
        bad = "x is not 16-byte aligned";
    if (bad) {
        char msg[300];
        snprintf(msg, sizeof msg, "rank %d: %s: %s (tokens %lld, max_tokens %lld)", dsv4_comm_rank(ep->comm), fn, bad,
                 (long long)tokens, (long long)ep->cfg.max_tokens);
        /* An all_gather with a NULL buffer is refused by the generic layer, which aborts the endpoint. */
        dsv4_comm_all_gather(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_I64, NULL, 1, NULL, msg, NULL);
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "%s", msg);
    }
    void *stream = dsv4_nccl_stream(ep->comm);
    int n = ep->n, me = ep->me, k = ep->cfg.topk;
    int64_t slots = tokens * k;
    int64_t cap = ep->cfg.padded ? ep->cap : 0;
    char t[DSV4_COMM_TAG_MAX];
    snprintf(ep->tag, sizeof ep->tag, "%s", tag ? tag : "");
    ep->dispatched = false;
    int e = dsv4_nccl_k_route(topk_ids, slots, ep->d_begin, n, cap, ep->d_pos, ep->d_cmat + (size_t)me * n,
                              ep->d_overflow, stream);
    if (e)
        return kerr(ep, e, "route", err);
    if (ep->cfg.padded) {
        /* Rows past the valid count are padding: their expert id -1 says so. */
        cudaMemsetAsync(ep->send_ids, 0xff, (size_t)ep->send_slots * 4, (cudaStream_t)stream);
    }
    e = dsv4_nccl_k_pack(slots, k, ep->d_pos, x, ep->cfg.row_bytes_in, topk_ids, topk_weights, ep->send_rows,
                         ep->send_ids, ep->send_w, stream);
    if (e)
        return kerr(ep, e, "pack", err);
    subtag(t, sizeof t, tag, "counts");
    dsv4_status st = dsv4_comm_all_gather(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_I64, ep->d_cmat + (size_t)me * n,
                                          (uint64_t)n, ep->d_cmat, t, err);
    if (st != DSV4_OK)
        return st;
    memset(recv, 0, sizeof *recv);
    if (ep->cfg.padded) {
        for (int j = 0; j < n; j++) {
            ep->sc[j] = ep->rc[j] = (uint64_t)ep->cap;
            recv->recv_offset[j] = j * ep->cap;
        }
        recv->slots = ep->recv_slots;
        recv->cap_per_peer = ep->cap;
    } else {
        cudaMemcpyAsync(ep->h_cmat, ep->d_cmat, (size_t)n * n * 8, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
        st = dsv4_nccl_sync(ep->comm, t, err);
        if (st != DSV4_OK)
            return st;
        /* Every rank holds the same matrix, so every rank refuses the same overflow: nobody waits. */
        for (int d = 0; d < n; d++) {
            int64_t tot = 0;
            for (int s = 0; s < n; s++)
                tot += ep->h_cmat[s * n + d];
            if (tot > ep->recv_slots) {
                char where[96];
                snprintf(where, sizeof where, "nccl ep dispatch '%s'", ep->tag);
                return dsv4_seterr(err, DSV4_ERR_RANGE, where,
                                   "ep rank %d would receive %lld token-slots, more than its %lld (ep x max_tokens x "
                                   "min(K, experts per rank)): an expert repeated inside one token's top-k?",
                                   d, (long long)tot, (long long)ep->recv_slots);
            }
        }
        int64_t off = 0;
        for (int j = 0; j < n; j++) {
            ep->sc[j] = (uint64_t)ep->h_cmat[me * n + j];
            ep->rc[j] = (uint64_t)ep->h_cmat[j * n + me];
            recv->recv_offset[j] = off;
            recv->recv_count[j] = (int64_t)ep->rc[j];
            off += (int64_t)ep->rc[j];
        }
        recv->slots = off;
    }
    uint64_t sb[DSV4_COMM_MAX_RANKS], rb[DSV4_COMM_MAX_RANKS];
    for (int j = 0; j < n; j++) {
        sb[j] = ep->sc[j] * ep->cfg.row_bytes_in;
        rb[j] = ep->rc[j] * ep->cfg.row_bytes_in;
    }
    subtag(t, sizeof t, tag, "rows");
    st = dsv4_comm_all_to_allv(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_U8, ep->send_rows, sb, ep->recv_rows, rb, t, err);
    if (st == DSV4_OK) {
        subtag(t, sizeof t, tag, "expert ids");
        st = dsv4_comm_all_to_allv(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_I32, ep->send_ids, ep->sc, ep->recv_ids, ep->rc,
                                   t, err);
    }
    if (st == DSV4_OK) {
        subtag(t, sizeof t, tag, "weights");
        st = dsv4_comm_all_to_allv(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_F32, ep->send_w, ep->sc, ep->recv_w, ep->rc,
                                   t, err);
    }
    if (st != DSV4_OK)
        return st;
    recv->rows = ep->recv_rows;
    recv->expert_ids = ep->recv_ids;
    recv->weights = ep->recv_w;
    recv->count_matrix = ep->d_cmat;
    ep->tokens = tokens;
    ep->dispatched = true;
    return DSV4_OK;
}

dsv4_status dsv4_nccl_ep_combine(dsv4_nccl_ep *ep, const void *expert_out, void *out_slots, const char *tag,
                                 dsv4_error *err)
{
    static const char fn[] = "dsv4_nccl_ep_combine";
    if (!ep)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "ep is NULL");
    uint64_t recv_total = 0;
    for (int j = 0; j < ep->n; j++)
        recv_total += ep->rc[j];
    const char *bad = NULL;
    if (!ep->dispatched)
        bad = "no dispatch before this combine";
    else if (recv_total && !expert_out)
        bad = "expert_out is NULL with received slots";
    else if (ep->tokens && !out_slots)
        bad = "out_slots is NULL with tokens";
    if (bad) {
        char msg[300];
        snprintf(msg, sizeof msg, "rank %d: %s: %s", dsv4_comm_rank(ep->comm), fn, bad);
        dsv4_comm_all_gather(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_I64, NULL, 1, NULL, msg, NULL);
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "%s", msg);
    }
    uint64_t sb[DSV4_COMM_MAX_RANKS], rb[DSV4_COMM_MAX_RANKS];
    for (int j = 0; j < ep->n; j++) {
        sb[j] = ep->rc[j] * ep->cfg.row_bytes_out; /* the reverse route */
        rb[j] = ep->sc[j] * ep->cfg.row_bytes_out;
    }
    char t[DSV4_COMM_TAG_MAX];
    subtag(t, sizeof t, tag ? tag : ep->tag, "combine");
    dsv4_status st = dsv4_comm_all_to_allv(ep->comm, DSV4_GROUP_EP, DSV4_DTYPE_U8, expert_out, sb, ep->back_rows, rb,
                                           t, err);
    if (st != DSV4_OK)
        return st;
    int e = dsv4_nccl_k_unpack(ep->tokens * ep->cfg.topk, ep->d_pos, ep->back_rows, ep->cfg.row_bytes_out, out_slots,
                               dsv4_nccl_stream(ep->comm));
    if (e)
        return kerr(ep, e, "unpack", err);
    ep->dispatched = false;
    return DSV4_OK;
}
