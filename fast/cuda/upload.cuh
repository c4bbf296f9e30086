/*
 * Part of fast/cuda/cuda.cu's translation unit, included by it (inside its anonymous namespace, after
 * the forward and the vtable); not a header of its own. The weights at creation: matrix sizes and
 * views of the checkpoint, the exact path's upload, the kernel variants of
 * dsv4_backend_options.cuda_kernels (parse_kernels, set_kernels, want_fast), the fragment-native
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

/*
 * The view of one matrix in the wanted format: as stored, or (a bf16 stacked checkpoint under a
 * quantized config) quantized here on the host exactly as the reference does. *qbuf / *sbuf own
 * the quantized bytes (NULL when the view is used as stored).
 */
dsv4_status view_as(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t e, int p, dsv4_matrix_view *v,
                    uint8_t **qbuf, uint8_t **sbuf, dsv4_error *err)
{
    *qbuf = *sbuf = nullptr;
    dsv4_status st = dsv4_weights_matrix(ck, c, e, (dsv4_proj)p, v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
    if (v->format == want)
        return DSV4_OK;
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
    if (st) {
        free(*qbuf), free(*sbuf);
        *qbuf = *sbuf = nullptr;
        return st;
    }
    v->format = want;
    v->scale_format = c->weight_scale;
    v->data = *qbuf;
    v->scales = *sbuf;
    v->row_bytes = want == DSV4_FORMAT_FP8 ? (uint64_t)k : (uint64_t)k / 2;
    return DSV4_OK;
}

/* Uploads projection p of experts [0, count) (count 1 and e = shared for the shared expert). */
dsv4_status upload(CudaBe *b, const dsv4_checkpoint *ck, bool shared, int p, DevMat *m, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    int64_t count = shared ? 1 : c->n_routed_experts;
    for (int64_t e = 0; e < count; e++) {
        dsv4_matrix_view v;
        uint8_t *qb, *sb;
        dsv4_status st = view_as(ck, c, shared ? DSV4_SHARED_EXPERT : e, p, &v, &qb, &sb, err);
        if (st)
            return st;
        int sfp32 = v.format == DSV4_FORMAT_FP8 && v.scale_format == DSV4_SCALE_FP32;
        uint64_t db, sbytes;
        mat_bytes(v.format, sfp32, v.n, v.k, &db, &sbytes);
        if (e == 0) {
            m->n = (int)v.n, m->k = (int)v.k, m->fmt = (int)v.format, m->sfp32 = sfp32;
            m->w_stride = (long long)align256(db), m->s_stride = (long long)align256(sbytes);
            cudaError_t ce = cudaMalloc((void **)&m->w, (size_t)(m->w_stride * count));
            if (ce == cudaSuccess)
                ce = cudaMalloc((void **)&m->s, (size_t)(m->s_stride * count));
            if (ce != cudaSuccess) {
                free(qb), free(sb);
                return dsv4_seterr(err, DSV4_ERR_NOMEM, v.key, "cudaMalloc of %llu bytes of weights failed: %s",
                                   (unsigned long long)(m->w_stride * count), cudaGetErrorString(ce));
            }
        } else if ((int)v.format != m->fmt || sfp32 != m->sfp32 || v.n != m->n || v.k != m->k) {
            free(qb), free(sb);
            return dsv4_seterr(err, DSV4_ERR_SHAPE, v.key,
                               "format or shape differs from expert 0's (every routed expert must share them)");
        }
        uint64_t natural = v.format == DSV4_FORMAT_FP4 ? (uint64_t)v.k / 2
                           : v.format == DSV4_FORMAT_FP8 ? (uint64_t)v.k
                                                         : (uint64_t)v.k * 2;
        cudaError_t ce = cudaMemcpy2D(m->w + e * m->w_stride, natural, v.data, v.row_bytes, natural, (size_t)v.n,
                                      cudaMemcpyHostToDevice);
        if (ce == cudaSuccess && sbytes)
            ce = cudaMemcpy(m->s + e * m->s_stride, v.scales, sbytes, cudaMemcpyHostToDevice);
        free(qb), free(sb);
        if (ce != cudaSuccess)
            return dsv4_seterr(err, DSV4_ERR_DEVICE, v.key, "upload failed: %s", cudaGetErrorString(ce));
    }
    return DSV4_OK;
}

/* The kernel variants of dsv4_backend_options.cuda_kernels (backend.h); the defaults when empty. */
struct Kernels {
    bool exact_path = false, mma_tiles = false;
    int big_var = 0, mid_var = 0, fp8_cut = DSV4C_FP8_CUT_ROWS;
    bool fp8_rows = false; /* fp8_scales=rows: the FP8 GEMM's weight scales per row even where blocks convert */
};

dsv4_status parse_kernels(const char *spec, Kernels *k, dsv4_error *err)
{
    *k = Kernels();
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (!eq || eq >= p + n)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: '%.*s' is not key=value (keys: path, tile, tileh, mid, fp8_cut, fp8_scales)", (int)n, p);
        const size_t kl = (size_t)(eq - p), vl = n - kl - 1;
        const char *v = eq + 1;
        auto is = [&](const char *key) { return kl == strlen(key) && !strncmp(p, key, kl); };
        auto val = [&](const char *s) { return vl == strlen(s) && !strncmp(v, s, vl); };
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
        else if (is("fp8_cut")) {
            char buf[16] = {0};
            char *e = nullptr;
            memcpy(buf, v, vl < sizeof buf - 1 ? vl : sizeof buf - 1);
            const long c = strtol(buf, &e, 10);
            ok = vl > 0 && vl < sizeof buf && *e == 0 && c >= FM_DEC_MAX && c <= FM_MID_MAX;
            k->fp8_cut = (int)c;
        } else
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: unknown key '%.*s' (keys: path, tile, tileh, mid, fp8_cut, fp8_scales)", (int)kl, p);
        if (!ok)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: '%.*s' is not a value of %.*s (path auto|exact, tile wgmma|mma, tileh "
                               "s128|s64x2|p64|s64|p128, mid mma|p32|s32, fp8_cut %d..%d, fp8_scales auto|rows)",
                               (int)vl, v, (int)kl, p, FM_DEC_MAX, FM_MID_MAX);
        p = end ? end + 1 : p + n;
    }
    return DSV4_OK;
}

