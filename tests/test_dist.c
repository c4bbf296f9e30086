#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "fast/backend/backend_impl.h"
#include "fast/multirank/driver_impl.h"
#include "dsv4moe/ref.h"
#include "core/testctl.h"
#include "tests/testutil.h"
#include "tests/tp_cases.h"

Suite *dist_suite(void);

/* A generated layer and enough input tokens for every rank. */
typedef struct {
    dsv4_config c;
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    const uint16_t *x;  /* [pool, H] */
    const int32_t *ids; /* [pool] */
    int64_t pool;
} layer;

static layer make_layer_cfg(const dsv4_config *c, const char *tag)
{
    layer L;
    memset(&L, 0, sizeof L);
    L.c = *c;
    L.pool = 400;
    char w[512], in[512], name[96];
    snprintf(name, sizeof name, "dist_%s.safetensors", tag);
    tu_path(w, sizeof w, name);
    snprintf(name, sizeof name, "dist_%s_in.safetensors", tag);
    tu_path(in, sizeof in, name);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = 5;
    dsv4_error e;
    ck_assert_int_eq(dsv4_gen_weights(&L.c, &o, w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_gen_input(&L.c, &o, L.pool, in, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_checkpoint_open(w, &L.ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_open(in, &L.in, &e), DSV4_OK);
    L.x = dsv4_st_find(L.in, "x")->data;
    L.ids = dsv4_st_find(L.in, "input_ids")->data;
    return L;
}

static layer make_layer(const char *preset, int64_t l, const char *tag)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(preset, &c, NULL), DSV4_OK);
    c.layer = l;
    return make_layer_cfg(&c, tag);
}

static void free_layer(layer *L)
{
    dsv4_st_close(L->in);
    dsv4_checkpoint_close(L->ck);
}

static dsv4_topology topo_of(int world, int tp, int dp, int ep, int64_t max_tokens)
{
    dsv4_topology t;
    dsv4_topology_init(&t);
    t.world_size = world;
    t.tp = tp;
    t.dp = dp;
    t.ep = ep;
    t.max_tokens_per_rank = max_tokens;
    t.role = DSV4_ROLE_MIXED;
    return t;
}

/* Each rank takes `counts[r]` tokens from the pool, starting at offs[r] (the same for a tp group). */
typedef struct {
    dsv4_dist_rank r[DSV4_COMM_MAX_RANKS];
    uint16_t *y[DSV4_COMM_MAX_RANKS];
    int32_t *ids[DSV4_COMM_MAX_RANKS];
    float *w[DSV4_COMM_MAX_RANKS];
} ranks_io;

static void setup_io(ranks_io *io, const layer *L, int world, const int64_t *counts, const int64_t *offs)
{
    memset(io, 0, sizeof *io);
    int64_t H = L->c.dim, K = L->c.n_activated;
    for (int r = 0; r < world; r++) {
        ck_assert(offs[r] + counts[r] <= L->pool);
        io->y[r] = calloc((size_t)(counts[r] * H + 1), 2);
        io->ids[r] = calloc((size_t)(counts[r] * K + 1), 4);
        io->w[r] = calloc((size_t)(counts[r] * K + 1), 4);
        io->r[r] = (dsv4_dist_rank){.tokens = counts[r], .x = L->x + offs[r] * H, .input_ids = L->ids + offs[r],
                                    .y = io->y[r], .topk_ids = io->ids[r], .topk_weights = io->w[r]};
    }
}

static void free_io(ranks_io *io, int world)
{
    for (int r = 0; r < world; r++) {
        dsv4_dist_rank_release(&io->r[r]);
        free(io->y[r]);
        free(io->ids[r]);
        free(io->w[r]);
    }
}

/* The single-rank reference on the same tokens. */
static void ref_alone(const layer *L, int64_t off, int64_t n, uint16_t *y, int32_t *ids)
{
    dsv4_ref *r;
    dsv4_error e;
    ck_assert_int_eq(dsv4_ref_create(&L->c, L->ck, 1, &r, &e), DSV4_OK);
    uint16_t *x = malloc((size_t)(n * L->c.dim + 1) * 2);
    memcpy(x, L->x + off * L->c.dim, (size_t)(n * L->c.dim) * 2);
    dsv4_ref_output out = {.y = y, .topk_ids = ids};
    ck_assert_msg(dsv4_ref_forward(r, n, x, L->ids + off, &out, &e) == DSV4_OK, "%s", e.message);
    free(x);
    dsv4_ref_free(r);
}

static dsv4_budget big_budget(void)
{
    dsv4_budget b;
    dsv4_budget_init(&b);
    return b;
}

static const struct {
    const char *preset;
    int64_t layer;
} ep_layers[] = {{"mini", 0}, {"mini", 1}, {"mini-topp", 1}, {"mini-fp8", 2}, {"mini-bf16", 3}};

/* The fingerprint sequence of rank r: (group, seq, op, dtype, tag) of each collective. */
static int same_sequence(const dsv4_dist_rank *a, const dsv4_dist_rank *b)
{
    if (a->trace_len != b->trace_len)
        return 0;
    for (size_t i = 0; i < a->trace_len; i++) {
        const dsv4_coll_record *x = &a->trace[i], *y = &b->trace[i];
        if (x->group != y->group || x->seq != y->seq || x->op != y->op || x->dtype != y->dtype ||
            strcmp(x->tag, y->tag))
            return 0;
        if (x->op != DSV4_COLL_ALL_TO_ALLV && x->count != y->count)
            return 0;
    }
    return 1;
}

/* The single-rank counterpart (dsv4_dist_single_rank) of a step: y[r] gets rank r's rows. */
static void single_rank(const layer *L, const dsv4_topology *t, int world, const int64_t *counts, const int64_t *offs,
                        uint16_t **y)
{
    ranks_io io;
    setup_io(&io, L, world, counts, offs);
    for (int r = 0; r < world; r++)
        io.r[r].y = y[r];
    dsv4_budget b = big_budget();
    dsv4_error e;
    ck_assert_msg(dsv4_dist_single_rank(&L->c, L->ck, t, &b, NULL, io.r, &e) == DSV4_OK, "%s", e.message);
    for (int r = 0; r < world; r++)
        io.r[r].y = io.y[r];
    free_io(&io, world);
}

/* ep 2, 4, 8 on the ref and the cpu backend: every rank's rows bit-identical to the backend on one
   rank (ref: the single-rank reference on the rank's tokens; both: the single-rank counterpart,
   dsv4_dist_single_rank), identical collective sequences, each rank's peak within the plan. */
START_TEST(ep_reproduces_single_rank_bit_for_bit)
{
    char tag[64];
    snprintf(tag, sizeof tag, "ep%d", _i);
    layer L = make_layer(ep_layers[_i].preset, ep_layers[_i].layer, tag);
    int64_t H = L.c.dim, K = L.c.n_activated;
    const int64_t counts[8] = {37, 0, 5, 130, 1, 0, 64, 9};
    for (int kind = 0; kind < 2; kind++)
        for (int ep = 2; ep <= 8; ep *= 2) {
            int64_t offs[8];
            for (int r = 0, o = 0; r < ep; o += (int)counts[r], r++)
                offs[r] = o;
            ranks_io io;
            setup_io(&io, &L, ep, counts, offs);
            dsv4_topology t = topo_of(ep, 1, ep, ep, 256);
            t.backend = kind ? DSV4_BACKEND_CPU : DSV4_BACKEND_REF;
            t.chunk_tokens = 128; /* rank 3's 130 tokens take two chunks; every rank runs two */
            dsv4_budget b = big_budget();
            dsv4_error e;
            ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io.r, &e) == DSV4_OK, "ep %d: %s", ep,
                          e.message);
            uint16_t *ys[8];
            for (int r = 0; r < ep; r++)
                ys[r] = calloc((size_t)(counts[r] * H + 1), 2);
            single_rank(&L, &t, ep, counts, offs, ys);
            for (int r = 0; r < ep; r++) {
                ck_assert_int_eq(io.r[r].chunks, counts[3] > 128 && ep > 3 ? 2 : 1);
                int64_t i = 0;
                while (i < counts[r] * H && ys[r][i] == io.y[r][i])
                    i++;
                ck_assert_msg(i == counts[r] * H, "%s layer %lld %s ep %d rank %d: token %lld channel %lld",
                              ep_layers[_i].preset, (long long)ep_layers[_i].layer, kind ? "cpu" : "ref", ep, r,
                              (long long)(i / H), (long long)(i % H));
                if (!kind) { /* the reference's stages are its forward's */
                    uint16_t *y = calloc((size_t)(counts[r] * H + 1), 2);
                    int32_t *ids = calloc((size_t)(counts[r] * K + 1), 4);
                    ref_alone(&L, offs[r], counts[r], y, ids);
                    ck_assert_msg(memcmp(y, io.y[r], (size_t)(counts[r] * H) * 2) == 0,
                                  "%s layer %lld ep %d rank %d differs", ep_layers[_i].preset,
                                  (long long)ep_layers[_i].layer, ep, r);
                    ck_assert_int_eq(memcmp(ids, io.ids[r], (size_t)(counts[r] * K) * 4), 0);
                    free(y);
                    free(ids);
                }
                ck_assert_msg(same_sequence(&io.r[0], &io.r[r]), "ep %d: rank %d's collectives differ", ep, r);
                /* The rank's buffers were measured; a rank with tokens holds some, and the plan
                   accounts for the step it ran. */
                ck_assert_uint_gt(io.r[r].workspace_planned, 0);
                if (counts[r] > 0)
                    ck_assert_uint_gt(io.r[r].workspace_peak, (uint64_t)(counts[r] * H * 4));
                ck_assert_msg(io.r[r].workspace_peak <= io.r[r].workspace_planned, "rank %d: peak %llu above plan %llu",
                              r, (unsigned long long)io.r[r].workspace_peak,
                              (unsigned long long)io.r[r].workspace_planned);
                if (getenv("DSV4MOE_PRINT_WORKSPACE"))
                    fprintf(stderr, "%s ep %d rank %d T %lld: planned %llu peak %llu\n", kind ? "cpu" : "ref", ep, r,
                            (long long)counts[r], (unsigned long long)io.r[r].workspace_planned,
                            (unsigned long long)io.r[r].workspace_peak);
                free(ys[r]);
            }
            free_io(&io, ep);
        }
    free_layer(&L);
}
END_TEST

