/*
 * Part of fast/cuda/cuda.cu's translation unit, included by it (inside its anonymous namespace, after
 * the forward and the vtable); not a header of its own. The weights at creation: matrix sizes and
 * views of the checkpoint, the exact path's upload, the kernel variants of
 * dsv4_backend_options.params (parse_kernels, set_kernels, want_fast), the fragment-native
 * repack (upload_fast) and the e4m3 conversion for the grouped FP8 GEMM (upload_fp8). Split out of
 * cuda.cu to keep files under 1000 lines; the code is unchanged.
 */
#ifndef DSV4MOE_CUDA_UPLOAD_CUH
#define DSV4MOE_CUDA_UPLOAD_CUH
/* Bytes of the data / scales of one [n, k] matrix in format fmt. */
void mat_bytes(int fmt, int sfp32, int64_t n, int64_t k, uint64_t *data, uint64_t *scales)
{
    if (fmt == DSV4_FORMAT_FP4) {
        *data = (uint64_t)(n * k / 2);
        *scales = (uint64_t)(n * (k / 32));
    } else if (fmt == DSV4_FORMAT_FP8) {
        *data = (uint64_t)(n * k);
        *scales = (uint64_t)(cdiv(n, 128) * cdiv(k, 128)) * (sfp32 ? 4 : 1);
    } else {
        *data = (uint64_t)(n * k) * 2;
        *scales = 0;
    }
}

/* What a backend binds of its layer `full`: routed experts [e_first, e_first + e_count) (ep) and
   rows [i_first, i_first + i_count) of moe_inter_dim (tp): gate/up rows, down columns. */
struct Shard {
    const dsv4_config *full;
    int64_t e_first, e_count, i_first, i_count;
};

Shard shard_of(const CudaBe *b) { return Shard{&b->full, b->e_first, b->e_count, b->i_first, b->cfg.moe_inter_dim}; }

/*
 * v (a projection of the full layer, in its config's format) cut to the shard's inter range: gate
 * and up keep rows [i0, i0 + ni) (the data and the scales move by whole rows / 128-row blocks),
 * down keeps columns [i0, i0 + ni) (the data moves inside each row; the scales, whose rows are no
 * longer contiguous, are copied into a buffer owned through *sbuf). The planner splits
 * moe_inter_dim at whole scale blocks (128 for fp8, 32 for fp4): checked again here.
 */
dsv4_status slice_inter(dsv4_matrix_view *v, int p, int64_t i0, int64_t ni, uint8_t **sbuf, dsv4_error *err)
{
    const int64_t blk = v->format == DSV4_FORMAT_FP8 ? 128 : v->format == DSV4_FORMAT_FP4 ? 32 : 1;
    if (i0 % blk || ni % blk)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, v->key,
                           "inter rows [%lld, %lld) do not hold whole %lld-wide scale blocks", (long long)i0,
                           (long long)(i0 + ni), (long long)blk);
    const uint64_t esz = v->format == DSV4_FORMAT_FP8 && v->scale_format == DSV4_SCALE_FP32 ? 4 : 1;
    if (p != DSV4_PROJ_W2) {
        v->data += (uint64_t)i0 * v->row_bytes;
        if (v->format == DSV4_FORMAT_FP4)
            v->scales += (uint64_t)(i0 * (v->k / 32));
        else if (v->format == DSV4_FORMAT_FP8)
            v->scales += (uint64_t)(i0 / 128 * cdiv(v->k, 128)) * esz;
        v->n = ni;
        return DSV4_OK;
    }
    v->data += v->format == DSV4_FORMAT_FP4 ? (uint64_t)i0 / 2 : v->format == DSV4_FORMAT_FP8 ? (uint64_t)i0 : (uint64_t)i0 * 2;
    if (v->format == DSV4_FORMAT_FP4 || v->format == DSV4_FORMAT_FP8) {
        /* scale rows: fp4 one per row, 1 byte per 32 columns; fp8 one per 128 rows, esz per 128 columns */
        const bool f4 = v->format == DSV4_FORMAT_FP4;
        const int64_t srows = f4 ? v->n : cdiv(v->n, 128), per = f4 ? 32 : 128;
        const uint64_t from = (uint64_t)(cdiv(v->k, per)) * esz, take = (uint64_t)(ni / per) * esz;
        uint8_t *ns = (uint8_t *)malloc((size_t)(srows * take) + 1);
        if (!ns)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory slicing the scales");
        for (int64_t r = 0; r < srows; r++)
            memcpy(ns + r * take, v->scales + r * from + (uint64_t)(i0 / per) * esz, (size_t)take);
        free(*sbuf);
        *sbuf = ns;
        v->scales = ns;
    }
    v->k = ni;
    return DSV4_OK;
}

/*
 * The view of one matrix of the shard in the wanted format: as stored, or (a bf16 stacked
 * checkpoint under a quantized config) quantized here on the host exactly as the reference does
 * (the whole matrix, so the scale blocks are the reference's), then cut to the shard's inter
 * range. *qbuf / *sbuf own the bytes made here (NULL when the view is used as stored).
 */
