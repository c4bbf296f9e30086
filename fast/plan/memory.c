/*
 * The memory models the planner composes (fast/plan/memory.h, docs/planner.md): the executor
 * layout model and the multi-rank driver's buffers.
 */
#include "fast/plan/memory.h"

/* ---------------------------------------------------------------------------
 * The executor layout model (docs/planner.md)
 *
 * a = 1 byte per activation element when activations are quantized before the
 * routed GEMMs (routed_format fp8/fp4 and act_quant != none), else 2 (bf16);
 * sc(n) = 4 * ceil(n / 128) bytes of fp32 group scales when quantized, else 0.
 *
 * Per executor row:  R = H*a + sc(H)          (input activation)
 *                      + 2*Il*2                (gate/up, bf16)
 *                      + Il*a + sc(Il)         (h, the down GEMM's input)
 *                      + H*2                   (expert output, bf16)
 * Per chunk of Tc tokens (the step's largest rank), with Tg the tokens that
 * reach this rank (Tc local, ep*Tc under EP, dp*Tc under DP all-gather) and
 * S the token-slots (Tc*K local, ep*Tc*min(K, E_local) under EP, dp*Tc*K
 * under DP):
 *   router   = Tc*E*4 + Tc*K*8                 (fp32 scores, int32 ids + fp32 weights)
 *   gather   = Tg*(H*a + sc(H)) + Tg*K*8       (DP all-gather only)
 *   meta     = S*8 + E_local*8                 (slot indices and weights, per-expert counts)
 *   rows     = contiguous: align128(S + min(E_local, S)*127) (each non-empty group pads to
 *              128 rows, at most 127 rows each, and at most min(E_local, S) groups are non-empty); masked: E_local*align128(Tg); per_token: 1
 *   exec     = rows * R
 *   combine  = (DP ? Tg : Tc) * H * 4          (fp32 accumulation / all_reduce buffer)
 *   comm     = 2*S*(H*a + sc(H)) + 2*S*H*2     (EP only: dispatch and combine send + receive)
 * Every step also holds the metadata collective: 64 bytes per world rank.
 * ------------------------------------------------------------------------- */
bool dsv4_mem_acts_quantized(const dsv4_config *c)
{
    return c->routed_format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
}

static uint64_t act_bytes(const dsv4_config *c, int64_t n)
{
    uint64_t un = (uint64_t)n;
    if (!dsv4_mem_acts_quantized(c))
        return dsv4_sat_mul(un, 2);
    return dsv4_sat_add(un, dsv4_sat_mul(4, (un + 127) / 128));
}

static uint64_t align128(uint64_t v) { return v > UINT64_MAX - 127 ? UINT64_MAX : (v + 127) / 128 * 128; }

uint64_t dsv4_mem_row_bytes(const dsv4_config *c, int64_t il, dsv4_gemm_mode gemm)
{
    uint64_t H = (uint64_t)c->dim, I = (uint64_t)il;
    uint64_t r = act_bytes(c, c->dim);
    r = dsv4_sat_add(r, dsv4_sat_mul(I, 4));
    r = dsv4_sat_add(r, act_bytes(c, il));
    r = dsv4_sat_add(r, dsv4_sat_mul(H, 2));
    /* gemm fp8 (SPEC.md section 9): a grouped GEMM reads each group's activations as contiguous
       rows and writes bf16 g|u before the epilogue: one more gathered activation row, 2I bf16
       values and h's scales in a second layout */
    if (gemm == DSV4_GEMM_FP8)
        r = dsv4_sat_add(dsv4_sat_add(r, act_bytes(c, c->dim)), dsv4_sat_add(dsv4_sat_mul(I, 4), dsv4_sat_mul((I + 127) / 128, 4)));
    return r;
}

/* Tokens reaching this rank and token-slots for a chunk of tc tokens. */
void dsv4_mem_chunk_shape(const dsv4_config *c, const dsv4_shard *sh, int64_t tc, uint64_t *tg, uint64_t *slots)
{
    uint64_t t = (uint64_t)tc, K = (uint64_t)c->n_activated, El = (uint64_t)sh->e_count;
    switch (sh->router) {
    case DSV4_ROUTER_EP_ALL_TO_ALL:
    case DSV4_ROUTER_EP_LOW_LATENCY:
        *tg = dsv4_sat_mul((uint64_t)sh->ep, t);
        *slots = dsv4_sat_mul(*tg, K < El ? K : El);
        break;
    case DSV4_ROUTER_DP_ALL_GATHER:
        *tg = dsv4_sat_mul((uint64_t)sh->dp, t);
        *slots = dsv4_sat_mul(*tg, K);
        break;
    default:
        *tg = t;
        *slots = dsv4_sat_mul(t, K);
        break;
    }
}

static uint64_t exec_rows(const dsv4_config *c, const dsv4_shard *sh, int64_t tc, dsv4_executor_kind ex)
{
    uint64_t tg, s, El = (uint64_t)sh->e_count;
    dsv4_mem_chunk_shape(c, sh, tc, &tg, &s);
    switch (ex) {
    case DSV4_EXEC_MASKED: return dsv4_sat_mul(El, align128(tg));
    case DSV4_EXEC_PER_TOKEN: return 1;
    default: return align128(dsv4_sat_add(s, dsv4_sat_mul(El < s ? El : s, 127)));
    }
}