/* The single-rank counterpart runs the ranks' own backend parameters (a parameter that changes a
   kernel's arithmetic, as the cuda backend's direct= does, must change the counterpart's too): an
   ep 2 step on the cpu backend with kernels=ref is bit-identical to its counterpart with the same
   parameters; a parameter the backend refuses is refused by the counterpart too; a stand-in
   computing backend takes none of them. */
START_TEST(single_rank_takes_the_ranks_params)
{
    layer L = make_layer("mini", 1, "params");
    const int64_t H = L.c.dim, counts[2] = {37, 130}, offs[2] = {0, 37};
    dsv4_topology t = topo_of(2, 1, 2, 2, 256);
    t.backend = DSV4_BACKEND_CPU;
    t.chunk_tokens = 128;
    dsv4_budget b = big_budget();
    dsv4_dist_options o;
    dsv4_dist_options_init(&o);
    o.backend_params = "kernels=ref";
    dsv4_error e;
    ranks_io io, one;
    setup_io(&io, &L, 2, counts, offs);
    ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, &o, io.r, &e) == DSV4_OK, "%s", e.message);
    setup_io(&one, &L, 2, counts, offs);
    ck_assert_msg(dsv4_dist_single_rank(&L.c, L.ck, &t, &b, &o, one.r, &e) == DSV4_OK, "%s", e.message);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(memcmp(io.y[r], one.y[r], (size_t)(counts[r] * H) * 2) == 0, "rank %d differs", r);
    o.backend_params = "kernels=avx9";
    ck_assert_int_eq(dsv4_dist_single_rank(&L.c, L.ck, &t, &b, &o, one.r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_msg(strstr(e.message, "avx9"), "%s", e.message);
    o.compute_backend = DSV4_BACKEND_REF; /* a stand-in: the ranks' parameters are not its own */
    ck_assert_msg(dsv4_dist_single_rank(&L.c, L.ck, &t, &b, &o, one.r, &e) == DSV4_OK, "%s", e.message);
    free_io(&io, 2);
    free_io(&one, 2);
    free_layer(&L);
}
END_TEST

START_TEST(tp_shards_agree_with_reference)
{
    /* mini-bf16 (I = 128): tp = 2 gives 64-row shards, which bf16 weights allow. */
    layer B = make_layer("mini-bf16", 1, "tpbf16");
    int64_t H = B.c.dim;
    const int64_t counts[2] = {40, 40}, offs[2] = {3, 3};
    ranks_io io;
    setup_io(&io, &B, 2, counts, offs);
    dsv4_topology t = topo_of(2, 2, 1, 1, 256);
    dsv4_budget b = big_budget();
    dsv4_error e;
    dsv4_status st = dsv4_dist_forward(&B.c, B.ck, &t, &b, NULL, io.r, &e);
    ck_assert_msg(st == DSV4_OK, "%s", e.message);
    uint16_t *y = calloc((size_t)(40 * H + 1), 2);
    int32_t ids[160];
    ref_alone(&B, 3, 40, y, ids);
    int64_t same = 0, close = 0;
    for (int64_t i = 0; i < 40 * H; i++) {
        float a = dsv4_bf16_to_f32(y[i]), v0 = dsv4_bf16_to_f32(io.y[0][i]), v1 = dsv4_bf16_to_f32(io.y[1][i]);
        ck_assert(v0 == v1 || (v0 != v0 && v1 != v1)); /* both tp ranks hold the same output */
        same += a == v0;
        float d = a - v0;
        close += (d < 0 ? -d : d) <= 0.02f * (a < 0 ? -a : a) + 1e-3f;
    }
    ck_assert_msg(close == 40 * H, "%lld of %lld within tolerance", (long long)close, (long long)(40 * H));
    ck_assert_msg(same > 40 * H * 9 / 10, "only %lld of %lld bit-identical", (long long)same, (long long)(40 * H));
    free(y);
    free_io(&io, 2);
    free_layer(&B);
}
END_TEST


/* tp = 2 on the cpu backend: both tp ranks hold the same rows, within tolerance of the cpu
   backend's single-rank counterpart and of the reference (the layers of tests/tp_cases.h). */
START_TEST(cpu_tp_within_tolerance)
{
    dsv4_config c;
    ck_assert_int_eq(tp_case_config(_i, &c), DSV4_OK);
    char tag[32];
    snprintf(tag, sizeof tag, "cputp%d", _i);
    layer B = make_layer_cfg(&c, tag);
    int64_t H = B.c.dim, n = 40;
    const int64_t counts[2] = {40, 40}, offs[2] = {3, 3};
    ranks_io io;
    setup_io(&io, &B, 2, counts, offs);
    dsv4_topology t = topo_of(2, 2, 1, 1, 256);
    t.backend = DSV4_BACKEND_CPU;
    dsv4_budget b = big_budget();
    dsv4_error e;
    ck_assert_msg(dsv4_dist_forward(&B.c, B.ck, &t, &b, NULL, io.r, &e) == DSV4_OK, "%s", e.message);
    uint16_t *yr = calloc((size_t)(n * H + 1), 2), *ys0 = calloc((size_t)(n * H + 1), 2),
             *ys1 = calloc((size_t)(n * H + 1), 2);
    int32_t ids[160];
    ref_alone(&B, 3, n, yr, ids);
    uint16_t *ys[2] = {ys0, ys1};
    single_rank(&B, &t, 2, counts, offs, ys);
    int64_t close = 0, same = 0;
    double rms = 0;
    for (int64_t i = 0; i < n * H; i++) {
        float a = dsv4_bf16_to_f32(yr[i]);
        rms += (double)a * a;
    }
    float tol = 0.035f + 0.1f * (float)sqrt(rms / (double)(n * H)); /* the runner's fp8/fp4 bound */
    for (int64_t i = 0; i < n * H; i++) {
        float a = dsv4_bf16_to_f32(yr[i]), c1 = dsv4_bf16_to_f32(ys0[i]);
        float v0 = dsv4_bf16_to_f32(io.y[0][i]);
        ck_assert(io.y[0][i] == io.y[1][i]);
        float d = a - v0, d1 = c1 - v0;
        close += (d < 0 ? -d : d) <= tol && (d1 < 0 ? -d1 : d1) <= tol;
        same += c1 == v0;
    }
    ck_assert_msg(close == n * H, "case %d: %lld of %lld within tolerance", _i, (long long)close, (long long)(n * H));
    ck_assert_msg(same > n * H * 8 / 10, "case %d: only %lld of %lld bit-identical to one rank", _i, (long long)same,
                  (long long)(n * H));
    for (int r = 0; r < 2; r++)
        ck_assert_msg(io.r[r].workspace_peak <= io.r[r].workspace_planned, "rank %d: peak %llu above plan %llu", r,
                      (unsigned long long)io.r[r].workspace_peak, (unsigned long long)io.r[r].workspace_planned);
    ck_assert(same_sequence(&io.r[0], &io.r[1]));
    free(yr);
    free(ys0);
    free(ys1);
    free_io(&io, 2);
    free_layer(&B);
}
END_TEST

START_TEST(per_rank_token_vectors_give_identical_sequences)
{
    layer L = make_layer("mini", 2, "sym");
    const int64_t vecs[5][4] = {
        {0, 0, 0, 0},      /* all-empty decode step */
        {0, 3, 7, 1},      /* one rank empty */
        {1, 1, 1, 1},
        {300, 2, 0, 5},    /* one rank above the largest capture bucket (64): eager for all */
        {64, 64, 0, 64},   /* a bucket exactly */
    };
    for (int v = 0; v < 5; v++) {
        for (int graph = 0; graph < 2; graph++) {
            int64_t offs[4] = {0, 0, 0, 0};
            for (int r = 1; r < 4; r++)
                offs[r] = offs[r - 1] + vecs[v][r - 1];
            ranks_io io;
            setup_io(&io, &L, 4, vecs[v], offs);
            dsv4_topology t = topo_of(4, 1, 4, 4, 512);
            t.backend = DSV4_BACKEND_CUDA;
            t.sm = 90;
            t.role = DSV4_ROLE_DECODE;
            t.cuda_graph = graph;
            t.n_buckets = graph ? 4 : 0;
            const int64_t bk[4] = {8, 16, 32, 64};
            memcpy(t.buckets, bk, sizeof bk);
            /* Rank 2 runs eager in the first vectors (a rank-local fallback); from vector 2 on,
               every rank that fits a bucket could replay. */
            for (int r = 0; r < 4; r++)
                io.r[r].can_replay = graph && vecs[v][r] <= 64 && (v >= 2 || r != 2);
            dsv4_budget b = big_budget();
            dsv4_error e;
            dsv4_dist_options o;
            dsv4_dist_options_init(&o);
            o.compute_backend = DSV4_BACKEND_CPU; /* the cuda plan's protocol, computed by cpu stages */
            ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, &o, io.r, &e) == DSV4_OK, "vec %d graph %d: %s", v,
                          graph, e.message);
            for (int r = 0; r < 4; r++) {
                ck_assert_msg(same_sequence(&io.r[0], &io.r[r]), "vec %d graph %d: rank %d's collectives differ", v,
                              graph, r);
                ck_assert_uint_gt(io.r[r].trace_len, 0); /* the meta collective at least, even at T = 0 */
                /* A step replays only when every rank can: never with rank 2 eager, never above a bucket. */
                int want = graph && v >= 2 && v != 3;
                ck_assert_msg(io.r[r].replayed == want, "vec %d graph %d rank %d replayed %d", v, graph, r,
                              io.r[r].replayed);
            }
            free_io(&io, 4);
        }
    }
    {
        /* gemm fp8 is a cuda mode: the cpu stand-in of a cuda plan in that mode runs its own
           (the step and its single-rank counterpart both) */
        const int64_t counts[4] = {3, 0, 9, 1}, offs[4] = {0, 3, 3, 12};
        ranks_io io;
        setup_io(&io, &L, 4, counts, offs);
        dsv4_topology t = topo_of(4, 1, 4, 4, 512);
        t.backend = DSV4_BACKEND_CUDA;
        dsv4_config c8 = L.c;
        c8.gemm = DSV4_GEMM_FP8;
        dsv4_budget b = big_budget();
        dsv4_error e;
        dsv4_dist_options o;
        dsv4_dist_options_init(&o);
        o.compute_backend = DSV4_BACKEND_CPU;
        ck_assert_msg(dsv4_dist_forward(&c8, L.ck, &t, &b, &o, io.r, &e) == DSV4_OK, "%s", e.message);
        uint16_t *y2 = calloc((size_t)(9 * L.c.dim + 1), 2), *y0 = io.r[2].y;
        io.r[2].y = y2;
        ck_assert_msg(dsv4_dist_single_rank(&c8, L.ck, &t, &b, &o, io.r, &e) == DSV4_OK, "%s", e.message);
        ck_assert_int_eq(memcmp(y0, y2, (size_t)(9 * L.c.dim) * 2), 0);
        io.r[2].y = y0;
        free(y2);
        free_io(&io, 4);
    }
    free_layer(&L);
}
END_TEST