/* The kernel choice for large and mid-size groups. */
void set_kernels(CudaBe *b, const Kernels &k = Kernels())
{
    b->tile16 = !k.mma_tiles;
    b->big_var = k.big_var;
    b->mid_var = k.mid_var;
    b->fp8_cut = k.fp8_cut;
    b->fp8_rows = k.fp8_rows;
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
    const dsv4_config *cfg;
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
            st = view_as(j->ck, j->cfg, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v[m], &qb[m], &sb[m],
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
    const int64_t count = shared ? 1 : c->n_routed_experts;
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
    FProj &f = b->fp[slot];
    f.w = b->fbuf[2 * slot], f.s = b->fbuf[2 * slot + 1], f.w_stride = (long long)ws, f.s_stride = (long long)ss;
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
        j.ck = ck, j.cfg = c, j.shared = shared, j.gu = gu, j.e0 = e0, j.n = n, j.k = k;
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
                                 (long long)(e0 + i));
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
    const dsv4_config *cfg;
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
            st = view_as(j->ck, j->cfg, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v, &qb, &sb,
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

/* gemm fp8: projection `gu` (gate|up) or down of the routed experts (slot 0 / 1) or the shared one
   (2 / 3) as row-major e4m3 with N-major scales of b->sfb_rows rows (gemm_fp8.h); ok[e] &= converted
   exactly. With 128-row scales, *lost counts the experts that a 128-row block refuses though every
   1x128 group of theirs converts (the caller then converts the layer per row instead). */
dsv4_status upload_fp8(CudaBe *b, const dsv4_checkpoint *ck, bool shared, bool gu, int threads, int slot,
                       uint8_t *ok, int64_t *lost, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const int64_t count = shared ? 1 : c->n_routed_experts, br = b->sfb_rows;
    const int64_t n = gu ? c->moe_inter_dim : c->dim, k = gu ? c->dim : c->moe_inter_dim, rows = (gu ? 2 : 1) * n;
    const uint64_t wbytes = (uint64_t)(rows * k), sbytes = (uint64_t)((rows / br) * (k / 128)) * 4;
    cudaError_t ce = cudaMalloc((void **)&b->w8[slot], (size_t)(wbytes * count));
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&b->s8[slot], (size_t)(sbytes * count));
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of %llu bytes of fp8 GEMM weights failed: %s",
                           (unsigned long long)(wbytes * count), cudaGetErrorString(ce));
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
        j.ck = ck, j.cfg = c, j.shared = shared, j.gu = gu, j.e0 = e0, j.n = n, j.k = k, j.br = br;
        j.hw = hw, j.hs = hsb, j.ok = oks, j.rows_ok = oks + batch, j.st = sts, j.errs = errs;
        const int64_t m = std::min(batch, count - e0);
        dsv4_parallel_for(threads, m, 1, fp8_range, &j);
        for (int64_t i = 0; i < m && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            }
            ok[e0 + i] &= oks[i];
            *lost += !oks[i] && j.rows_ok[i];
        }
        if (!st && ((ce = cudaMemcpy(b->w8[slot] + e0 * wbytes, hw, (size_t)(wbytes * m), cudaMemcpyHostToDevice)) !=
                        cudaSuccess ||
                    (ce = cudaMemcpy((uint8_t *)b->s8[slot] + e0 * sbytes, hsb, (size_t)(sbytes * m),
                                     cudaMemcpyHostToDevice)) != cudaSuccess))
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "fp8 GEMM weight upload failed: %s", cudaGetErrorString(ce));
    }
    free(hw), free(hsb), free(sts), free(errs), free(oks);
    return st;
}

dsv4_status upload_f32(const float *src, size_t n, float **dst, const char *what, dsv4_error *err)
{
    *dst = nullptr;
    if (!src)
        return DSV4_OK;
    cudaError_t ce = cudaMalloc((void **)dst, n * sizeof(float));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of %s failed: %s", what, cudaGetErrorString(ce));
    return DSV4_OK;
}

#endif