/*
 * The distributed driver's own buffers for a chunk of tc tokens on a rank of a world > 1
 * (fast/multirank/driver.c), next to the backend's workspace when the backend brings its own memory
 * model: ids, weights, slot records (24 bytes) and the slot order [Tc K]; the shared expert's
 * rows (fp32 and bf16) and ids; with ep > 1 the dispatch (bf16 rows, ids, weights out and in,
 * the received rows regrouped, their fp32 outputs and bf16 copies on the way back, the outputs
 * received), else the slots' bf16 rows and their fp32 outputs with the shared rows (the tp
 * all_reduce buffer) and bf16 copies. A rank receives at most ep Tc min(K, E_local) slots
 * (ep Tc K on hash layers, where a row may repeat an expert). 1 KiB covers the allocations'
 * padding. A backend whose rows live on a device (the registry's stages name a device: cuda)
 * also holds the chunk's token rows on the device, the slots' and received rows' orders, and
 * device copies of the exchanged expert ids and weights (12 bytes a slot each way), and 1 KiB
 * more of padding.
 */
uint64_t dsv4_mem_driver_bytes(const dsv4_config *c, const dsv4_shard *sh, int64_t tc, bool device_rows)
{
    uint64_t t = (uint64_t)tc, K = (uint64_t)c->n_activated, H = (uint64_t)c->dim, El = (uint64_t)sh->e_count;
    uint64_t ns = dsv4_sat_mul(t, K);
    uint64_t w = dsv4_sat_add(1024, dsv4_sat_mul(ns, 40));
    if (device_rows) {
        uint64_t kc = dsv4_config_is_hash_layer(c) || K < El ? K : El;
        uint64_t nr = sh->ep > 1 ? dsv4_sat_mul(dsv4_sat_mul((uint64_t)sh->ep, t), kc) : 0;
        w = dsv4_sat_add(w, dsv4_sat_add(dsv4_sat_add(1024, dsv4_sat_mul(dsv4_sat_mul(t, H), 2)), dsv4_sat_mul(dsv4_sat_add(ns, nr), 12)));
    }
    if (c->n_shared_experts > 0)
        w = dsv4_sat_add(w, dsv4_sat_add(dsv4_sat_mul(t, 4), dsv4_sat_mul(dsv4_sat_mul(t, H), 6)));
    if (sh->ep > 1) {
        uint64_t kc = dsv4_config_is_hash_layer(c) || K < El ? K : El;
        uint64_t nr = dsv4_sat_mul(dsv4_sat_mul((uint64_t)sh->ep, t), kc);
        w = dsv4_sat_add(w, dsv4_sat_mul(ns, dsv4_sat_add(dsv4_sat_mul(4, H), 8)));
        return dsv4_sat_add(w, dsv4_sat_mul(nr, dsv4_sat_add(dsv4_sat_mul(10, H), 40)));
    }
    w = dsv4_sat_add(w, dsv4_sat_mul(ns, dsv4_sat_add(dsv4_sat_mul(8, H), 4)));
    return dsv4_sat_add(w, dsv4_sat_mul(dsv4_sat_mul(t, H), 4));
}

/* The executor layout model of a chunk of tc tokens (0 for tc <= 0). */
uint64_t dsv4_mem_layout_bytes(const dsv4_config *c, const dsv4_shard *sh, int64_t tc, dsv4_executor_kind ex)
{
    if (tc <= 0)
        return 0;
    uint64_t t = (uint64_t)tc, E = (uint64_t)c->n_routed_experts, K = (uint64_t)c->n_activated;
    uint64_t H = (uint64_t)c->dim, El = (uint64_t)sh->e_count, tg, s;
    dsv4_mem_chunk_shape(c, sh, tc, &tg, &s);
    uint64_t w = dsv4_sat_add(dsv4_sat_mul(dsv4_sat_mul(t, E), 4), dsv4_sat_mul(dsv4_sat_mul(t, K), 8));
    bool dp = sh->router == DSV4_ROUTER_DP_ALL_GATHER;
    bool ep = sh->router == DSV4_ROUTER_EP_ALL_TO_ALL || sh->router == DSV4_ROUTER_EP_LOW_LATENCY;
    if (dp)
        w = dsv4_sat_add(w, dsv4_sat_add(dsv4_sat_mul(tg, act_bytes(c, c->dim)), dsv4_sat_mul(dsv4_sat_mul(tg, K), 8)));
    w = dsv4_sat_add(w, dsv4_sat_add(dsv4_sat_mul(s, 8), dsv4_sat_mul(El, 8)));
    w = dsv4_sat_add(w, dsv4_sat_mul(exec_rows(c, sh, tc, ex), dsv4_mem_row_bytes(c, sh->i_count, sh->gemm)));
    w = dsv4_sat_add(w, dsv4_sat_mul(dsv4_sat_mul(dp ? tg : t, H), 4));
    if (ep) {
        w = dsv4_sat_add(w, dsv4_sat_mul(dsv4_sat_mul(2, s), act_bytes(c, c->dim)));
        w = dsv4_sat_add(w, dsv4_sat_mul(dsv4_sat_mul(dsv4_sat_mul(2, s), H), 2));
    }
    return w;
}