/* ---------------- the device path (rows on a device) on a host-memory stand-in device ---------------- */

static _Atomic long fake_live, fake_total; /* the stand-in device's live allocations, all of them */

static void *fake_alloc(void *impl, size_t bytes)
{
    (void)impl;
    void *p = malloc(bytes);
    if (p) {
        fake_live++;
        fake_total++;
    }
    return p;
}

static void fake_release(void *impl, void *p)
{
    (void)impl;
    if (p)
        fake_live--;
    free(p);
}

static dsv4_status fake_copy(void *impl, void *dst, const void *src, size_t bytes, dsv4_error *err)
{
    (void)impl, (void)err;
    if (bytes)
        memcpy(dst, src, bytes);
    return DSV4_OK;
}

static dsv4_status fake_gather(void *impl, int64_t n, int64_t H, const uint16_t *src, const int32_t *idx,
                               uint16_t *dst, dsv4_error *err)
{
    (void)impl, (void)err;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * H, src + (int64_t)idx[i] * H, (size_t)H * 2);
    return DSV4_OK;
}

static dsv4_status fake_round(void *impl, int64_t n, int64_t H, const float *src, const int32_t *idx, uint16_t *dst,
                              dsv4_error *err)
{
    (void)impl, (void)err;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < H; j++)
            dst[(idx ? idx[i] : i) * H + j] = dsv4_f32_to_bf16(src[i * H + j]);
    return DSV4_OK;
}

