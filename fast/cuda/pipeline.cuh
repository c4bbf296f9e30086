/*
 * Part of fast/cuda/cuda.cu's translation unit, included by it (inside its anonymous namespace, after
 * the backend's state `CudaBe`); not a header of its own. A chunk's pipeline on the stream: the
 * workspace layout of a chunk (layout_for), the launchers of the exact and fragment-path kernels,
 * the kernel variant tables, the regimes of one projection (launch_regimes), the fp8 path after
 * the router (enqueue_fast), one chunk (enqueue_chunk) and the caller-tensor copies of
 * dsv4_backend_enqueue (k_io_in, k_io_out). Split out of cuda.cu to keep files under 1000 lines;
 * the code is unchanged.
 */
#ifndef DSV4MOE_CUDA_PIPELINE_CUH
#define DSV4MOE_CUDA_PIPELINE_CUH
/* Split-K slices of the router logits for a chunk of tc tokens: enough blocks for the device. */
int logit_slices(const CudaBe *b, int64_t tc)
{
    const dsv4_config *c = &b->cfg;
    const int64_t kb = c->dim / 128, blocks = cdiv(tc, DSV4C_BM) * cdiv(c->n_routed_experts, DSV4C_BN);
    int s = 1;
    while (c->dim % 128 == 0 && kb % (2 * s) == 0 && blocks * 2 * s <= 2 * (int64_t)b->nsm)
        s *= 2;
    return s;
}

/* Whether a chunk of tc rows takes its router logits from a GEMM (k_tiles, or cuBLASLt with
   logits=blas): route=split, or more rows than k_logits_small (which also quantizes x) takes. */
bool gemm_logits(const CudaBe *b, int64_t tc) { return !b->route_fused || tc > DSV4C_LOGITS_SMALL; }

/* Ints at the layout's fcnt: the folded combine's counts, one per 16 rows of o (H / 16), then,
   with params quant=fold, the folded quantization's, one per group (E routed, the shared last)
   and 128 features of h. */
int64_t fold_counts(const CudaBe *b)
{
    const dsv4_config *c = &b->cfg;
    return c->dim / 16 + (b->quant_fold ? (c->n_routed_experts + 1) * (c->moe_inter_dim / 128) : 0);
}

/* The layout of a chunk of tc tokens whose grouping places at most `kept` slots (< 0: all tc K;
   a stage chunk of token-slots keeps one a row, cuda_impl.h): the slot arrays hold tc K, the
   expert rows and tile lists what the kept slots can fill in the groups of the backend's experts
   (a rank's experts calls name only its range). A rank's route and combine chunks (kept < 0)
   group nothing, but a combine receives one row of o a slot: at least tc K rows (ep 8 on E = 16,
   the rank's 2 groups alone bound a 128-token chunk at 256 rows, below its combine's 512). */
Layout layout_for(const CudaBe *b, int64_t tc, int64_t kept = -1)
{
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = c->moe_inter_dim, E = c->n_routed_experts, K = c->n_activated;
    Layout L;
    memset(&L, 0, sizeof L);
    L.tc = tc;
    L.slots = tc * K;
    const int64_t ks = kept >= 0 && kept < L.slots ? kept : L.slots;
    const bool shard = b->e_count > 0 && b->e_count < E;
    const int64_t Eg = shard ? b->e_count : E;
    /* 128-aligned groups: each non-empty group pads at most 127 rows */
    L.rows = ks + 127 * (ks < Eg ? ks : Eg);
    /* A group holds at most Tc rows when no token sends two slots to one expert (top-K ids are
       distinct; a hash table may repeat one, checked at creation): the masked bound E align128(Tc). */
    if (!b->repeats && Eg * cdiv(tc, 128) * 128 < L.rows)
        L.rows = Eg * cdiv(tc, 128) * 128;
    if (L.rows < tc)
        L.rows = tc;
    if (shard && kept < 0 && L.rows < L.slots)
        L.rows = L.slots;
    const int64_t act = ks < Eg ? ks : Eg;
    if (b->fast) {
        /* 32-row tiles: at most 2 per group of 17..64 rows; 128-row tiles: ceil(n / 128) per larger
           group; the shared expert's after them */
        const int64_t g17 = ks / (FM_DEC_MAX + 1), g65 = ks / (FM_MID_MAX + 1);
        L.cap_mid = 2 * (g17 < Eg ? g17 : Eg) + 3;
        L.cap_big = ks / b->big_rows + (g65 < Eg ? g65 : Eg) + tc / b->big_rows + 3;
        L.tiles = L.cap_mid + L.cap_big;
    } else {
        /* tensor-core tiles: sum of ceil(n / BM) over the groups above the decode threshold */
        L.tiles = ks / DSV4C_BM + act + 1;
    }
    uint64_t off = 0;
    auto take = [&](uint64_t bytes) {
        uint64_t o = off;
        off += align256(bytes ? bytes : 1);
        return o;
    };
    int64_t ngh = cdiv(H, 128), ngi = cdiv(I, 128);
    /* [in_ids ntok stats x] travel host->device in one copy, [stats x/y ids w kept] back in one */
    L.in_ids = take((uint64_t)tc * 4);
    L.ntok = take(4);
    L.stats = take(ST_N * 8);
    L.x = take((uint64_t)(tc * H) * 2); /* also the bf16 output of the chunk */
    L.ids = take((uint64_t)L.slots * 4);
    L.w = take((uint64_t)L.slots * 4);
    L.kept = take((uint64_t)tc * 4);
    L.io_end = off;
    L.lslices = logit_slices(b, tc);
    L.logits = take((uint64_t)(L.lslices * tc * E) * 4);
    L.x16 = b->fast && b->tile16 ? take((uint64_t)(tc * H) * 2) : 0;
    L.xq = b->qx ? take((uint64_t)(tc * H)) : 0;
    L.xs = b->qx ? take((uint64_t)(tc * ngh) * 4) : 0;
    L.cnt = take((uint64_t)E * 4);
    L.slot_off = take((uint64_t)(E + 1) * 4);
    L.pad_off = take((uint64_t)E * 4);
    L.active = take((uint64_t)E * 4);
    L.meta = take(32); /* [0..3] k_count2's counts, [4] k_router_count's ticket */
    L.tile_e = take((uint64_t)L.tiles * 4);
    L.tile_r0 = take((uint64_t)L.tiles * 4);
    L.slot_tok = take((uint64_t)L.slots * 4);
    L.slot_row = take((uint64_t)L.slots * 4);
    L.rowmap = take((uint64_t)L.slots * 4);
    L.slot_w = take((uint64_t)L.slots * 4);
    L.slot_e = b->fp8 ? take((uint64_t)L.slots * 4) : 0;
    L.hist = b->fast ? take((uint64_t)(cdiv(L.slots, PLACE_SLICE) * E) * 4) : 0;
    L.fcnt = b->fast ? take((uint64_t)fold_counts(b) * 4) : 0;
    if (b->fast) {
        /* h bf16 from the gate/up epilogue, then its codes and scales; rows [rows, rows + Tc) are
           the shared expert's (it runs in the same launches as the routed groups) */
        const int64_t hrows = L.rows + (c->n_shared_experts > 0 ? tc : 0);
        L.gu = take((uint64_t)(hrows * I) * 2);
        L.hq = take((uint64_t)(hrows * I));
        L.hs = take((uint64_t)(hrows * ngi) * 4);
    } else {
        L.gu = take((uint64_t)(L.rows * 2 * I) * 2);
        bool hq = b->qh_routed || b->qh_shared, hb = !b->qh_routed || !b->qh_shared;
        /* h: codes + scales when a w2 is quantized; bf16 otherwise (the larger of the two if both occur) */
        uint64_t hbytes = (uint64_t)(L.rows * I) * (hb ? 2 : 1);
        L.hq = take(hbytes);
        L.hs = hq ? take((uint64_t)(L.rows * ngi) * 4) : 0;
    }
    if (b->fp8) {
        const int64_t hrows = L.rows + (c->n_shared_experts > 0 ? tc : 0);
        L.xp = take((uint64_t)(L.rows * H));
        L.xs8 = take((uint64_t)(hrows * ngh) * 4);
        L.gu8 = take((uint64_t)(hrows * 2 * I) * 2);
        L.hs8 = take((uint64_t)(hrows * ngi) * 4);
    }
    L.o = take((uint64_t)(L.rows * H) * 2);
    L.osh = c->n_shared_experts > 0 ? take((uint64_t)(tc * H) * 2) : 0;
    L.total = off;
    return L;
}