dsv4_status view_as(const dsv4_checkpoint *ck, const Shard &sh, int64_t e, int p, dsv4_matrix_view *v,
                    uint8_t **qbuf, uint8_t **sbuf, dsv4_error *err)
{
    const dsv4_config *c = sh.full;
    *qbuf = *sbuf = nullptr;
    dsv4_status st = dsv4_weights_matrix(ck, c, e, (dsv4_proj)p, v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
    if (v->format != want) {
        int64_t n = v->n, k = v->k;
        float *w = (float *)malloc((size_t)(n * k) * sizeof *w);
        if (!w)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory quantizing at load");
        dsv4_matrix_dequant_rows(v, 0, n, w);
        uint64_t db, sb;
        int sfp32 = want == DSV4_FORMAT_FP8 && c->weight_scale == DSV4_SCALE_FP32;
        mat_bytes(want, sfp32, n, k, &db, &sb);
        *qbuf = (uint8_t *)malloc(db);
        *sbuf = (uint8_t *)malloc(sb ? sb : 1);
        if (!*qbuf || !*sbuf)
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory quantizing at load");
        else if (want == DSV4_FORMAT_FP8)
            st = dsv4_quant_fp8_block(w, n, k, c->weight_scale, *qbuf, *sbuf, v->key, err);
        else
            st = dsv4_quant_fp4_block(w, n, k, *qbuf, *sbuf, v->key, err);
        free(w);
        if (!st) {
            v->format = want;
            v->scale_format = c->weight_scale;
            v->data = *qbuf;
            v->scales = *sbuf;
            v->row_bytes = want == DSV4_FORMAT_FP8 ? (uint64_t)k : (uint64_t)k / 2;
        }
    }
    if (!st && sh.i_count != c->moe_inter_dim)
        st = slice_inter(v, p, sh.i_first, sh.i_count, sbuf, err);
    if (st) {
        free(*qbuf), free(*sbuf);
        *qbuf = *sbuf = nullptr;
    }
    return st;
}

/* The base the kernels index by expert id (base + e stride) for an allocation holding the
   shard's experts [first, first + count): the allocation less first strides, formed as an
   integer. The kernels add the stride of a bound expert only (a rank's rows name its experts),
   so every address they read is inside the allocation. */
template <typename T> T *expert_base(T *alloc, int64_t first, uint64_t stride_bytes)
{
    return (T *)(uintptr_t)((uintptr_t)alloc - (uintptr_t)first * (uintptr_t)stride_bytes);
}

/* Uploads projection p of the shard's routed experts (the shared expert: one matrix) in its
   format; m->w / m->s are the expert-indexed bases (expert_base) of m->mem_w / m->mem_s. */
dsv4_status upload(CudaBe *b, const dsv4_checkpoint *ck, bool shared, int p, DevMat *m, dsv4_error *err)
{
    const Shard sh = shard_of(b);
    const int64_t first = shared ? 0 : sh.e_first, count = shared ? 1 : sh.e_count;
    for (int64_t i = 0; i < count; i++) {
        dsv4_matrix_view v;
        uint8_t *qb, *sb;
        dsv4_status st = view_as(ck, sh, shared ? DSV4_SHARED_EXPERT : first + i, p, &v, &qb, &sb, err);
        if (st)
            return st;
        int sfp32 = v.format == DSV4_FORMAT_FP8 && v.scale_format == DSV4_SCALE_FP32;
        uint64_t db, sbytes;
        mat_bytes(v.format, sfp32, v.n, v.k, &db, &sbytes);
        if (i == 0) {
            m->n = (int)v.n, m->k = (int)v.k, m->fmt = (int)v.format, m->sfp32 = sfp32;
            m->w_stride = (long long)align256(db), m->s_stride = (long long)align256(sbytes);
            cudaError_t ce = cudaMalloc((void **)&m->mem_w, (size_t)(m->w_stride * count));
            if (ce == cudaSuccess)
                ce = cudaMalloc((void **)&m->mem_s, (size_t)(m->s_stride * count));
            if (ce != cudaSuccess) {
                free(qb), free(sb);
                return dsv4_seterr(err, DSV4_ERR_NOMEM, v.key, "cudaMalloc of %llu bytes of weights failed: %s",
                                   (unsigned long long)(m->w_stride * count), cudaGetErrorString(ce));
            }
            b->weight_bytes += (uint64_t)((m->w_stride + m->s_stride) * count);
            m->w = expert_base(m->mem_w, first, (uint64_t)m->w_stride);
            m->s = expert_base(m->mem_s, first, (uint64_t)m->s_stride);
        } else if ((int)v.format != m->fmt || sfp32 != m->sfp32 || v.n != m->n || v.k != m->k) {
            free(qb), free(sb);
            return dsv4_seterr(err, DSV4_ERR_SHAPE, v.key,
                               "format or shape differs from the first expert's (every routed expert must share them)");
        }
        uint64_t natural = v.format == DSV4_FORMAT_FP4 ? (uint64_t)v.k / 2
                           : v.format == DSV4_FORMAT_FP8 ? (uint64_t)v.k
                                                         : (uint64_t)v.k * 2;
        cudaError_t ce = cudaMemcpy2D(m->mem_w + i * m->w_stride, natural, v.data, v.row_bytes, natural, (size_t)v.n,
                                      cudaMemcpyHostToDevice);
        if (ce == cudaSuccess && sbytes)
            ce = cudaMemcpy(m->mem_s + i * m->s_stride, v.scales, sbytes, cudaMemcpyHostToDevice);
        free(qb), free(sb);
        if (ce != cudaSuccess)
            return dsv4_seterr(err, DSV4_ERR_DEVICE, v.key, "upload failed: %s", cudaGetErrorString(ce));
    }
    return DSV4_OK;
}

/*
 * What upload_fast decides from the fp4 scale bytes of the routed experts (a byte above
 * DSV4_FN_FP4_SCALE_MAX: the fp8 path cannot hold it, the backend takes the exact kernels; bytes
 * outside [DSV4_FH_SCALE_LO, DSV4_FH_SCALE_HI]: large groups on mma.sync, not k_tileh), over the
 * whole layer for a backend that binds a shard of it: the kernels a row meets are then the same
 * on every rank and on one rank holding every expert (the single-rank counterpart's bit identity).
 * Reads every expert's scales (quantizing at load where the checkpoint is bf16); no-op for fp8.
 */
dsv4_status layer_fp4_scales(const CudaBe *b, const dsv4_checkpoint *ck, bool *unsupported, bool *no_f16,
                             dsv4_error *err)
{
    const dsv4_config *c = &b->full;
    *unsupported = *no_f16 = false;
    if (c->routed_format != DSV4_FORMAT_FP4 ||
        (b->e_count == c->n_routed_experts && b->cfg.moe_inter_dim == c->moe_inter_dim))
        return DSV4_OK;
    const Shard all{c, 0, c->n_routed_experts, 0, c->moe_inter_dim};
    for (int64_t e = 0; e < c->n_routed_experts && !*unsupported; e++)
        for (int p = 0; p < 3 && !*unsupported; p++) {
            dsv4_matrix_view v;
            uint8_t *qb, *sb;
            dsv4_status st = view_as(ck, all, e, p, &v, &qb, &sb, err);
            if (st)
                return st;
            const uint64_t nbytes = (uint64_t)(v.n * (v.k / 32));
            for (uint64_t i = 0; i < nbytes; i++) {
                const uint8_t s = v.scales[i];
                *unsupported |= s > DSV4_FN_FP4_SCALE_MAX;
                *no_f16 |= s < DSV4_FH_SCALE_LO || s > DSV4_FH_SCALE_HI;
            }
            free(qb), free(sb);
        }
    return DSV4_OK;
}

/* The kernel variants of dsv4_backend_options.params (backend.h); the defaults when empty. */
struct Kernels {
    bool exact_path = false, mma_tiles = false;
    int big_var = 0, mid_var = 0, fp8_cut = DSV4C_FP8_CUT_ROWS;
    bool fp8_rows = false; /* fp8_scales=rows: the FP8 GEMM's weight scales per row even where blocks convert */
    int dec_fill = DSV4C_DEC_FILL; /* dec_fill=N: k_dec splits K until its blocks reach N per multiprocessor */
    bool pdl = true;               /* pdl=off: every launch plain */
    bool route_fused = true;       /* route=split: the GEMM logits, k_router and k_count2 at every chunk size */
    bool route_one = false;        /* route=one: k_route_small where it fits (route_small.cuh) */
    bool shared_dec_one = false;   /* shared_dec=one: k_dec_mix (dec_mix.cu) instead of a forked k_dec */
    int dec_minb = 3;              /* dec_regs=128: the decode kernels at 2 blocks per multiprocessor, not 3 */
    int dec_ring = 0;              /* dec_ring=deep|bulk: k_dec's rings 8 (fp4) / 4 (fp8) K blocks deep, not 4 / 3, filled by
                                      per-lane or bulk copies (RING_*, mma_parts.cuh) */
    bool quant_fold = false;       /* quant=fold: k_dec quantizes h (fold_quant, mma_parts.cuh) instead of k_quant */
    bool quant_auto = false;       /* quant=auto: as fold, but chunks of one row keep k_quant */
    bool quant_down = false;       /* quant=down: the down projection's k_dec quantizes h as it reads it (dec_qin.cuh) */
    int route_code = 0;            /* route_code=lean|warm: k_router_count compiled for the decode configuration, with a
                                      dry pass before its wait (ROUTE_CODE_*, router_count.cuh) */
    bool dec_pf = false;           /* dec_pf=l2: k_dec_mix's blocks prefetch their weights into L2 (dec_prefetch) */
    bool dec_early = false;        /* dec_pf=early: k_dec's first-wave blocks prefetch theirs before the wait (dec_early) */
    bool shared_early = false;     /* shared_gu=early: the forked shared gate/up launched after k_logits_small, not the router */
    bool dec_persist = false;      /* dec_sched=persist: k_dec_mix on persistent blocks (dec_mix.cu) */
    bool combine_fold = true;      /* combine=kernel: k_combine after the down projection at every chunk size */
    bool dec_slab = false;         /* dec_b=smem: k_dec stages B in shared memory where K is not split (mma_parts.cuh) */
    int logits_tg = 4;             /* logits_tg=1: k_logits_small loads one token's x at a time (router.cuh) */
    bool logits_loop = true;       /* logits_loop=off: k_logits_small's tokens unrolled, not in a loop (route_parts.cuh) */
    bool weights_warp = false;     /* weights=warp: k_router_count's weights on the selecting warp (route_parts.cuh) */
    bool group_warp = false;       /* group=warp: k_router_count groups chunks of up to 32 slots with one warp (group_parts.cuh) */
    bool logits_blas = true;       /* logits=tiles: the GEMM logits of large chunks on k_tiles, not cuBLASLt (logits_blas.cuh) */
    bool logits_asked = false;     /* logits= named: a layer cuBLASLt has no algorithm for fails creation instead of taking k_tiles */
    bool gather_quant = false;     /* gather=quant: x quantized and gathered in one pass (quant_x8.cuh), not by the router and k_gather8 */
    bool router_warp = true;       /* router=block: large chunks routed a block a token (k_router), not a warp a token (router_warp.cuh) */
    int direct = TILE8_OFF;        /* direct=b128|b64|q64: gemm fp8's routed fp4 tile groups on k_tile8 (tile8.cuh) */
    bool quant8_lean = true;       /* quant8=std: k_quant8's same values by its former instructions (quant8.cu) */
};

#define KERNEL_KEYS "path, tile, tileh, mid, fp8_cut, fp8_scales, dec_fill, pdl, route, combine, dec_b, logits_tg, shared_dec, dec_regs, quant, dec_pf, shared_gu, dec_sched, group, dec_ring, logits_loop, weights, logits, gather, router, direct, quant8"

dsv4_status parse_kernels(const char *spec, Kernels *k, dsv4_error *err)
{
    *k = Kernels();
    dsv4_param it;
    int more;
    bool gather_copy = false, router_asked = false;
    while ((more = dsv4_params_next(&spec, &it, "cuda", KERNEL_KEYS, err)) > 0) {
        const char *v = it.val;
        const size_t vl = it.val_len;
        auto is = [&](const char *key) { return dsv4_param_key_is(&it, key); };
        auto val = [&](const char *s) { return dsv4_param_val_is(&it, s); };
        bool ok = true;
        if (is("path"))
            ok = val("exact") || val("auto"), k->exact_path = val("exact");
        else if (is("tile"))
            ok = val("mma") || val("wgmma"), k->mma_tiles = val("mma");
        else if (is("tileh"))
            ok = (k->big_var = tileh_pick(tileh_big, N_TILEH_BIG, v, vl)) >= 0;
        else if (is("mid"))
            ok = (k->mid_var = tileh_pick(tileh_mid, N_TILEH_MID, v, vl)) >= 0;
        else if (is("fp8_scales"))
            ok = val("auto") || val("rows"), k->fp8_rows = val("rows");
        else if (is("pdl"))
            ok = val("on") || val("off"), k->pdl = val("on");
        else if (is("route"))
            ok = val("fused") || val("split") || val("one"), k->route_fused = !val("split"), k->route_one = val("one");
        else if (is("combine"))
            ok = val("fold") || val("kernel"), k->combine_fold = val("fold");
        else if (is("dec_b"))
            ok = val("l1") || val("smem"), k->dec_slab = val("smem");
        else if (is("group"))
            ok = val("block") || val("warp"), k->group_warp = val("warp");
        else if (is("logits_tg"))
            ok = val("1") || val("4"), k->logits_tg = val("4") ? 4 : 1;
        else if (is("shared_dec"))
            ok = val("fork") || val("one"), k->shared_dec_one = val("one");
        else if (is("weights"))
            ok = val("thread") || val("warp"), k->weights_warp = val("warp");
        else if (is("logits_loop"))
            ok = val("off") || val("on"), k->logits_loop = val("on");
        else if (is("logits"))
            ok = val("tiles") || val("blas"), k->logits_blas = val("blas"), k->logits_asked = true;
        else if (is("gather"))
            ok = val("copy") || val("quant"), k->gather_quant = val("quant"), gather_copy = val("copy");
        else if (is("router"))
            ok = val("block") || val("warp"), k->router_warp = val("warp"), router_asked = true;
        else if (is("quant8"))
            ok = val("std") || val("lean"), k->quant8_lean = val("lean");
        else if (is("direct"))
            ok = val("off") || val("b128") || val("b64") || val("q64"),
            k->direct = val("b128") ? TILE8_B128 : val("b64") ? TILE8_B64 : val("q64") ? TILE8_Q64 : TILE8_OFF;
        else if (is("dec_ring"))
            ok = val("std") || val("deep") || val("bulk") || val("bulk_ef"),
            k->dec_ring = val("deep") ? RING_DEEP : val("bulk") ? RING_BULK : val("bulk_ef") ? RING_BULK_EF : RING_STD;
        else if (is("dec_regs"))
            ok = val("80") || val("128"), k->dec_minb = val("128") ? 2 : 3;
        else if (is("quant"))
            ok = val("kernel") || val("fold") || val("auto") || val("down"), k->quant_fold = val("fold") || val("auto"),
            k->quant_auto = val("auto"), k->quant_down = val("down");
        else if (is("dec_pf"))
            ok = val("off") || val("l2") || val("early"), k->dec_pf = val("l2"), k->dec_early = val("early");
        else if (is("shared_gu"))
            ok = val("late") || val("early"), k->shared_early = val("early");
        else if (is("route_code"))
            ok = val("full") || val("lean") || val("warm"),
            k->route_code = val("warm") ? ROUTE_CODE_WARM : val("lean") ? ROUTE_CODE_LEAN : ROUTE_CODE_FULL;
        else if (is("dec_sched"))
            ok = val("grid") || val("persist"), k->dec_persist = val("persist");
        else if (is("fp8_cut") || is("dec_fill")) {
            char buf[16] = {0};
            char *e = nullptr;
            memcpy(buf, v, vl < sizeof buf - 1 ? vl : sizeof buf - 1);
            const long c = strtol(buf, &e, 10);
            const bool cut = is("fp8_cut");
            ok = vl > 0 && vl < sizeof buf && *e == 0 && c >= (cut ? FM_DEC_MAX : 1) && c <= (cut ? FM_MID_MAX : 8);
            (cut ? k->fp8_cut : k->dec_fill) = (int)c;
        } else
            return dsv4_param_unknown_key(&it, "cuda", KERNEL_KEYS, err);
        if (!ok) {
            char allowed[768];
            snprintf(allowed, sizeof allowed,
                     "path auto|exact, tile wgmma|mma, tileh s128|s64x2|p64|s64|p128, mid mma|p32|s32, fp8_cut %d..%d, "
                     "fp8_scales auto|rows, dec_fill 1..8, pdl on|off, route fused|split|one, combine fold|kernel, dec_b "
                     "l1|smem, logits_tg 1|4, shared_dec fork|one, dec_regs 80|128, quant kernel|fold|auto, dec_pf off|l2|early, shared_gu late|early, dec_sched grid|persist, group block|warp, dec_ring std|deep|bulk|bulk_ef, logits_loop off|on, weights thread|warp, logits tiles|blas, gather copy|quant, router block|warp, direct off|b128|b64|q64, quant8 std|lean",
                     FM_DEC_MAX, FM_MID_MAX);
            return dsv4_param_bad_value(&it, "cuda", allowed, err);
        }
    }
    /* router=warp (the default) gathers x by k_quant_x8 (gather=quant): gather=copy alone asks for
       k_gather8, so it takes the block router too; gather=copy,router=warp stays what it says */
    if (gather_copy && !router_asked)
        k->router_warp = false;
    return more ? DSV4_ERR_INVALID_ARG : DSV4_OK;
}

/* The kernel choice for large and mid-size groups. */
void set_kernels(CudaBe *b, const Kernels &k = Kernels())
{
    b->tile16 = !k.mma_tiles;
    b->big_var = k.big_var;
    b->mid_var = k.mid_var;
    b->fp8_cut = k.fp8_cut;
    b->fp8_rows = k.fp8_rows;
    b->dec_fill = k.dec_fill;
    b->pdl = k.pdl;
    b->route_fused = k.route_fused;
    b->route_one = k.route_one;
    b->shared_dec_one = k.shared_dec_one;
    b->dec_minb = k.dec_minb;
    b->dec_ring = k.dec_ring;
    b->quant_fold = k.quant_fold;
    b->quant_auto = k.quant_auto;
    b->quant_down = k.quant_down;
    b->route_code = k.route_code;
    b->dec_pf = k.dec_pf;
    b->dec_early = k.dec_early;
    b->shared_early = k.shared_early;
    b->dec_persist = k.dec_persist;
    b->combine_fold = k.combine_fold;
    b->dec_slab = k.dec_slab;
    b->logits_tg = k.logits_tg;
    b->logits_loop = k.logits_loop;
    b->gather_quant = k.gather_quant || k.router_warp; /* k_router_warp does not quantize x: k_quant_x8 does */
    b->router_warp = k.router_warp;
    b->quant8_lean = k.quant8_lean;
    b->weights_warp = k.weights_warp;
    b->group_warp = k.group_warp;
    b->direct = k.direct;
    b->big_rows = b->tile16 ? tileh_big[b->big_var].bn : 128;
}

/* Whether the config takes the fp8 tensor-core path (the weights are checked at upload too). */
bool want_fast(const dsv4_config *c, bool exact_path = false)
{
    if (exact_path)
        return false;
    bool rq = c->routed_format == DSV4_FORMAT_FP4 || c->routed_format == DSV4_FORMAT_FP8;
    bool sq = c->n_shared_experts == 0 || c->shared_format == DSV4_FORMAT_FP8;
    return c->act_quant != DSV4_ACT_QUANT_NONE && rq && sq && c->dim % 128 == 0 && c->moe_inter_dim % 128 == 0;
}

/* One batch of experts repacked on the host (in parallel over experts), then uploaded. */
struct RepackJob {
    const dsv4_checkpoint *ck;
    Shard sh;
    bool shared, gu;
    int64_t e0, n, k;
    uint64_t wbytes, sbytes;
    uint8_t *hw, *hs;
    dsv4_status *st;
    dsv4_error *errs;
    int *fmt;
    uint8_t *smin, *smax; /* fp4: per expert, the smallest and largest scale byte */
};

void repack_range(void *ctx, int64_t begin, int64_t end)
{
    RepackJob *j = (RepackJob *)ctx;
    for (int64_t i = begin; i < end; i++) {
        const int64_t e = j->shared ? DSV4_SHARED_EXPERT : j->e0 + i;
        dsv4_matrix_view v[2];
        uint8_t *qb[2] = {nullptr, nullptr}, *sb[2] = {nullptr, nullptr};
        const int nv = j->gu ? 2 : 1;
        dsv4_status st = DSV4_OK;
        for (int m = 0; m < nv && !st; m++)
            st = view_as(j->ck, j->sh, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v[m], &qb[m], &sb[m],
                         &j->errs[i]);
        if (!st) {
            dsv4_fn_src src[2];
            for (int m = 0; m < nv; m++) {
                src[m].data = v[m].data, src[m].row_bytes = v[m].row_bytes, src[m].scales = v[m].scales;
                src[m].sfp32 = v[m].format == DSV4_FORMAT_FP8 && v[m].scale_format == DSV4_SCALE_FP32;
            }
            j->fmt[i] = (int)v[0].format;
            uint8_t *dw = j->hw + (uint64_t)i * j->wbytes, *ds = j->hs + (uint64_t)i * j->sbytes;
            if (v[0].n != j->n || v[0].k != j->k || (nv == 2 && (v[1].n != v[0].n || v[1].k != v[0].k ||
                                                                                v[1].format != v[0].format))) {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_SHAPE, v[0].key, "shape or format differs from the config's");
            } else if (v[0].format == DSV4_FORMAT_FP4) {
                int which = 0;
                int64_t row = 0, grp = 0;
                if (dsv4_fn_repack_fp4(&src[0], nv == 2 ? &src[1] : nullptr, j->n, j->k, dw, ds, &which, &row, &grp,
                                       &j->smin[i], &j->smax[i]))
                    st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v[which].key,
                                     "scale byte of row %lld, group %lld is above %d: the fp8 tensor-core path cannot "
                                     "hold it exactly",
                                     (long long)row, (long long)grp, DSV4_FN_FP4_SCALE_MAX);
            } else if (v[0].format == DSV4_FORMAT_FP8) {
                dsv4_fn_repack_fp8(&src[0], nv == 2 ? &src[1] : nullptr, j->n, j->k, dw, (float *)(void *)ds);
            } else {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v[0].key, "bf16 weights take the exact path");
            }
        }
        for (int m = 0; m < 2; m++)
            free(qb[m]), free(sb[m]);
        j->st[i] = st;
    }
}