static dsv4_status fake_world(const dsv4_comm_groups *g, int timeout_ms, void **w, dsv4_error *err)
{
    dsv4_sim_options o;
    dsv4_sim_options_init(&o);
    o.timeout_ms = timeout_ms;
    return dsv4_sim_world_create(g, &o, (dsv4_sim_world **)w, err);
}

static dsv4_comm *fake_comm(void *w, int rank) { return dsv4_sim_world_comm(w, rank); }
static void fake_world_free(void *w) { dsv4_sim_world_free(w); }

static const dsv4_backend_device fake_device = {fake_alloc, fake_release, fake_copy,      fake_gather,
                                                fake_round, fake_world,   fake_comm, fake_world_free};

/* The driver's device path (the rows as device buffers, cuda's) with host memory standing in for
   the device, on the cpu stages: ep 2/4/8 and tp 2 bit-identical to the host path, the same
   collective traces, every device buffer released, the device buffers counted in the peak. */
START_TEST(device_path_matches_host_path)
{
    layer L = make_layer("mini", 1, "devpath");
    layer B = make_layer("mini-bf16", 1, "devpath_bf16");
    int64_t H = L.c.dim;
    const int64_t counts[8] = {37, 0, 5, 130, 1, 0, 64, 9};
    for (int ep = 1; ep <= 8; ep *= 2) {
        layer *X = ep == 1 ? &B : &L; /* ep 1: tp 2 on bf16 weights (128-row blocks do not split) */
        int world = ep == 1 ? 2 : ep;
        int64_t offs[8], cts[8];
        for (int r = 0, o = 0; r < world; r++) {
            cts[r] = ep == 1 ? 40 : counts[r];
            offs[r] = ep == 1 ? 0 : o;
            o += (int)cts[r];
        }
        ranks_io a, d;
        setup_io(&a, X, world, cts, offs);
        setup_io(&d, X, world, cts, offs);
        dsv4_topology t = ep == 1 ? topo_of(2, 2, 1, 1, 256) : topo_of(ep, 1, ep, ep, 256);
        t.backend = DSV4_BACKEND_CPU;
        t.chunk_tokens = 128;
        dsv4_budget b = big_budget();
        dsv4_error e;
        ck_assert_msg(dsv4_dist_forward(&X->c, X->ck, &t, &b, NULL, a.r, &e) == DSV4_OK, "ep %d: %s", ep, e.message);
        long before = fake_total;
        ck_assert_msg(dsv4_dist_forward_on(&X->c, X->ck, &t, &b, NULL, &fake_device, d.r, &e) == DSV4_OK,
                      "ep %d device path: %s", ep, e.message);
        ck_assert_int_eq(fake_live, 0);
        ck_assert_int_gt(fake_total, before); /* the rows went through the stand-in device */
        for (int r = 0; r < world; r++) {
            ck_assert_msg(memcmp(a.y[r], d.y[r], (size_t)(cts[r] * H) * 2) == 0, "ep %d rank %d: y differs", ep, r);
            ck_assert_int_eq(memcmp(a.ids[r], d.ids[r], (size_t)(cts[r] * X->c.n_activated) * 4), 0);
            ck_assert_msg(same_sequence(&a.r[r], &d.r[r]), "ep %d rank %d: the device path's collectives differ", ep, r);
            ck_assert_int_eq(a.r[r].chunks, d.r[r].chunks);
            if (cts[r] > 0) /* the chunk's rows on the device at least */
                ck_assert_uint_gt(d.r[r].workspace_peak, (uint64_t)(cts[r] * H * 2));
        }
        free_io(&a, world);
        free_io(&d, world);
    }
    free_layer(&L);
    free_layer(&B);
}
END_TEST