/* Which activations are quantized (SPEC.md 5: before fp8 and fp4 GEMMs when act_quant is not none). */
void set_modes(CudaBe *b)
{
    const dsv4_config *c = &b->cfg;
    bool aq = c->act_quant != DSV4_ACT_QUANT_NONE;
    b->routed_q = aq && c->routed_format != DSV4_FORMAT_BF16;
    b->shared_q = aq && c->n_shared_experts > 0 && c->shared_format != DSV4_FORMAT_BF16;
    b->qx = b->routed_q || b->shared_q;
    b->qh_routed = b->routed_q;
    b->qh_shared = b->shared_q || (c->n_shared_experts == 0 && b->routed_q);
}

template <typename T> T *at(const CudaBe *b, uint64_t off) { return (T *)(void *)(b->ws + off); }


/*
 * Launches k on stream s (launch_kernel, kernels.cuh), with the programmatic-dependent-launch
 * attribute when b->pdl (the default; params pdl=off launches plainly). Used for the fp8 path's
 * chain of short kernels, where each launch gap was 1-2 us of a decode step. A launch error is
 * left for the caller's cudaPeekAtLastError, as with <<< >>>.
 */
template <typename... P, typename... A>
void launch_pdl(const CudaBe *b, void (*k)(P...), dim3 grid, unsigned threads, size_t smem, cudaStream_t s, A... args)
{
    (void)launch_kernel(k, grid, threads, smem, s, b->pdl, args...);
}

/* k_combine over tc tokens, 8 columns a thread: a chunk of fewer tokens than multiprocessors takes
   blocks of 64 threads, so a token's row spreads over H / 512 blocks rather than H / 2048 (the
   column a thread sums, and its order, are the same). */
void launch_combine(const CudaBe *b, const CombineArgs &ca, int64_t tc, cudaStream_t s)
{
    const int bs = tc < b->nsm ? 64 : 256;
    launch_pdl(b, k_combine, dim3((unsigned)tc, (unsigned)cdiv(ca.H, 8 * bs)), (unsigned)bs, (size_t)ca.K * 16, s, ca);
}

/* Whether some kernel of the chunk reads the activations' codes as f16 (k_tileh): not when gemm
   fp8 takes every large group and the mid-size groups stay on mma.sync. */
bool f16_codes_read(const CudaBe *b);

WeightDesc desc_routed_gu(const CudaBe *b)
{
    WeightDesc d;
    d.w[0] = b->rw[0].w, d.w[1] = b->rw[1].w;
    d.s[0] = b->rw[0].s, d.s[1] = b->rw[1].s;
    d.w_stride = b->rw[0].w_stride, d.s_stride = b->rw[0].s_stride;
    d.n_split = b->rw[0].n, d.N = 2 * b->rw[0].n, d.K = b->rw[0].k, d.fmt = b->rw[0].fmt, d.sfp32 = b->rw[0].sfp32;
    return d;
}

WeightDesc desc_one(const DevMat &m)
{
    WeightDesc d;
    d.w[0] = d.w[1] = m.w;
    d.s[0] = d.s[1] = m.s;
    d.w_stride = m.w_stride, d.s_stride = m.s_stride;
    d.n_split = m.n, d.N = m.n, d.K = m.k, d.fmt = m.fmt, d.sfp32 = m.sfp32;
    return d;
}

WeightDesc desc_shared_gu(const CudaBe *b)
{
    WeightDesc d = desc_one(b->sw[0]);
    d.w[1] = b->sw[1].w, d.s[1] = b->sw[1].s;
    d.N = 2 * b->sw[0].n;
    return d;
}

/* The activation rows a GEMV launch keeps in shared memory: at most `small`, and at most the rows
   a group of the chunk can hold. Sizing by the chunk instead of by `small` is what lets several
   blocks share a multiprocessor in decode (T = 1: 17 KB instead of 135 KB, 8 blocks instead of 1). */
int gemv_rows(const CudaBe *b, int64_t bound) { return bound < b->small ? (int)(bound < 1 ? 1 : bound) : b->small; }
size_t gemv_smem(int rows, int k) { return (size_t)rows * (size_t)(k + k / 32) * 4; }


/* the k_tileh variants (tileh_big, tileh_mid): tileh.cuh */

bool f16_codes_read(const CudaBe *b) { return b->tile16 && (!(b->fp8 && b->all_ok8) || tileh_mid[b->mid_var].k); }

/* The index of the variant named `name` (len bytes) in table v, -1 when there is none. */
int tileh_pick(const TileHVar *v, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(v[i].name) == len && !strncmp(name, v[i].name, len))
            return i;
    return -1;
}