/*
 * Uploads projection `gu` (gate/up interleaved) or down of the routed experts or the shared one
 * into the fragment-native layout (fp[slot], buffers fbuf[2 slot], fbuf[2 slot + 1]).
 * DSV4_ERR_UNSUPPORTED: the weights cannot take the fp8 path (the caller falls back).
 */
dsv4_status upload_fast(CudaBe *b, const dsv4_checkpoint *ck, bool shared, bool gu, int threads, int slot,
                        dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const Shard sh = shard_of(b);
    const int64_t first = shared ? 0 : sh.e_first, count = shared ? 1 : sh.e_count;
    const int64_t n = gu ? c->moe_inter_dim : c->dim, k = gu ? c->dim : c->moe_inter_dim;
    const int fmt = shared ? c->shared_format : c->routed_format;
    uint64_t wbytes, sbytes;
    dsv4_fn_sizes(fmt == DSV4_FORMAT_FP4, n, k, gu, &wbytes, &sbytes);
    const uint64_t ws = align256(wbytes), ss = align256(sbytes);
    cudaError_t ce = cudaMalloc((void **)&b->fbuf[2 * slot], (size_t)(ws * count));
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&b->fbuf[2 * slot + 1], (size_t)(ss * count));
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of %llu bytes of weights failed: %s",
                           (unsigned long long)(ws * count), cudaGetErrorString(ce));
    b->fbuf_bytes[2 * slot] = ws * (uint64_t)count, b->fbuf_bytes[2 * slot + 1] = ss * (uint64_t)count;
    b->weight_bytes += (ws + ss) * (uint64_t)count;
    FProj &f = b->fp[slot];
    f.w = expert_base(b->fbuf[2 * slot], first, ws), f.s = expert_base(b->fbuf[2 * slot + 1], first, ss);
    f.w_stride = (long long)ws, f.s_stride = (long long)ss;
    f.fmt = fmt == DSV4_FORMAT_FP4 ? WF_FP4 : WF_FP8;
    const int64_t batch = std::min<int64_t>(count, 16);
    uint8_t *hw = (uint8_t *)malloc((size_t)(wbytes * batch)), *hsb = (uint8_t *)malloc((size_t)(sbytes * batch));
    dsv4_status *sts = (dsv4_status *)calloc((size_t)batch, sizeof *sts);
    dsv4_error *errs = (dsv4_error *)calloc((size_t)batch, sizeof *errs);
    int *fmts = (int *)calloc((size_t)batch, sizeof *fmts);
    uint8_t *smin = (uint8_t *)calloc((size_t)batch, 1), *smax = (uint8_t *)calloc((size_t)batch, 1);
    dsv4_status st = DSV4_OK;
    if (!hw || !hsb || !sts || !errs || !fmts || !smin || !smax)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory repacking weights");
    for (int64_t e0 = 0; e0 < count && !st; e0 += batch) {
        RepackJob j;
        j.ck = ck, j.sh = sh, j.shared = shared, j.gu = gu, j.e0 = first + e0, j.n = n, j.k = k;
        j.wbytes = wbytes, j.sbytes = sbytes, j.hw = hw, j.hs = hsb, j.st = sts, j.errs = errs, j.fmt = fmts;
        j.smin = smin, j.smax = smax;
        const int64_t m = std::min(batch, count - e0);
        dsv4_parallel_for(threads, m, 1, repack_range, &j);
        for (int64_t i = 0; i < m && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            } else if (fmts[i] != fmt) {
                st = dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE, "expert %lld is stored in another format",
                                 (long long)(first + e0 + i));
            } else if (fmt == DSV4_FORMAT_FP4 && (smin[i] < DSV4_FH_SCALE_LO || smax[i] > DSV4_FH_SCALE_HI)) {
                b->tile16 = false; /* its values would not all be f16 values: large groups take mma.sync */
                b->big_rows = 128;
            }
        }
        for (int64_t i = 0; i < m && !st; i++) {
            ce = cudaMemcpy(b->fbuf[2 * slot] + (e0 + i) * ws, hw + i * wbytes, (size_t)wbytes, cudaMemcpyHostToDevice);
            if (ce == cudaSuccess)
                ce = cudaMemcpy(b->fbuf[2 * slot + 1] + (e0 + i) * ss, hsb + i * sbytes, (size_t)sbytes,
                                cudaMemcpyHostToDevice);
            if (ce != cudaSuccess)
                st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "weight upload failed: %s", cudaGetErrorString(ce));
        }
    }
    free(hw), free(hsb), free(sts), free(errs), free(fmts), free(smin), free(smax);
    return st;
}