#ifdef DSV4_FAULTS
/* The fault build (test control, core/testctl.h; run by make test-faults through its tcase "faults"):
   rank 1 skips the step's metadata collective; the sim communicator reports it, fast, naming rank 1. */
START_TEST(asymmetric_schedule_is_reported_not_hung)
{
    layer L = make_layer("mini", 1, "fault");
    const int64_t counts[4] = {4, 4, 4, 4}, offs[4] = {0, 4, 8, 12};
    for (int ep = 1; ep <= 4; ep *= 4) {
        ranks_io io;
        setup_io(&io, &L, 4, counts, offs);
        dsv4_topology t = topo_of(4, 1, 4, ep, 64);
        t.backend = DSV4_BACKEND_CUDA;
        t.sm = 90;
        t.role = DSV4_ROLE_DECODE;
        t.cuda_graph = true;
        t.n_buckets = 1;
        t.buckets[0] = 8;
        for (int r = 0; r < 4; r++)
            io.r[r].can_replay = true;
        dsv4_dist_options o;
        dsv4_dist_options_init(&o);
        o.timeout_ms = 200;
        o.compute_backend = DSV4_BACKEND_CPU;
        dsv4_budget b = big_budget();
        dsv4_error e;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)DSV4_HOOK_SKIP_METADATA_COLLECTIVE,
                                           (uint64_t)1 << 1),
                         0);
        dsv4_status st = dsv4_dist_forward(&L.c, L.ck, &t, &b, &o, io.r, &e);
        dsv4_test_control(DSV4_TESTCTRL_RESET);
        ck_assert_int_eq(st, DSV4_ERR_COMM);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        ck_assert_msg(dt < 3.0, "took %.2f s", dt);
        /* Some rank's report names rank 1, the one that skipped the step's collective. */
        int named = 0;
        for (int r = 0; r < 4; r++)
            named |= io.r[r].status == DSV4_ERR_COMM && strstr(io.r[r].error.message, "rank 1") != NULL;
        ck_assert_msg(named, "no report names rank 1: %s", e.message);
        free_io(&io, 4);
    }
    free_layer(&L);
}
END_TEST
#endif