cudaError_t tileh_attrs()
{
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < N_TILEH_BIG && ce == cudaSuccess; i++)
        ce = cudaFuncSetAttribute(tileh_big[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tileh_big[i].smem);
    for (int i = 0; i < N_TILEH_MID && ce == cudaSuccess; i++)
        if (tileh_mid[i].k)
            ce = cudaFuncSetAttribute(tileh_mid[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tileh_mid[i].smem);
    return ce;
}

/* A decode launch's epilogue: the folded combine (down), the folded quantization (gate/up), or none. */
int dec_epi(const FastArgs &fa) { return fa.fc_cnt ? EPI_COMBINE : fa.qf_cnt ? EPI_QUANT : EPI_NONE; }

int dec_ks(const CudaBe *b, int N, int groups)
{
    const int tiles16 = N / 16;
    int ks = 1;
    while (ks < 8 && (int64_t)(tiles16 / (8 / ks)) * groups < (int64_t)b->dec_fill * b->nsm)
        ks *= 2;
    return ks;
}

/* Launches k_dec for format fmt over `groups` slots (routed active slots below fa.act_max, then
   the shared expert), splitting K over enough warps to give every multiprocessor b->dec_fill
   blocks (cuda_kernels dec_fill; the split is a function of N, the group count and the device,
   so a chunk and its graph bucket sum in the same order). */
void launch_dec(const CudaBe *b, int fmt, FastArgs fa, int groups, cudaStream_t s)
{
    const int tiles16 = fa.N / 16;
    const int ks = dec_ks(b, fa.N, groups);
    fa.ks = ks;
    const dim3 grid((unsigned)(tiles16 / (8 / ks)), (unsigned)groups);
    /* B from shared memory (dec_b=smem, mma_parts.cuh dec_stage_slab): fp4 weights, K not split, and
       not the folded down projection: with it, T = 8 measured 0.32 against 0.29 ms (H200,
       2026-12-04, bench_cuda --quick, two passes each; T = 256, where nothing folds, 1.40-1.42
       against 1.49-1.53; docs/cuda.md) */
    const int epi = dec_epi(fa);
    const bool sb = b->dec_slab && b->dec_ring == RING_STD && ks == 1 && fmt == WF_FP4 && epi == EPI_NONE && !fa.qin;
    size_t smem = dec_smem_bytes(fmt, ks, 2, sb, b->dec_ring != RING_STD);
    if (fa.qin) /* params quant=down: the rows the block quantizes after its rings and partial sums */
        smem = dec_smem_bytes(fmt, ks, 2) + dec_qin_bytes(fa.qin, fa.K);
    /* its error: the caller's peek */
    (void)launch_dec_kernel(fa, fmt, epi, sb, b->dec_minb, b->dec_ring, grid, smem, s, b->pdl);
}

/* A layer's shared expert in the routed experts' decode launches (params shared_dec=one: fp4
   routed, fp8 shared; k_dec_mix) ... */
bool shared_mix(const CudaBe *b, const FastArgs &fa)
{
    return b->cfg.n_shared_experts > 0 && b->shared_dec_one && fa.r.fmt == WF_FP4 && fa.sh.fmt == WF_FP8;
}

/* ... or in a decode launch of its own on the forked stream s4 (formats that differ otherwise) */
bool shared_split(const CudaBe *b, const FastArgs &fa)
{
    return b->cfg.n_shared_experts > 0 && fa.sh.fmt != fa.r.fmt && !shared_mix(b, fa);
}

/* That launch: the shared expert's group alone, on s4. */
void launch_dec_shared(const CudaBe *b, const FastArgs &fa)
{
    FastArgs sh = fa;
    sh.act_max = 0;
    launch_dec(b, fa.sh.fmt, sh, 1, b->s4);
}

/* k_dec_mix (params shared_dec=one): fp4 routed groups and the fp8 shared expert in one launch,
   each group with the K split its own launch_dec would give it (so the same sums). */
void enqueue_dec_mix(const CudaBe *b, FastArgs fa, cudaStream_t s)
{
    const int tiles16 = fa.N / 16;
    fa.ks = dec_ks(b, fa.N, fa.act_max);
    fa.ks_sh = dec_ks(b, fa.N, 1);
    const int gxr = tiles16 / (8 / fa.ks), gxs = tiles16 / (8 / fa.ks_sh); /* places along N */
    size_t smem = std::max(dec_smem_bytes(WF_FP4, fa.ks, 2), dec_smem_bytes(WF_FP8, fa.ks_sh, 2));
    if (fa.qin) /* params quant=down: each group's rows after its format's rings and partial sums */
        smem += dec_qin_bytes(fa.qin, fa.K);
    /* its error: the caller's peek */
    if (b->dec_persist) { /* params dec_sched=persist: at most the resident blocks, each over units */
        const int64_t units = (int64_t)fa.act_max * gxr + gxs;
        const unsigned blocks = (unsigned)std::min<int64_t>(units, (int64_t)b->nsm * b->dec_minb);
        (void)launch_dec_mix_persist(fa, dec_epi(fa), b->dec_minb, blocks, smem, s, b->pdl);
    } else {
        (void)launch_dec_mix(fa, dec_epi(fa), b->dec_minb, (unsigned)std::max(gxr, gxs), smem, s, b->pdl);
    }
}

/* The decode kernels' shared-memory limit: their largest K split, or the B slabs; the variants
   of params dec_regs=128 (minb2), quant=fold (qfold), shared_dec=one (mix), dec_ring (ring) and
   quant=down (qdown: FM_DEC_QIN_MAX rows of the layer's I more, where that fits a block; b->qin_smem
   gets the limit, 0 where it does not fit) only when chosen, so a creation with the defaults sets
   what it always did. */
cudaError_t dec_attrs(CudaBe *b, bool minb2, bool qfold, bool mix_on, int ring, bool qdown)
{
    const int m4 = (int)std::max(dec_smem_bytes(WF_FP4, 8, 2), dec_smem_bytes(WF_FP4, 1, 2, true));
    const int m8 = (int)dec_smem_bytes(WF_FP8, 8, 2), mix = std::max(m4, m8);
    const int d4 = (int)dec_smem_bytes(WF_FP4, 8, 2, false, true), d8 = (int)dec_smem_bytes(WF_FP8, 8, 2, false, true);
    const size_t qb = dec_qin_bytes(FM_DEC_QIN_MAX, (int)b->cfg.moe_inter_dim);
    const int q4 = (int)(dec_smem_bytes(WF_FP4, 8, 2) + qb), q8 = (int)(dec_smem_bytes(WF_FP8, 8, 2) + qb);
    b->qin_smem = qdown && b->cfg.moe_inter_dim % 128 == 0 && q8 <= 200 * 1024 ? std::max(q4, q8) : 0;
    cudaError_t ce = mix_on ? dec_mix_attrs(mix, b->qin_smem ? mix + (int)qb : 0) : cudaSuccess;
    return ce == cudaSuccess ? dec_kernel_attrs(m4, m8, minb2, qfold, ring, d4, d8, b->qin_smem ? q4 : 0, q8) : ce;
}

/* The most rows a group of the chunk can hold: a routed group holds at most Tc rows (every slot
   when a hash table repeats an expert), the shared expert's one a row per token. */
int64_t group_rows_max(const CudaBe *b, const Layout &L)
{
    const int64_t routed = b->repeats ? L.slots : L.tc;
    return std::max(routed, b->cfg.n_shared_experts > 0 ? L.tc : (int64_t)0);
}

/*
 * The regimes of one projection: k_dec on the main stream (and, when the shared expert's format
 * differs from the routed experts', its own k_dec on a forked stream), the 32-row and 128-row
 * tile kernels on two more forked streams, all joined back before returning (s4 not when !sh_join:
 * the caller's next launch_regimes joins it); each is launched
 * only when the chunk's bounds allow it a group. Every block reads its group from the device.
 * With p8 (gemm fp8), large groups of convertible experts run on the grouped FP8 GEMM on the
 * 128-row tiles' stream instead (k_count2 left them off the big tile list).
 */
cudaError_t launch_regimes(const CudaBe *b, const Layout &L, FastArgs fa, const Fp8Proj *p8 = nullptr,
                           Fp8Gemm *g8 = nullptr, bool sh_done = false, bool sh_join = true)
{
    cudaStream_t s = b->stream;
    const int64_t nmax = group_rows_max(b, L);
    const bool mid = nmax > FM_DEC_MAX, big = nmax > FM_MID_MAX;
    /* the shared expert in another format: its own k_dec on s4, or with params shared_dec=one (fp4
       routed, fp8 shared) one launch with the routed groups (k_dec_mix) */
    const bool mix = shared_mix(b, fa), split = shared_split(b, fa);
    const bool cut = p8 && nmax > p8->min_rows; /* a group can be on the grouped FP8 GEMM (s3) */
    /* shared_gu=early forked s4 before the router (enqueue_fast): it only joins here, so no event is
       recorded between the router and this launch when nothing else forks (a decode step) */
    const bool fork4 = split && !sh_done;
    cudaError_t e = cudaSuccess;
    if ((mid || big || fork4 || cut) && (e = cudaEventRecord(b->ev_fork, s)) != cudaSuccess)
        return e;
    struct Side {
        bool on, fork;
        cudaStream_t st;
        cudaEvent_t ev;
    } side[3] = {{split && sh_join, fork4, b->s4, b->ev_j4}, {mid, mid, b->s2, b->ev_j2},
                 {big || cut, big || cut, b->s3, b->ev_j3}};
    for (const Side &sd : side)
        if (sd.fork && (e = cudaStreamWaitEvent(sd.st, b->ev_fork, 0)) != cudaSuccess)
            return e;
    if (mix) {
        enqueue_dec_mix(b, fa, s);
    } else if (split) {
        launch_dec(b, fa.r.fmt, fa, fa.act_max, s); /* routed slots only */
        if (!sh_done) /* shared_gu=early: on s4 already (enqueue_fast); joined below all the same */
            launch_dec_shared(b, fa);
    } else {
        launch_dec(b, fa.r.fmt, fa, fa.act_max + 1, s);
    }
    if (mid) {
        FastArgs m = fa;
        m.meta_tiles = 1;
        const dim3 grid((unsigned)(fa.N / 128), (unsigned)L.cap_mid);
        const TileHVar &v = tileh_mid[b->mid_var];
        if (b->direct_on)
            launch_tile8(false, b->direct, grid, b->s2, m);
        else if (b->tile16 && v.k)
            v.k<<<grid, 256, v.smem, b->s2>>>(m);
        else
            launch_tile(false, grid, b->s2, m);
    }
    if (cut && (e = fp8gemm_enqueue(g8, *p8, b->s3)) != cudaSuccess)
        return e;
    /* gemm fp8: only experts whose weights did not convert have big tiles, or with params direct=
       every routed expert (k_tile8) */
    if (big && (b->direct_on || !(p8 && b->all_ok8))) {
        FastArgs g = fa;
        g.meta_tiles = 3;
        g.tile_e += L.cap_mid;
        g.tile_r0 += L.cap_mid;
        const dim3 grid((unsigned)(fa.N / 128), (unsigned)L.cap_big);
        const TileHVar &v = tileh_big[b->big_var];
        if (b->direct_on)
            launch_tile8(true, b->direct, grid, b->s3, g);
        else if (b->tile16)
            v.k<<<grid, 256, v.smem, b->s3>>>(g);
        else
            launch_tile(true, grid, b->s3, g);
    }
    for (const Side &sd : side)
        if (sd.on && ((e = cudaEventRecord(sd.ev, sd.st)) != cudaSuccess || (e = cudaStreamWaitEvent(s, sd.ev, 0)) != cudaSuccess))
            return e;
    return cudaPeekAtLastError();
}

/* The fp8 path's grouping arguments of a chunk (k_count2, k_hist, k_place2, k_router_count). */
Group2Args group2_args(const CudaBe *b, const Layout &L, const RouterArgs &ra, const GroupArgs &ga)
{
    const dsv4_config *c = &b->cfg;
    const int E = (int)c->n_routed_experts, K = (int)c->n_activated;
    Group2Args g2;
    g2.ids = ra.ids, g2.w = ra.w, g2.ntok = ra.ntok;
    g2.cnt = ga.cnt, g2.slot_off = ga.slot_off, g2.pad_off = ga.pad_off, g2.active = ga.active, g2.meta = ga.meta;
    g2.tile_e = ga.tile_e, g2.tile_r0 = ga.tile_r0;
    g2.slot_tok = ga.slot_tok, g2.slot_row = ga.slot_row, g2.rowmap = ga.rowmap, g2.slot_w = ga.slot_w;
    g2.slot_e = ga.slot_e;
    g2.stats = ga.stats;
    g2.E = E, g2.K = K, g2.rows = (int)L.rows, g2.cap_mid = (int)L.cap_mid, g2.cap_big = (int)L.cap_big;
    g2.has_shared = c->n_shared_experts > 0;
    g2.mid_rows = 32, g2.big_rows = b->big_rows;
    g2.place = L.slots <= 1024;
    g2.cut_ok = b->fp8 ? b->ok8 : nullptr;
    g2.cut_rows = b->fp8_cut;
    /* large chunks: counted and placed by slices (k_hist, k_place2); k_place's block per expert
       where the slices' per-warp counts would not fit in shared memory */
    const bool sliced = !g2.place && E * 4 * place_warps(E) <= 48 * 1024;
    g2.hist = sliced ? at<int>(b, L.hist) : nullptr;
    /* quant=fold's counts, and with it or quant=down (no k_quant to zero them) the folded combine's */
    g2.zero = b->quant_fold || b->quant_down ? at<int>(b, L.fcnt) : nullptr;
    g2.nzero = b->quant_fold || b->quant_down ? (int)fold_counts(b) : 0;
    g2.warp = b->group_warp ? 1 : 0;
    return g2;
}

/* The grouped FP8 GEMM's weights of a projection (slot 0: gate|up, 1: down; the shared expert's at
   slot + 2) and the routed experts' strides. With params direct= the creation made no routed e4m3
   copies and every routed group has M = 0 (ok8 is zero for them): the routed pointers then name
   the shared expert's weights with stride 0, so that no group's pointer is formed from a null base
   (none of them is read). */
void fp8_weights(const CudaBe *b, Fp8Proj &p, int slot, long long b_stride, long long sfb_stride)
{
    const bool copies = b->w8[slot] != nullptr;
    p.B = copies ? b->w8[slot] : b->w8[slot + 2], p.SFB = copies ? b->s8[slot] : b->s8[slot + 2];
    p.Bsh = b->w8[slot + 2], p.SFBsh = b->s8[slot + 2];
    p.b_stride = copies ? b_stride : 0, p.sfb_stride = copies ? sfb_stride : 0;
}

/* The fp8 path after the router: grouping (unless the router did it: counted), gate/up + SwiGLU,
   quantization of h, down, combine (folded into the down projection only in a full chunk: full).
   early_ticket: k_router_count's ticket, which it takes after each token's ids (params
   dec_pf=early), or NULL; sh_forked: ev_early was recorded after k_logits_small, which quantized
   x (params shared_gu=early). */
cudaError_t enqueue_fast(const CudaBe *b, const Layout &L, const RouterArgs &ra, GroupArgs ga, bool counted, bool full,
                         int *early_ticket = nullptr, bool sh_forked = false)
{
    const dsv4_config *c = &b->cfg;
    const int H = (int)c->dim, I = (int)c->moe_inter_dim, E = (int)c->n_routed_experts, K = (int)c->n_activated;
    cudaStream_t s = b->stream;
    const bool shared = c->n_shared_experts > 0;
    const Group2Args g2 = group2_args(b, L, ra, ga);
    const bool sliced = g2.hist != nullptr;
    const int pw = place_warps(E);
    const unsigned pgrid = (unsigned)cdiv(cdiv(L.slots, PLACE_SLICE), pw);
    if (sliced)
        launch_pdl(b, k_hist, pgrid, 32 * pw, (size_t)E * 4 * pw, s, g2);
    /* one block: as many threads as experts (a warp multiple, at most 1024; the loops cover the rest) */
    if (!counted)
        launch_pdl(b, k_count2, dim3(1), (unsigned)std::min<int64_t>(1024, std::max<int64_t>(64, cdiv(E, 32) * 32)), (size_t)E * 8, s, g2);
    if (sliced)
        launch_pdl(b, k_place2, pgrid, 32 * pw, (size_t)E * 4 * pw, s, g2);
    else if (!g2.place)
        launch_pdl(b, k_place, dim3((unsigned)E), 256, 0, s, ga);
    FastArgs fa = FastArgs();
    fa.ntok = ra.ntok, fa.cnt = ga.cnt, fa.slot_off = ga.slot_off, fa.pad_off = ga.pad_off, fa.active = ga.active;
    fa.meta = ga.meta, fa.tile_e = ga.tile_e, fa.tile_r0 = ga.tile_r0, fa.slot_tok = ga.slot_tok, fa.slot_w = ga.slot_w;
    fa.stats = ga.stats, fa.E = E, fa.act_max = (int)(L.slots < E ? L.slots : E);
    fa.before = c->weight_point == DSV4_WEIGHT_BEFORE_W2, fa.clamp_r = 1, fa.clamp_s = c->shared_clamp;
    fa.L = c->swiglu_limit;
    fa.pf = b->dec_pf;
#ifdef DSV4_FAULTS
    if (b->fp8)
        fa.clamp_r = !DSV4_TESTHOOK(DROP_ROUTED_CLAMP); /* test hook: the fp8 executor's routed experts lose the clamp */
#endif
    uint16_t *h16 = at<uint16_t>(b, L.gu);
    uint8_t *hq = at<uint8_t>(b, L.hq);
    float *hs = at<float>(b, L.hs);
    const int64_t ngi = I / 128;
    /* gate/up with the SwiGLU epilogue: h bf16 */
    FastArgs gu = fa;
    gu.r = b->fp[0], gu.sh = shared ? b->fp[2] : FProj();
    gu.N = 2 * I, gu.K = H, gu.gu = 1;
    gu.A = at<uint8_t>(b, L.xq), gu.As = at<float>(b, L.xs), gu.gather = 1;
    gu.Ash = gu.A, gu.Assh = gu.As;
    gu.A16 = gu.Ash16 = b->tile16 ? at<uint16_t>(b, L.x16) : nullptr;
    gu.out = h16, gu.out_sh = h16 + L.rows * I;
    /* gemm fp8: a group above fp8_cut rows can exist in this chunk */
    const int64_t nmax = group_rows_max(b, L);
    const bool fp8 = b->fp8 && nmax > b->fp8_cut;
    /* params combine=fold (the default): a full chunk (not a stage's) whose every group runs in
       k_dec sums y in the down projection's launch, the last block writing a tile of o combining it
       (fold_combine); only with a shared expert, whose k_dec runs for 1 .. FM_DEC_MAX live tokens,
       so every tile of o has a writer and some block always completes its count */
    const bool fold = b->combine_fold && full && shared && !fp8 && nmax <= FM_DEC_MAX && K <= FC_KMAX;
    /* params quant=fold: a chunk whose every group runs in k_dec quantizes h in gate/up's launch,
       the last block writing a group's 128 features quantizing them (fold_quant), not in k_quant;
       the grouping zeroed the counts (group2_args); quant=auto leaves chunks of one row to k_quant
       (an H100 timed fold 7 % slower than k_quant at T = 1 and 5-8 % faster at T = 8) */
    const bool qfold = b->quant_fold && !fp8 && nmax <= FM_DEC_MAX && !(b->quant_auto && L.tc < 2);
    /* params quant=down: a chunk whose every group runs in k_dec with at most FM_DEC_QIN_MAX rows has
       no k_quant: the down projection's blocks quantize their group's h rows (dec_qin.cuh; k_dec and
       k_dec_mix); the grouping zeroed the folded combine's counts (group2_args) */
    const bool qdown = b->quant_down && b->qin_smem && !fp8 && nmax <= FM_DEC_QIN_MAX;
    /* params direct=q64: k_tile8's gate/up of the large groups quantizes h (tile8.cuh); k_quant8 skips
       those rows (only chunks with a large group: fp8 below) */
    const bool qdirect = b->direct_on && b->direct == TILE8_Q64;
    if (qfold || qdirect)
        gu.qf_q = hq, gu.qf_s = hs, gu.qf_sh_row0 = L.rows, gu.qmode = (int)c->act_quant;
    if (qfold)
        gu.qf_cnt = at<int>(b, L.fcnt) + H / 16;
    /* params dec_pf=early (dec_early): gate/up's first-wave blocks prefetch while k_router_count
       routes, where the chunk's ids fit one block's threads; down's while the kernel before it
       runs (k_quant, or with quant=fold gate/up's last wave, whose tail leaves the DRAM idle) */
    const bool early = early_ticket && L.tc * K <= FM_THREADS;
    if (early) {
        gu.early = 1, gu.early_ticket = early_ticket, gu.early_need = (int)L.tc;
        gu.early_ids = ra.ids, gu.early_K = K;
    }
    Sel8 sel;
    sel.slot_row = ga.slot_row, sel.slot_tok = ga.slot_tok, sel.slot_e = ga.slot_e, sel.cnt = ga.cnt;
    sel.pad_off = ga.pad_off, sel.meta = ga.meta, sel.ntok = ra.ntok, sel.ok = b->ok8;
    sel.sh_row0 = L.rows, sel.E = E, sel.slots = (int)L.slots, sel.has_shared = shared, sel.min_rows = b->fp8_cut;
    const unsigned rows_grid = (unsigned)(L.slots + (shared ? L.tc : 0));
    const int64_t ngh = H / 128;
    Fp8Proj p8;
    memset(&p8, 0, sizeof p8);
    /* params gather=quant: x's codes and scales where the router and k_gather8 put them, in one
       pass; not launched where there is nothing to do (a chunk k_logits_small quantized for sure,
       T <= 32, without a group that can reach the GEMM: the decode steps) */
    if (b->gather_quant && b->qx && (fp8 || gemm_logits(b, L.tc))) {
        QuantX8Args qx;
        qx.x = ra.x, qx.ntok = ra.ntok, qx.ids = ra.ids, qx.rowmap = ga.rowmap, qx.cnt = ga.cnt, qx.pad_off = ga.pad_off;
        qx.ok = b->fp8 ? b->ok8 : nullptr;
        qx.xq = at<uint8_t>(b, L.xq), qx.xs = at<float>(b, L.xs), qx.x16 = ra.x16;
        qx.xp = b->fp8 ? at<uint8_t>(b, L.xp) : nullptr, qx.xs8 = b->fp8 ? at<float>(b, L.xs8) : nullptr;
        qx.sh_row0 = L.rows, qx.H = H, qx.E = E, qx.K = K, qx.qmode = (int)c->act_quant;
        qx.has_shared = shared, qx.min_rows = b->fp8_cut, qx.small_max = ra.small_max;
        const cudaError_t ce = launch_quant_x8(qx, (unsigned)L.tc, s, b->pdl);
        if (ce != cudaSuccess)
            return ce;
    }
    if (fp8) {
        Gather8Args g8a;
        g8a.sel = sel, g8a.xq = at<uint8_t>(b, L.xq), g8a.xs = at<float>(b, L.xs);
        g8a.xp = at<uint8_t>(b, L.xp), g8a.xs8 = at<float>(b, L.xs8), g8a.H = H;
        if (!b->gather_quant) {
            const cudaError_t ce = launch_gather8(g8a, rows_grid, s, b->pdl);
            if (ce != cudaSuccess)
                return ce;
        }
        p8.cnt = ga.cnt, p8.pad_off = ga.pad_off, p8.ntok = ra.ntok, p8.ok = b->ok8;
        p8.E = E, p8.min_rows = b->fp8_cut, p8.has_shared = shared, p8.sh_row0 = L.rows;
        p8.N = p8.Nsh = 2 * I, p8.K = p8.Ksh = H;
        p8.A = g8a.xp, p8.Ash = g8a.xq, p8.SFA = g8a.xs8, p8.SFAsh = g8a.xs8 + L.rows * ngh;
        fp8_weights(b, p8, 0, 2LL * I * H, 2LL * I / b->sfb_rows * (H / 128));
        p8.D = at<uint16_t>(b, L.gu8), p8.Dsh = p8.D + L.rows * 2 * I;
    }
    /* params shared_gu=early: the shared expert's gate/up decode (its own launch on s4) depends on x's
       codes only, so it forks after k_logits_small and streams its weights while the router runs;
       not with quant=fold, whose counts the grouping zeroes */
    const bool sh_early = sh_forked && shared_split(b, gu) && !qfold;
    if (sh_early) {
        cudaError_t ce = cudaStreamWaitEvent(b->s4, b->ev_early, 0);
        if (ce != cudaSuccess)
            return ce;
        launch_dec_shared(b, gu);
    }
    /* quant=down: nothing on the main stream reads the shared expert's h before the down projection,
       so s4 is not joined here: the routed down does not wait for the shared gate/up, and the shared
       down (forked after the routed gate/up, which follows the grouping that zeroed the combine's
       counts) follows the shared gate/up on s4; the down projection's launch_regimes joins s4 */
    cudaError_t e = launch_regimes(b, L, gu, fp8 ? &p8 : nullptr, b->g8[0], sh_early, !qdown);
    if (e != cudaSuccess)
        return e;
    if (fp8) {
        Quant8Args q8;
        q8.sel = sel, q8.h = h16, q8.gu8 = at<uint16_t>(b, L.gu8), q8.q = hq, q8.s = hs, q8.s8 = at<float>(b, L.hs8);
        q8.slot_w = ga.slot_w, q8.stats = ga.stats, q8.I = I, q8.qmode = (int)c->act_quant, q8.f16_codes = f16_codes_read(b);
        q8.before = fa.before, q8.clamp_r = fa.clamp_r, q8.clamp_s = fa.clamp_s, q8.L = fa.L;
        const cudaError_t ce = launch_quant8(q8, rows_grid, qdirect, b->quant8_lean, s, b->pdl);
        if (ce != cudaSuccess)
            return ce;
        p8.N = p8.Nsh = H, p8.K = p8.Ksh = I;
        p8.A = hq, p8.Ash = hq + L.rows * I, p8.SFA = q8.s8, p8.SFAsh = q8.s8 + L.rows * ngi;
        fp8_weights(b, p8, 1, 1LL * H * I, 1LL * H / b->sfb_rows * (I / 128));
        p8.D = at<uint16_t>(b, L.o), p8.Dsh = shared ? at<uint16_t>(b, L.osh) : nullptr;
    } else if (!qfold && !qdown) {
    QuantArgs qa;
    qa.h = h16, qa.q = hq, qa.s = hs, qa.slot_row = ga.slot_row, qa.meta = ga.meta, qa.ntok = ra.ntok;
    qa.sh_row0 = L.rows, qa.I = I, qa.qmode = (int)c->act_quant, qa.slots = (int)L.slots, qa.has_shared = shared;
    qa.f16_codes = b->tile16;
    qa.zero = fold ? at<int>(b, L.fcnt) : nullptr, qa.nzero = H / 16;
    launch_pdl(b, k_quant, dim3(rows_grid), (unsigned)std::min<int64_t>(512, std::max<int64_t>(32, ngi * 32)), 0, s, qa);
    }
    /* down */
    FastArgs dn = fa;
    dn.r = b->fp[1], dn.sh = shared ? b->fp[3] : FProj();
    dn.N = H, dn.K = I, dn.gu = 0;
    dn.A = hq, dn.As = hs, dn.gather = 0;
    dn.Ash = hq + L.rows * I, dn.Assh = hs + L.rows * ngi;
    dn.A16 = b->tile16 ? h16 : nullptr, dn.Ash16 = b->tile16 ? h16 + L.rows * I : nullptr;
    dn.out = at<uint16_t>(b, L.o), dn.out_sh = shared ? at<uint16_t>(b, L.osh) : nullptr;
    CombineArgs ca;
    ca.O = dn.out;
    ca.Osh = dn.out_sh;
    ca.ids = ra.ids, ca.rowmap = ga.rowmap, ca.w = ra.w;
    ca.y = at<uint16_t>(b, L.x);
    ca.ntok = ra.ntok;
    ca.H = H, ca.E = E, ca.K = K, ca.after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
    if (fold)
        dn.fc_cnt = at<int>(b, L.fcnt), dn.fc = ca;
    if (early && !fp8)
        dn.early = 2, dn.early_blocks = b->nsm * b->dec_minb;
    if (qdown) {
        dn.qin = (int)nmax, dn.qmode = (int)c->act_quant;
        dn.A = (const uint8_t *)h16, dn.Ash = (const uint8_t *)(h16 + L.rows * I);
        dn.As = dn.Assh = nullptr;
    }
    if ((e = launch_regimes(b, L, dn, fp8 ? &p8 : nullptr, b->g8[1])) != cudaSuccess)
        return e;
    if (!fold)
        launch_combine(b, ca, L.tc, s);
    return cudaPeekAtLastError();
}

/* An exact-path projection's activations: the quantized codes at offset q_off with their scales
   at s_off (aq), or the bf16 rows at bf_off. */
void exact_act(GemmArgs &g, bool aq, const CudaBe *b, uint64_t q_off, uint64_t bf_off, uint64_t s_off)
{
    g.aq = aq;
    g.A = aq ? (const void *)at<uint8_t>(b, q_off) : (const void *)at<uint16_t>(b, bf_off);
    g.As = aq ? at<float>(b, s_off) : nullptr;
}

/* One exact-path projection: the GEMV regime over gemv_x groups, then the tensor-core tiles over
   tile_x tiles (0: no group of the chunk can exceed the GEMV's rows). */
void launch_exact(const GemmArgs &g, unsigned gemv_x, unsigned tile_x, cudaStream_t s)
{
    launch_gemv(g.W.fmt, g.aq, dim3(gemv_x, (unsigned)cdiv(g.W.N, DSV4C_GEMV_COLS)), gemv_smem(g.smem_rows, g.W.K), s, g);
    if (tile_x)
        (void)launch_tiles(g.W.fmt, g.aq, dim3(tile_x, (unsigned)cdiv(g.W.N, DSV4C_BN)), s, false, g); /* its error: the caller's peek */
}

/*
 * Enqueues the kernels of one chunk whose buffers follow layout L (grids sized by L.tc; the
 * kernels read the actual token count from the device). No host synchronisation. t0 is the
 * chunk's first token (only for error messages).
 */
cudaError_t enqueue_chunk(const CudaBe *b, const Layout &L, int64_t t0, ChunkMode mode = CHUNK_FULL)
{
    const dsv4_config *c = &b->cfg;
    const int H = (int)c->dim, I = (int)c->moe_inter_dim, E = (int)c->n_routed_experts, K = (int)c->n_activated;
    cudaStream_t s = b->stream;
    const int *ntok = at<int>(b, L.ntok);
    unsigned long long *stats = at<unsigned long long>(b, L.stats);
    /* router */
    RouterArgs ra;
    memset(&ra, 0, sizeof ra);
    ra.x = at<uint16_t>(b, L.x);
    ra.in_ids = at<int32_t>(b, L.in_ids);
    ra.ntok = ntok;
    ra.bias = b->bias, ra.tid2eid = b->tid2eid;
    ra.pred_norm = b->pred_norm, ra.pred_w = b->pred_w, ra.pred_b = b->pred_b;
    ra.ids = at<int32_t>(b, L.ids), ra.w = at<float>(b, L.w), ra.kept = at<int32_t>(b, L.kept);
    ra.xq = b->qx ? at<uint8_t>(b, L.xq) : nullptr;
    ra.xs = b->qx ? at<float>(b, L.xs) : nullptr;
    ra.x16 = b->fast && f16_codes_read(b) ? at<uint16_t>(b, L.x16) : nullptr;
    ra.stats = stats;
    ra.t0 = t0;
    ra.H = H, ra.E = E, ra.K = K, ra.V = (int)c->vocab_size;
    ra.hash = dsv4_config_is_hash_layer(c);
    ra.score = (int)c->score_func;
    ra.gate_bf16 = c->gate_logits == DSV4_GATE_LOGITS_BF16;
    ra.predictor = (int)c->top_p_predictor;
    ra.top_p_on = c->top_p < 1.0f;
    ra.min_keep = (int)c->top_p_min_keep;
    ra.renorm = c->top_p_renorm;
    ra.qmode = (int)c->act_quant;
    ra.route_scale = c->route_scale, ra.norm_eps = c->norm_eps, ra.top_p = c->top_p;
    /* grouping */
    GroupArgs ga;
    ga.ids = ra.ids, ga.w = ra.w, ga.ntok = ntok;
    ga.cnt = at<int>(b, L.cnt), ga.slot_off = at<int>(b, L.slot_off), ga.pad_off = at<int>(b, L.pad_off);
    ga.active = at<int>(b, L.active), ga.meta = at<int>(b, L.meta);
    ga.tile_e = at<int>(b, L.tile_e), ga.tile_r0 = at<int>(b, L.tile_r0);
    ga.slot_tok = at<int32_t>(b, L.slot_tok), ga.slot_row = at<int32_t>(b, L.slot_row);
    ga.rowmap = at<int32_t>(b, L.rowmap), ga.slot_w = at<float>(b, L.slot_w);
    ga.slot_e = b->fp8 ? at<int32_t>(b, L.slot_e) : nullptr;
    ga.stats = stats, ga.E = E, ga.K = K, ga.small = b->small, ga.rows = (int)L.rows, ga.tile_m = DSV4C_BM;
    /* params route=fused (the default): up to DSV4C_LOGITS_SMALL live tokens (read on the
       device, so a padded bucket sums its valid rows as the unpadded call does) take k_logits_small,
       which also quantizes x; more take the GEMM kernels (launched only for chunks that can hold
       more) and k_router quantizes. On the fp8 path a chunk whose slots k_count2 places in one block
       is grouped in the router's launch (k_router_count; not when the experts stage replaces the
       router's ids). */
    /* k_router_count adds k_count2's 8.8 KB of static shared memory (the staged ids and weights) to
       the router's dynamic (H + 2 E + 4 K) floats (at least k_count2's 2 E ints): fused only while
       both fit the default 48 KB */
    const size_t rsm = (size_t)(H + 2 * E + 4 * K) * 4;
    const bool fused = b->route_fused && b->fast && mode == CHUNK_FULL && L.slots <= 1024 && rsm + 9 * 1024 <= 48 * 1024;
    int *ticket = at<int>(b, L.meta) + 4; /* meta[4]: k_router_count's ticket (k_count2 writes meta[0..3]) */
    bool sh_forked = false; /* shared_gu=early: ev_early recorded after k_logits_small */
    /* the small chunks' logits (k_logits_small, k_route_small): one slice, x quantized there too */
    /* params route_code=lean|warm: k_router_count compiled for the decode configuration, where it
       fits (a fused chunk takes k_logits_small), with warm a dry pass first */
    const Group2Args g2 = group2_args(b, L, ra, ga); /* ra's ids, weights and token count only */
    int rcode = fused && route_lean_fits(ra, g2, L.tc) ? b->route_code : ROUTE_CODE_FULL;
    if (rcode == ROUTE_CODE_WARM && !b->pdl) /* plain launches: nothing to overlap the dry pass with */
        rcode = ROUTE_CODE_LEAN;
    LogitsArgs la;
    la.x = ra.x, la.gate = b->gate16, la.ntok = ntok, la.logits = at<float>(b, L.logits);
    la.xq = ra.xq, la.xs = ra.xs, la.x16 = ra.x16, la.ticket = fused ? ticket : nullptr;
    la.dep_first = rcode == ROUTE_CODE_WARM && b->pdl;
    la.qmode = ra.qmode, la.H = H, la.E = E, la.lblocks = (int)cdiv(E, LS_EPB), la.tgroups = 1;
    const int qblocks = ra.xq ? (int)cdiv(std::min<int64_t>(L.tc, DSV4C_LOGITS_SMALL) * cdiv(H, 128), 8) : 0;
    /* params gather=quant: the router does not quantize x; k_quant_x8 does after the grouping
       (enqueue_fast), where k_logits_small has not (its chunks keep their quantizing blocks) */
    if (b->gather_quant && b->fast)
        ra.xq = nullptr;
    /* params route=one: the logits, routing and grouping of such a chunk in one launch when the
       chunk holds at most DSV4C_LOGITS_SMALL rows (the logits never come from the GEMM kernels) */
    if (fused && b->route_one && route_small_fits(E, K, (int)L.tc)) {
        RouteSmallArgs rs;
        rs.la = la;
        rs.la.ticket = nullptr; /* its ticket is the chunk counter ST_TICKET */
        rs.la.dep_first = 0;
        rs.ra = ra;
        rs.ra.xq = nullptr, rs.ra.small_max = DSV4C_LOGITS_SMALL;
        rs.ra.logits = rs.la.logits, rs.ra.lslices = 1, rs.ra.lslice_stride = L.tc * E;
        rs.g = g2;
        rs.g.hist = nullptr; /* place is set: L.slots <= 1024 */
        rs.ncap = (int)(L.tc * K);
        cudaError_t ce = launch_route_small(rs, qblocks, b->logits_tg, s, b->pdl);
        if (ce != cudaSuccess)
            return ce;
        return enqueue_fast(b, L, rs.ra, ga, true, true);
    }
    if (b->route_fused) {
        const bool loop = b->logits_loop && logits_loop_fits(la.H); /* logits_loop (the default), where it reaches */
        (void)launch_logits_small(la, b->logits_tg, loop, (unsigned)(la.lblocks + qblocks), s, b->pdl); /* its error: the caller's peek */
        ra.small_max = DSV4C_LOGITS_SMALL;
        /* params shared_gu=early: the shared gate/up's fork (enqueue_fast), x's codes being written */
        if (fused && b->shared_early && la.xq) {
            const cudaError_t ce = cudaEventRecord(b->ev_early, s);
            if (ce != cudaSuccess)
                return ce;
            sh_forked = true;
        }
    }
    ra.logits = at<float>(b, L.logits);
    ra.lslices = L.lslices;
    ra.lslice_stride = L.tc * E;
    if (gemm_logits(b, L.tc) && b->lb) {
        /* params logits=blas: the same GEMM on cuBLASLt, every row of the chunk in one slice */
        ra.lslices = 1;
        const cudaError_t ce = logits_blas_enqueue(b->lb, ra.x, b->gate16, at<float>(b, L.logits), (int)L.tc, s);
        if (ce != cudaSuccess)
            return ce;
    } else if (gemm_logits(b, L.tc)) {
        /* logits = x . gate^T by the GEMM kernels (bf16 operands, fp32 out), then the router reads them */
        GemmArgs lgA;
        memset(&lgA, 0, sizeof lgA);
        lgA.W.w[0] = lgA.W.w[1] = (const uint8_t *)b->gate16;
        lgA.W.s[0] = lgA.W.s[1] = nullptr;
        lgA.W.n_split = E, lgA.W.N = E, lgA.W.K = H, lgA.W.fmt = WF_BF16;
        lgA.A = ra.x;
        lgA.shared = 1;
        lgA.ntok = ntok;
        lgA.small = ra.small_max; /* every larger token count takes the tensor-core kernel, split over K when the chunk is small */
        lgA.outf = at<float>(b, L.logits);
        lgA.kslice = L.lslices > 1 ? H / L.lslices : 0;
        lgA.out_slice = L.tc * E;
        (void)launch_tiles(WF_BF16, 0, dim3((unsigned)cdiv(L.tc, DSV4C_BM), (unsigned)cdiv(E, DSV4C_BN), (unsigned)L.lslices),
                           s, b->pdl, lgA); /* its error: the caller's peek */
    }
    if (fused)
        /* its error: the caller's peek */
        (void)launch_router_count(ra, g2, ticket, (unsigned)L.tc, rsm, s, b->pdl, b->weights_warp, b->dec_early, rcode);
    else if (b->router_warp && b->fast && ra.lslices == 1 && router_warp_fits(E, K))
        /* params router=warp: a warp a token; x is quantized after the grouping (gather=quant) */
        (void)launch_router_warp(ra, (unsigned)L.tc, s, b->pdl); /* its error: the caller's peek */
    else
        launch_pdl(b, k_router, dim3((unsigned)L.tc), 256, rsm, s, ra);
    if (mode == CHUNK_ROUTE) /* the route stage (stages.cu) */
        return cudaPeekAtLastError();
    if (mode == CHUNK_SLOTS) { /* the experts stage: its slot list replaces the router's choice */
        cudaError_t ce = cudaMemcpyAsync(ra.ids, b->hbuf + L.ids, (size_t)(L.w + (uint64_t)L.slots * 4 - L.ids),
                                         cudaMemcpyHostToDevice, s);
        if (ce != cudaSuccess)
            return ce;
    }
    if (b->fast)
        return enqueue_fast(b, L, ra, ga, fused, mode == CHUNK_FULL, fused && b->dec_early && b->pdl ? ticket : nullptr,
                            sh_forked);
    k_count<<<1, 1024, (size_t)E * 4, s>>>(ga);
    k_place<<<(unsigned)E, 256, 0, s>>>(ga);

    GemmArgs g;
    memset(&g, 0, sizeof g);
    g.ntok = ntok, g.cnt = ga.cnt, g.slot_off = ga.slot_off, g.pad_off = ga.pad_off, g.active = ga.active;
    g.meta = ga.meta, g.tile_e = ga.tile_e, g.tile_r0 = ga.tile_r0, g.slot_tok = ga.slot_tok, g.small = b->small;
    /* a routed group holds at most Tc rows (top-K ids are distinct), or every slot when a hash
       table repeats an expert */
    g.smem_rows = gemv_rows(b, b->repeats ? L.slots : L.tc);
    const int64_t act_max = L.slots < E ? L.slots : E;
    const bool tiles_needed = L.slots > b->small;
    const unsigned tgrid = (unsigned)L.tiles;
    uint16_t *GU = at<uint16_t>(b, L.gu), *O = at<uint16_t>(b, L.o);
    /* routed gate/up */
    g.W = desc_routed_gu(b);
    exact_act(g, b->routed_q, b, L.xq, L.x, L.xs);
    g.gather = 1;
    g.out = GU;
    launch_exact(g, (unsigned)act_max, tiles_needed ? tgrid : 0, s);
    /* epilogue */
    SwigluArgs sa;
    memset(&sa, 0, sizeof sa);
    sa.GU = GU;
    sa.hq = b->qh_routed ? at<uint8_t>(b, L.hq) : nullptr;
    sa.hs = b->qh_routed ? at<float>(b, L.hs) : nullptr;
    sa.hb = at<uint16_t>(b, L.hq);
    sa.ntok = ntok, sa.meta = ga.meta, sa.slot_row = ga.slot_row, sa.slot_w = ga.slot_w, sa.stats = stats;
    sa.I = I, sa.shared = 0, sa.clamp = 1, sa.before = c->weight_point == DSV4_WEIGHT_BEFORE_W2;
    sa.qmode = (int)c->act_quant, sa.L = c->swiglu_limit;
    k_swiglu<<<(unsigned)L.slots, 128, 0, s>>>(sa);
    /* routed down */
    g.W = desc_one(b->rw[2]);
    exact_act(g, b->qh_routed, b, L.hq, L.hq, L.hs);
    g.gather = 0;
    g.out = O;
    launch_exact(g, (unsigned)act_max, tiles_needed ? tgrid : 0, s);
    /* shared expert: rows [0, Tc) of the gate/up and h buffers (free again), output into osh */
    if (c->n_shared_experts > 0) {
        GemmArgs h = g;
        h.shared = 1;
        h.gather = 0;
        h.W = desc_shared_gu(b);
        exact_act(h, b->shared_q, b, L.xq, L.x, L.xs);
        h.out = GU;
        h.smem_rows = gemv_rows(b, L.tc);
        const unsigned sh_tiles = L.tc <= b->small ? 0 : (unsigned)cdiv(L.tc, DSV4C_BM);
        launch_exact(h, 1, sh_tiles, s);
        SwigluArgs ss = sa;
        ss.shared = 1;
        ss.clamp = c->shared_clamp;
        ss.hq = b->qh_shared ? at<uint8_t>(b, L.hq) : nullptr;
        ss.hs = b->qh_shared ? at<float>(b, L.hs) : nullptr;
        k_swiglu<<<(unsigned)L.tc, 128, 0, s>>>(ss);
        h.W = desc_one(b->sw[2]);
        exact_act(h, b->qh_shared, b, L.hq, L.hq, L.hs);
        h.out = at<uint16_t>(b, L.osh);
        launch_exact(h, 1, sh_tiles, s);
    }
    /* combine into the x buffer (x is no longer read) */
    CombineArgs ca;
    ca.O = O;
    ca.Osh = c->n_shared_experts > 0 ? at<uint16_t>(b, L.osh) : nullptr;
    ca.ids = ra.ids, ca.rowmap = ga.rowmap, ca.w = ra.w;
    ca.y = at<uint16_t>(b, L.x);
    ca.ntok = ntok;
    ca.H = H, ca.E = E, ca.K = K, ca.after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
    launch_combine(b, ca, L.tc, s);
    return cudaPeekAtLastError();
}

/* The rows a chunk of tc rows starting at row t0 of the call computes: tc, or the caller's
   device count less t0, clamped to [0, tc] (read on the device: a captured call reads it at replay). */
__device__ __forceinline__ int chunk_rows(const int32_t *valid, long long t0, int tc)
{
    if (!valid)
        return tc;
    const long long v = (long long)*valid - t0;
    return v < 0 ? 0 : v > tc ? tc : (int)v;
}

/* One chunk's transfers between the caller's device tensors and the workspace (dsv4_backend_enqueue). */
struct IoArgs {
    const int32_t *valid; /* the caller's valid row count, or NULL */
    long long t0;         /* the chunk's first row within the call */
    int tc, H, K, hash;
    const uint16_t *x;      /* the caller's x at row t0 */
    const int32_t *in_ids;  /* the caller's input ids at row t0 (hash layers) */
    uint16_t *y;            /* the caller's outputs at row t0 (ids, w, kept may be NULL) */
    int32_t *ids;
    float *w;
    int32_t *kept;
    uint16_t *ws_x;         /* the chunk's buffers in the workspace */
    int32_t *ws_in_ids, *ws_ntok, *ws_ids, *ws_kept;
    float *ws_w;
    unsigned long long *ws_stats, *ctl;
};

/* A block copies one row of H bf16 values (zeros when !live): 16 bytes a thread and four in flight
   before their stores when both ends are 16-byte aligned (the caller's tensors need not be), else
   2 bytes a thread. A loop of dependent 2-byte copies took 8 us for one row on the H200. */
__device__ __forceinline__ void copy_row(uint16_t *dst, const uint16_t *src, int H, bool live)
{
    if (((uintptr_t)dst | (uintptr_t)src) % 16 == 0 && H % 8 == 0) {
        const uint4 *s8 = (const uint4 *)src;
        uint4 *d8 = (uint4 *)dst;
        const int n8 = H / 8, step = (int)blockDim.x;
        for (int i0 = (int)threadIdx.x; i0 < n8; i0 += 4 * step) {
            uint4 v[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                v[q] = live && i0 + q * step < n8 ? __ldg(s8 + i0 + q * step) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (i0 + q * step < n8)
                    d8[i0 + q * step] = v[q];
        }
        return;
    }
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        dst[i] = live ? src[i] : (uint16_t)0;
}

/* In: the token count (the row count, or the caller's valid rows), the chunk's counters zeroed,
   the live rows of x and of the input ids. One block per row. */
__global__ void k_io_in(IoArgs a)
{
    pdl_enter();
    const int t = blockIdx.x, n = chunk_rows(a.valid, a.t0, a.tc);
    if (t == 0 && threadIdx.x == 0)
        *a.ws_ntok = n;
    if (t == 0 && threadIdx.x < ST_N)
        a.ws_stats[threadIdx.x] = 0;
    if (t >= n)
        return;
    copy_row(a.ws_x + (size_t)t * a.H, a.x + (size_t)t * a.H, a.H, true);
    if (a.hash && threadIdx.x == 0)
        a.ws_in_ids[t] = a.in_ids[t];
}

/* Out: the live rows' outputs, zeros for the padding rows; block 0 latches the chunk's counters
   and input errors into the backend's error word. */
__global__ void k_io_out(IoArgs a)
{
    pdl_enter();
    const int t = blockIdx.x, n = chunk_rows(a.valid, a.t0, a.tc);
    const bool live = t < n;
    copy_row(a.y + (size_t)t * a.H, a.ws_x + (size_t)t * a.H, a.H, live);
    for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
        const size_t j = (size_t)t * a.K + k;
        if (a.ids)
            a.ids[j] = live ? a.ws_ids[j] : 0;
        if (a.w)
            a.w[j] = live ? a.ws_w[j] : 0.0f;
    }
    if (threadIdx.x == 0 && a.kept)
        a.kept[t] = live ? a.ws_kept[t] : 0;
    if (t == 0 && threadIdx.x < ST_N) {
        const unsigned long long v = a.ws_stats[threadIdx.x];
        if (v && threadIdx.x == ST_BADIN_AT)
            atomicMax(&a.ctl[ST_BADIN_AT], v);
        else if (v)
            atomicAdd(&a.ctl[threadIdx.x], v);
    }
}

#endif