/* gemm fp8: one batch of experts' row-major e4m3 copies (gate|up stacked, or down) with one scale
   per block of br rows (1 or 128) and 128 of K. */
struct Fp8Job {
    const dsv4_checkpoint *ck;
    Shard sh;
    bool shared, gu;
    int64_t e0, n, k, br; /* rows of one projection, inner dimension, rows per scale */
    uint8_t *hw;          /* [batch][rows, k] */
    float *hs;            /* [batch][k / 128][rows / br] */
    uint8_t *ok;          /* [batch]: every block converted exactly */
    uint8_t *rows_ok;     /* [batch]: with br 128, whether every 1x128 group would (ok or not) */
    dsv4_status *st;
    dsv4_error *errs;
};

void fp8_range(void *ctx, int64_t begin, int64_t end)
{
    Fp8Job *j = (Fp8Job *)ctx;
    const int nv = j->gu ? 2 : 1;
    const int64_t rows = nv * j->n, ng = j->k / 128, sr = rows / j->br;
    for (int64_t i = begin; i < end; i++) {
        const int64_t e = j->shared ? DSV4_SHARED_EXPERT : j->e0 + i;
        uint8_t *dw = j->hw + (uint64_t)(i * rows * j->k);
        float *ds = j->hs + (uint64_t)(i * sr * ng);
        dsv4_status st = DSV4_OK;
        j->ok[i] = 1;
        j->rows_ok[i] = 1;
        for (int m = 0; m < nv && !st; m++) {
            dsv4_matrix_view v;
            uint8_t *qb = nullptr, *sb = nullptr;
            st = view_as(j->ck, j->sh, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v, &qb, &sb,
                         &j->errs[i]);
            uint8_t *dm = dw + (uint64_t)(m * j->n * j->k);
            float *dsm = ds + m * (j->n / j->br);
            if (!st && (v.n != j->n || v.k != j->k))
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_SHAPE, v.key, "shape differs from the config's");
            else if (!st && v.format == DSV4_FORMAT_FP4) {
                if (dsv4_fp4_to_e4m3_blocks(v.data, v.row_bytes, v.scales, j->n, j->k, j->br, dm, (uint64_t)j->k, dsm,
                                            sr, 1, nullptr, nullptr)) {
                    j->ok[i] = 0;
                    if (j->br > 1 && dsv4_fp4_scales_beyond_e4m3(v.scales, j->n, j->k))
                        j->rows_ok[i] = 0;
                }
            } else if (!st && v.format == DSV4_FORMAT_FP8) {
                dsv4_fp8_to_e4m3_blocks(v.data, v.row_bytes, v.scales, v.scale_format, j->n, j->k, j->br, dm,
                                        (uint64_t)j->k, dsm, sr, 1);
            } else if (!st) {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v.key, "bf16 weights have no fp8 GEMM");
            }
            free(qb), free(sb);
        }
        if (j->br == 1)
            j->rows_ok[i] = j->ok[i];
        j->st[i] = st;
    }
}