START_TEST(refusals_and_bad_inputs_before_any_thread)
{
    layer L = make_layer("mini", 1, "refuse");
    const int64_t counts[2] = {3, 300}, offs[2] = {0, 3};
    ranks_io io;
    setup_io(&io, &L, 2, counts, offs);
    dsv4_topology t = topo_of(2, 1, 2, 2, 256);
    dsv4_budget b = big_budget();
    dsv4_error e;
    ck_assert_int_eq(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io.r, &e), DSV4_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.message, "max_tokens_per_rank"));
    io.r[1].tokens = 3;
    t.dispatch = DSV4_DISPATCH_LOW_LATENCY;
    t.role = DSV4_ROLE_PREFILL;
    ck_assert_int_eq(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io.r, &e), DSV4_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.message, "role"));
    /* A bad token id on one rank is that rank's error, found before any collective waits on it. */
    layer H0 = make_layer("mini", 0, "badid");
    const int64_t c2[2] = {4, 4}, o2[2] = {0, 4};
    ranks_io io2;
    setup_io(&io2, &H0, 2, c2, o2);
    int32_t bad[4] = {1, 2, 99999, 3};
    io2.r[1].input_ids = bad;
    dsv4_topology th = topo_of(2, 1, 2, 2, 256);
    struct timespec a0, a1;
    clock_gettime(CLOCK_MONOTONIC, &a0);
    ck_assert_int_eq(dsv4_dist_forward(&H0.c, H0.ck, &th, &b, NULL, io2.r, &e), DSV4_ERR_RANGE);
    clock_gettime(CLOCK_MONOTONIC, &a1);
    ck_assert_ptr_nonnull(strstr(e.message, "rank 1"));
    ck_assert_ptr_nonnull(strstr(e.message, "input_ids[2]"));
    ck_assert(a1.tv_sec - a0.tv_sec < 2);
    free_io(&io2, 2);
    free_layer(&H0);
    /* tp ranks must hold the same tokens */
    dsv4_topology tt = topo_of(2, 2, 1, 1, 256);
    ck_assert_int_eq(dsv4_dist_forward(&L.c, L.ck, &tt, &b, NULL, io.r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "tp group"));
    free_io(&io, 2);
    free_layer(&L);
}
END_TEST