/* params direct=: whether every routed expert of the layer is fp4 and each of its 1x128 groups
   converts to e4m3 exactly (dsv4_fp4_scales_beyond_e4m3 of w1, w3 and w2: the test k_tile8's
   conversion needs, mma_tile8.cuh), read from the scales alone; *yes gets it. Over the whole layer,
   not the backend's shard, for layer_fp4_scales' reason: every rank of a sharded layer, and one
   rank holding all of it, then take the same path. */
struct DirectJob {
    const dsv4_checkpoint *ck;
    Shard sh;
    int64_t e0;
    uint8_t *ok;
    dsv4_status *st;
    dsv4_error *errs;
};

void direct_range(void *ctx, int64_t begin, int64_t end)
{
    DirectJob *j = (DirectJob *)ctx;
    for (int64_t i = begin; i < end; i++) {
        j->ok[i] = 1;
        j->st[i] = DSV4_OK;
        static const int projs[3] = {DSV4_PROJ_W1, DSV4_PROJ_W3, DSV4_PROJ_W2};
        for (int p = 0; p < 3 && j->ok[i] && !j->st[i]; p++) {
            dsv4_matrix_view v;
            uint8_t *qb = nullptr, *sb = nullptr;
            j->st[i] = view_as(j->ck, j->sh, j->e0 + i, projs[p], &v, &qb, &sb, &j->errs[i]);
            if (!j->st[i])
                j->ok[i] = v.format == DSV4_FORMAT_FP4 && dsv4_fp4_scales_beyond_e4m3(v.scales, v.n, v.k) == 0;
            free(qb), free(sb);
        }
    }
}

dsv4_status routed_convert_rows(CudaBe *b, const dsv4_checkpoint *ck, int threads, bool *yes, dsv4_error *err)
{
    const dsv4_config *c = &b->full;
    const Shard sh{c, 0, c->n_routed_experts, 0, c->moe_inter_dim};
    *yes = false;
    uint8_t *ok = (uint8_t *)calloc((size_t)sh.e_count + 1, 1);
    dsv4_status *sts = (dsv4_status *)calloc((size_t)sh.e_count + 1, sizeof *sts);
    dsv4_error *errs = (dsv4_error *)calloc((size_t)sh.e_count + 1, sizeof *errs);
    dsv4_status st = DSV4_OK;
    if (!ok || !sts || !errs) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory checking the experts' scales");
    } else {
        DirectJob j = {ck, sh, sh.e_first, ok, sts, errs};
        dsv4_parallel_for(threads, sh.e_count, 1, direct_range, &j);
        bool all = true;
        for (int64_t i = 0; i < sh.e_count && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            }
            all = all && ok[i];
        }
        *yes = !st && all;
    }
    free(ok), free(sts), free(errs);
    return st;
}

/* gemm fp8: projection `gu` (gate|up) or down of the routed experts (slot 0 / 1) or the shared one
   (2 / 3) as row-major e4m3 with N-major scales of b->sfb_rows rows (gemm_fp8.h); ok[e] &= converted
   exactly. With 128-row scales, *lost counts the experts that a 128-row block refuses though every
   1x128 group of theirs converts (the caller then converts the layer per row instead). */