/* The stages refuse work that is not the rank's: other experts, another inter range, unsorted
   groups, weights where none belong, tokens outside the chunk. */
START_TEST(stages_check_their_arguments)
{
    layer L = make_layer("mini", 1, "stages");
    int64_t H = L.c.dim, E = L.c.n_routed_experts;
    dsv4_error e;
    dsv4_budget b = big_budget();
    for (int kind = 0; kind < 2; kind++) {
        dsv4_topology t = topo_of(2, 1, 2, 2, 64);
        t.rank = 1; /* experts [E/2, E) */
        t.backend = kind ? DSV4_BACKEND_CPU : DSV4_BACKEND_REF;
        dsv4_plan *p;
        dsv4_backend *be;
        ck_assert_msg(dsv4_plan_create(&L.c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
        ck_assert_msg(dsv4_backend_create(p, L.ck, 1, &be, &e) == DSV4_OK, "%s", e.message);
        const dsv4_backend_stages *st = dsv4_backend_get_stages(be);
        ck_assert_ptr_nonnull(st);
        void *impl = be->impl;
        int32_t ex[3] = {(int32_t)(E / 2), (int32_t)(E / 2), (int32_t)(E - 1)}, sh[3] = {-1, -1, -1};
        float w[3] = {0.5f, 0.25f, 0.125f}, *out = calloc((size_t)(3 * H), sizeof *out);
        uint16_t *x = calloc((size_t)(3 * H), 2), *y = calloc((size_t)(3 * H), 2);
        memcpy(x, L.x, (size_t)(3 * H) * 2);
        int64_t I = L.c.moe_inter_dim;
        ck_assert_msg(st->experts(impl, 3, x, ex, w, 0, I, out, &e) == DSV4_OK, "%s", e.message);
        ck_assert(out[0] != 0.0f || out[1] != 0.0f);
        ck_assert_int_eq(st->experts(impl, 0, x, ex, w, 0, I, out, &e), DSV4_OK);
        ck_assert_int_eq(st->experts(impl, 3, x, sh, w, 0, I, out, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(st->experts(impl, 3, x, sh, NULL, 0, I, out, &e) == DSV4_OK, "%s", e.message);
        if (kind) { /* the cpu backend holds only its shard */
            int32_t other[3] = {0, 1, 2}, unsorted[3] = {(int32_t)(E - 1), (int32_t)(E / 2), (int32_t)(E / 2)};
            ck_assert_int_eq(st->experts(impl, 3, x, other, w, 0, I, out, &e), DSV4_ERR_INVALID_ARG);
            ck_assert_ptr_nonnull(strstr(e.message, "expert 0"));
            ck_assert_int_eq(st->experts(impl, 3, x, unsorted, w, 0, I, out, &e), DSV4_ERR_INVALID_ARG);
            ck_assert_int_eq(st->experts(impl, 3, x, ex, NULL, 0, I, out, &e), DSV4_ERR_INVALID_ARG);
            ck_assert_int_eq(st->experts(impl, 3, x, ex, w, 128, I, out, &e), DSV4_ERR_INVALID_ARG);
            ck_assert_ptr_nonnull(strstr(e.message, "inter rows"));
            int32_t ids[24];
            float rw[24];
            ck_assert_int_eq(st->route(impl, 65, x, NULL, ids, rw, NULL, &e), DSV4_ERR_INVALID_ARG);
        }
        int32_t tok[3] = {0, 1, 5};
        uint16_t o[3 * 256] = {0};
        ck_assert_int_eq(st->combine(impl, 3, 3, tok, w, o, NULL, y, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(e.message, "token 5"));
        tok[2] = 2;
        ck_assert_msg(st->combine(impl, 3, 3, tok, w, o, x, y, &e) == DSV4_OK, "%s", e.message);
        ck_assert_int_eq(memcmp(x, y, (size_t)(3 * H) * 2), 0); /* zero outputs plus the shared rows */
        /* a rank of a sharded plan: stages only */
        dsv4_forward_out fo = {.y = y};
        ck_assert_int_eq(dsv4_backend_forward(be, 1, x, L.ids, &fo, &e), DSV4_ERR_UNSUPPORTED);
        free(out);
        free(x);
        free(y);
        dsv4_backend_free(be);
        dsv4_plan_free(p);
    }
    /* the driver's own argument checks */
    dsv4_dist_options o;
    dsv4_dist_options_init(&o);
    ck_assert_int_eq(o.compute_backend, -1);
    o.compute_backend = 9;
    const int64_t counts[2] = {1, 1}, offs[2] = {0, 1};
    ranks_io io;
    setup_io(&io, &L, 2, counts, offs);
    dsv4_topology t = topo_of(2, 1, 2, 2, 64);
    ck_assert_int_eq(dsv4_dist_forward(&L.c, L.ck, &t, &b, &o, io.r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_dist_single_rank(NULL, L.ck, &t, &b, NULL, io.r, &e), DSV4_ERR_INVALID_ARG);
    t.backend = DSV4_BACKEND_CUDA; /* no stand-in: this build has no cuda (or no stages for it) */
    ck_assert_int_eq(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io.r, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.message, "cuda"));
    free_io(&io, 2);
    free_layer(&L);
}
END_TEST

Suite *dist_suite(void)
{
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("dist");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, ep_reproduces_single_rank_bit_for_bit, 0, (int)(sizeof ep_layers / sizeof ep_layers[0]));
    tcase_add_test(tc, single_rank_takes_the_ranks_params);
    tcase_add_test(tc, tp_shards_agree_with_reference);
    tcase_add_loop_test(tc, cpu_tp_within_tolerance, 0, N_TP_CASES);
    tcase_add_test(tc, stages_check_their_arguments);
    tcase_add_test(tc, per_rank_token_vectors_give_identical_sequences);
    tcase_add_test(tc, device_path_matches_host_path);
    tcase_add_test(tc, refusals_and_bad_inputs_before_any_thread);
    suite_add_tcase(s, tc);
#ifdef DSV4_FAULTS
    TCase *tf = tcase_create("faults");
    tcase_set_timeout(tf, 300);
    tcase_add_test(tf, asymmetric_schedule_is_reported_not_hung);
    suite_add_tcase(s, tf);
#endif
    return s;
}