dsv4_status upload_fp8(CudaBe *b, const dsv4_checkpoint *ck, bool shared, bool gu, int threads, int slot,
                       uint8_t *ok, int64_t *lost, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const Shard sh = shard_of(b);
    const int64_t first = shared ? 0 : sh.e_first, count = shared ? 1 : sh.e_count, br = b->sfb_rows;
    const int64_t n = gu ? c->moe_inter_dim : c->dim, k = gu ? c->dim : c->moe_inter_dim, rows = (gu ? 2 : 1) * n;
    const uint64_t wbytes = (uint64_t)(rows * k), sbytes = (uint64_t)((rows / br) * (k / 128)) * 4;
    cudaError_t ce = cudaMalloc((void **)&b->w8mem[slot], (size_t)(wbytes * count));
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&b->s8mem[slot], (size_t)(sbytes * count));
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of %llu bytes of fp8 GEMM weights failed: %s",
                           (unsigned long long)(wbytes * count), cudaGetErrorString(ce));
    b->weight_bytes += (wbytes + sbytes) * (uint64_t)count;
    b->w8[slot] = expert_base(b->w8mem[slot], first, wbytes);
    b->s8[slot] = expert_base(b->s8mem[slot], first, sbytes);
    const int64_t batch = std::min<int64_t>(count, 16);
    uint8_t *hw = (uint8_t *)malloc((size_t)(wbytes * batch));
    float *hsb = (float *)malloc((size_t)(sbytes * batch));
    dsv4_status *sts = (dsv4_status *)calloc((size_t)batch, sizeof *sts);
    dsv4_error *errs = (dsv4_error *)calloc((size_t)batch, sizeof *errs);
    uint8_t *oks = (uint8_t *)calloc((size_t)batch * 2, 1);
    dsv4_status st = DSV4_OK;
    if (!hw || !hsb || !sts || !errs || !oks)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory converting weights for the fp8 GEMM");
    for (int64_t e0 = 0; e0 < count && !st; e0 += batch) {
        Fp8Job j;
        j.ck = ck, j.sh = sh, j.shared = shared, j.gu = gu, j.e0 = first + e0, j.n = n, j.k = k, j.br = br;
        j.hw = hw, j.hs = hsb, j.ok = oks, j.rows_ok = oks + batch, j.st = sts, j.errs = errs;
        const int64_t m = std::min(batch, count - e0);
        dsv4_parallel_for(threads, m, 1, fp8_range, &j);
        for (int64_t i = 0; i < m && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            }
            ok[first + e0 + i] &= oks[i];
            *lost += !oks[i] && j.rows_ok[i];
        }
        if (!st && ((ce = cudaMemcpy(b->w8mem[slot] + e0 * wbytes, hw, (size_t)(wbytes * m), cudaMemcpyHostToDevice)) !=
                        cudaSuccess ||
                    (ce = cudaMemcpy((uint8_t *)b->s8mem[slot] + e0 * sbytes, hsb, (size_t)(sbytes * m),
                                     cudaMemcpyHostToDevice)) != cudaSuccess))
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "fp8 GEMM weight upload failed: %s", cudaGetErrorString(ce));
    }
    free(hw), free(hsb), free(sts), free(errs), free(oks);
    return st;
}

/* A router tensor of n fp32 values to the device (NULL src: the layer has none), counted into the
   backend's weights. */
dsv4_status upload_f32(CudaBe *b, const float *src, size_t n, float **dst, const char *what, dsv4_error *err)
{
    *dst = nullptr;
    if (!src)
        return DSV4_OK;
    cudaError_t ce = cudaMalloc((void **)dst, n * sizeof(float));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of %s failed: %s", what, cudaGetErrorString(ce));
    b->weight_bytes += n * sizeof(float);
    return DSV4_OK;
}

/*
 * The device bytes of the weights a backend of the shard binds (the registry's weight model,
 * dsv4_plan_weight_bytes), as the uploads above allocate them: the router's tensors for every
 * expert (the gate as bf16, the bias, the norm predictor, tid2eid: every rank routes its own
 * tokens), and the shard's experts and inter range either on the fp8 path (fragment-native, plus
 * the e4m3 copies and ok8 under gemm fp8) or packed for the exact path, the larger of the two
 * (creation falls back from the first to the second when a scale cannot take the fp8 path). The
 * e4m3 copies' scales are counted one per row and 128 of K, the larger of their two layouts (a
 * layer converted per 128x128 block binds 1/128 of those bytes).
 */
uint64_t shard_weight_bytes(const Shard &sh, bool gemm_fp8)
{
    const dsv4_config *c = sh.full;
    dsv4_config lc = *c;
    lc.moe_inter_dim = sh.i_count;
    const int64_t H = c->dim, I = sh.i_count, E = c->n_routed_experts, K = c->n_activated, V = c->vocab_size;
    const bool has_sh = c->n_shared_experts > 0;
    uint64_t router = (uint64_t)(E * H) * 2 + (uint64_t)E * 4;
    if (c->top_p_predictor == DSV4_PREDICTOR_CONST)
        router += (uint64_t)E * 4;
    if (c->top_p_predictor == DSV4_PREDICTOR_LINEAR)
        router += (uint64_t)(E * H + E) * 4;
    if (dsv4_config_is_hash_layer(c))
        router += (uint64_t)(V * K) * 4;
    uint64_t exact = 0, fast = 0;
    for (int shared = 0; shared < (has_sh ? 2 : 1); shared++) {
        const uint64_t count = shared ? 1 : (uint64_t)sh.e_count;
        const int fmt = shared ? c->shared_format : c->routed_format;
        const int sfp32 = fmt == DSV4_FORMAT_FP8 && c->weight_scale == DSV4_SCALE_FP32;
        for (int p = 0; p < 3; p++) {
            uint64_t db, sb;
            mat_bytes(fmt, sfp32, p == DSV4_PROJ_W2 ? H : I, p == DSV4_PROJ_W2 ? I : H, &db, &sb);
            exact += (align256(db) + align256(sb)) * count;
        }
        for (int gu = 0; gu < 2; gu++) {
            const int64_t n = gu ? I : H, k = gu ? H : I;
            uint64_t wb, sb;
            dsv4_fn_sizes(fmt == DSV4_FORMAT_FP4, n, k, gu, &wb, &sb);
            fast += (align256(wb) + align256(sb)) * count;
            if (gemm_fp8) {
                const uint64_t rows = (uint64_t)((gu ? 2 : 1) * n);
                fast += (rows * (uint64_t)k + rows * (uint64_t)(k / 128) * 4) * count;
            }
        }
    }
    if (gemm_fp8)
        fast += (uint64_t)E + 1; /* ok8 */
    return router + (want_fast(&lc) && fast > exact ? fast : exact);
}

#endif
