/* Verifying another engine: the shared comparison (every float dtype, NaN rules, tolerance rules,
   routing as sets), diff, export -> engine -> check with the defect table, the Python helper, and
   the collective traces of `dsv4moe symmetry`. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/comm.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/symmetry.h"
#include "tests/testutil.h"


Suite *engines_suite(void);

static char out_buf[1 << 17];

static int run_cli(const char *args)
{
    int rc = tu_run_cli(args, "engines_out.txt", out_buf, sizeof out_buf);
    ck_assert_msg(rc != -2, "DSV4MOE_CLI is not set (run through make test)");
    return rc;
}

/* tu_cli_gen_ref into dir (the reference output dir/ref.safetensors), the output in out_buf. */
static int gen_ref(const char *cfg, const char *gen, const char *dir)
{
    return tu_cli_gen_ref(cfg, gen, dir, "ref.safetensors", "engines_out.txt", out_buf, sizeof out_buf);
}

/* Runs a shell command with its output in out_buf; returns the exit status. */
static int run_sh(const char *cmd)
{
    char log[512], full[8192];
    tu_path(log, sizeof log, "engines_sh.txt");
    snprintf(full, sizeof full, "(%s) >%s 2>&1", cmd, log);
    int rc = system(full);
    if (tu_read_file(log, out_buf, sizeof out_buf) < 0)
        out_buf[0] = '\0';
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static const char *py(void)
{
    const char *p = getenv("DSV4MOE_PYTHON");
    return p && p[0] ? p : "python3";
}

static const char *src(void)
{
    const char *s = getenv("DSV4MOE_SRC");
    return s && s[0] ? s : ".";
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* ---------------- the comparison ---------------- */

START_TEST(compare_every_float_dtype)
{
    dsv4_compare_metrics m;
    float fa[4] = {1.0f, -2.0f, 0.5f, 3.0f}, fb[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    fa[3] = nextafterf(3.0f, 4.0f); /* one F32 ulp */
    ck_assert(dsv4_compare_any(DSV4_DTYPE_F32, fa, fb, 4, &m));
    ck_assert_uint_eq(m.ulp_max, 1);
    ck_assert_int_eq(m.ulp_nonzero, 1);
    ck_assert(m.finite_ok && m.max_abs > 0 && m.max_abs < 1e-6);
    /* F16: 1.0 = 0x3C00, next 0x3C01; -2 = 0xC000 */
    uint16_t ha[3] = {0x3C01, 0xC000, 0x0000}, hb[3] = {0x3C00, 0xC000, 0x8001};
    ck_assert(dsv4_compare_any(DSV4_DTYPE_F16, ha, hb, 3, &m));
    ck_assert_uint_eq(m.ulp_max, 1);
    ck_assert_int_eq(m.ulp_nonzero, 2);
    ck_assert(fabs(m.max_abs - 1.0 / 1024) < 1e-12);
    /* e4m3: 0x38 = 1.0, 0x39 = 1.125; 0x7F is NaN */
    uint8_t ea[2] = {0x39, 0x7F}, eb[2] = {0x38, 0x38};
    ck_assert(dsv4_compare_any(DSV4_DTYPE_F8_E4M3, ea, eb, 2, &m));
    ck_assert_int_eq(m.bad_nonfinite, 1);
    ck_assert(!m.finite_ok);
    ck_assert(fabs(m.max_abs - 0.125) < 1e-12);
    /* e5m2: 0x3C = 1.0, 0x3D = 1.25, 0x7C = +inf */
    uint8_t qa[2] = {0x3D, 0x7C}, qb[2] = {0x3C, 0x7C};
    ck_assert(dsv4_compare_any(DSV4_DTYPE_F8_E5M2, qa, qb, 2, &m));
    ck_assert(fabs(m.max_abs - 0.25) < 1e-12);
    ck_assert_int_eq(m.ref_nonfinite, 1);
    ck_assert_int_eq(m.ref_nonfinite_bad, 0); /* the same infinity repeats */
    ck_assert(m.finite_ok);
    double da[1] = {1.0}, db[1] = {1.0};
    ck_assert(dsv4_compare_any(DSV4_DTYPE_F64, da, db, 1, &m));
    ck_assert(m.max_abs == 0 && m.ulp_max == 0);
    ck_assert(!dsv4_compare_any(DSV4_DTYPE_I32, da, db, 1, &m));
    ck_assert(dsv4_float_value(DSV4_DTYPE_F8_E4M3, eb, 0) == 1.0);
    ck_assert(isnan(dsv4_float_value(DSV4_DTYPE_I8, eb, 0)));
}
END_TEST

START_TEST(nan_rules_fail_under_every_tolerance)
{
    /* bf16: a NaN in the reference where a is finite; a NaN pair; the same infinity; opposite infinities */
    const uint16_t one = 0x3F80, nan = 0x7FC0, pinf = 0x7F80, ninf = 0xFF80;
    const struct {
        uint16_t a, b;
        bool ok;
    } pairs[] = {{one, nan, false}, {nan, nan, false}, {pinf, pinf, true}, {ninf, pinf, false}, {nan, one, false},
                 {pinf, one, false}, {one, one, true}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        dsv4_compare_metrics m;
        ck_assert(dsv4_compare_bf16(&pairs[i].a, &pairs[i].b, 1, &m));
        for (int t = 0; t < DSV4_TOL_COUNT; t++) {
            char why[512];
            bool ok = dsv4_compare_within((dsv4_tolerance)t, &m, why, sizeof why);
            ck_assert_msg(ok == pairs[i].ok, "pair %zu rule %s: %d (%s)", i, dsv4_tolerance_name((dsv4_tolerance)t), ok,
                          why);
            if (!ok)
                ck_assert_ptr_nonnull(strstr(why, "non-finite"));
        }
    }
}
END_TEST

START_TEST(tolerance_rules_bounds)
{
    dsv4_compare_metrics m;
    memset(&m, 0, sizeof m);
    m.n = 1000;
    m.rms_ref = 1.0;
    m.finite_ok = true;
    char why[512];
    /* ulp p99 2 with a tiny diff: the bf16 rule of the own backends fails, the engine rule passes */
    m.deepgemm_diff = 5e-6;
    m.ulp_p99 = 2;
    ck_assert(!dsv4_compare_within(DSV4_TOL_EXACT_BF16, &m, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "ulp_p99 2"));
    ck_assert(dsv4_compare_within(DSV4_TOL_EXACT_QUANT, &m, why, sizeof why));
    /* 5 of 1000 beyond: exact-quant allows 5, 6 fail it; fp8-mma allows 20 */
    m.tol_violations = 5;
    ck_assert(dsv4_compare_within(DSV4_TOL_EXACT_QUANT, &m, why, sizeof why));
    m.tol_violations = 6;
    ck_assert(!dsv4_compare_within(DSV4_TOL_EXACT_QUANT, &m, why, sizeof why));
    ck_assert(dsv4_compare_within(DSV4_TOL_FP8_MMA, &m, why, sizeof why));
    m.tol_violations = 0;
    m.max_abs = 0.2; /* above 0.035 + 0.1 rms, below 0.035 + 0.2 rms */
    ck_assert(!dsv4_compare_within(DSV4_TOL_EXACT_QUANT, &m, why, sizeof why));
    ck_assert(dsv4_compare_within(DSV4_TOL_FP8_MMA, &m, why, sizeof why));
    m.max_abs = 0;
    m.deepgemm_diff = 2e-3;
    for (int t = 0; t < DSV4_TOL_COUNT; t++)
        ck_assert(!dsv4_compare_within((dsv4_tolerance)t, &m, why, sizeof why));
    dsv4_tolerance t;
    ck_assert(dsv4_tolerance_parse("fp8-mma", &t) && t == DSV4_TOL_FP8_MMA);
    ck_assert(!dsv4_tolerance_parse("loose", &t));
    ck_assert_str_eq(dsv4_tolerance_name(DSV4_TOL_EXACT_BF16), "exact-bf16");
}
END_TEST

START_TEST(routing_as_sets_with_sentinels)
{
    const int64_t T = 2, K = 3, E = 8;
    int64_t ref_ids[6] = {5, 1, 8, 2, 3, 4}; /* token 0: slot 2 pruned */
    double ref_w[6] = {0.75, 0.5, 0, 0.4, 0.35, 0.3};
    int64_t a_ids[6] = {1, 8, 5, 4, 2, 3};   /* the same sets, other slot order */
    double a_w[6] = {0.5 * (1 + 4e-6), 0, 0.75, 0.3, 0.4, 0.35};
    dsv4_routing_metrics m;
    char why[512];
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_E, K, ref_ids, ref_w, &m));
    ck_assert_msg(dsv4_routing_within(&m, why, sizeof why), "%s", why);
    ck_assert_int_eq(m.weights_n, 5);
    /* the -1 convention: E is then malformed, -1 fits */
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    ck_assert_int_eq(m.malformed, 1);
    a_ids[1] = -1;
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, &m));
    ck_assert_msg(dsv4_routing_within(&m, why, sizeof why), "%s", why);
    /* absent: two columns, the pruned slot left out, padding any id outside [0, E) */
    int64_t b_ids[4] = {5, 1, 4, 3};
    double b_w[4] = {0.75, 0.5, 0.3, 0.35};
    ck_assert(dsv4_compare_routing(T, E, 2, b_ids, b_w, DSV4_SENTINEL_ABSENT, K, ref_ids, ref_w, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why)); /* token 1 lacks expert 2 */
    ck_assert_int_eq(m.id_tokens_bad, 1);
    ck_assert_int_eq(m.first_bad_token, 1);
    ck_assert_ptr_nonnull(strstr(why, "{3,4}"));
    /* a weight beyond 1e-6 + 1e-5 |b| (matched by id, whatever the slot) */
    a_w[3] = 0.3 * (1 + 5e-5);
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "expert 4"));
    /* a router run in bf16 (an engine at bf16_ops): 1.4 % off passes at DSV4_ROUTING_WEIGHT_RTOL_BF16 and
       fails at the default; 4 % off (beyond 2^-5) fails at both; the rtol is named in the verdict */
    a_w[3] = 0.3 * (1 + 0.014);
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    ck_assert(dsv4_compare_routing_rtol(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w,
                                        DSV4_ROUTING_WEIGHT_RTOL_BF16, &m));
    ck_assert_msg(dsv4_routing_within(&m, why, sizeof why), "%s", why);
    ck_assert(m.weights_rtol == DSV4_ROUTING_WEIGHT_RTOL_BF16);
    a_w[3] = 0.3 * (1 + 0.04);
    ck_assert(dsv4_compare_routing_rtol(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w,
                                        DSV4_ROUTING_WEIGHT_RTOL_BF16, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "0.03125 |b|"));
    /* an rtol below the default, of 1 or more, or NaN is a bad argument */
    ck_assert(!dsv4_compare_routing_rtol(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, 1e-6, &m));
    ck_assert(!dsv4_compare_routing_rtol(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, 1.0, &m));
    ck_assert(!dsv4_compare_routing_rtol(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, NAN, &m));
    a_w[3] = 0.3;
    /* a pruned slot with a weight */
    a_w[1] = 0.1;
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_MINUS1, K, ref_ids, ref_w, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    /* ids only: a pruned slot computed as expert 0 */
    a_ids[1] = 0;
    ck_assert(dsv4_compare_routing(T, E, K, a_ids, NULL, DSV4_SENTINEL_E, K, ref_ids, NULL, &m));
    ck_assert(!dsv4_routing_within(&m, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "{0,1,5}"));
    ck_assert(!dsv4_compare_routing(T, E, K, a_ids, a_w, DSV4_SENTINEL_E, K, ref_ids, NULL, &m));
}
END_TEST

/* ---------------- diff ---------------- */

/* Writes y/topk_ids/topk_weights of the CPU backend on a generated layer into dir/cpu.safetensors. */
static void cpu_dump(const char *dir, const char *preset, int layer)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(preset, &c, NULL), DSV4_OK);
    c.layer = layer;
    char wpath[600], ipath[600], opath[600];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    snprintf(ipath, sizeof ipath, "%s/input.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/cpu.safetensors", dir);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    dsv4_error e;
    dsv4_error_clear(&e);
    ck_assert_msg(dsv4_checkpoint_open(wpath, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_st_open(ipath, &in, &e), DSV4_OK);
    const dsv4_tensor_info *tx = dsv4_st_find(in, "x"), *ti = dsv4_st_find(in, "input_ids");
    int64_t T = tx->shape[0], H = c.dim, K = c.n_activated;
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = DSV4_BACKEND_CPU;
    dsv4_budget budget;
    dsv4_budget_init(&budget);
    dsv4_plan *plan = NULL;
    dsv4_backend *be = NULL;
    ck_assert_msg(dsv4_plan_create(&c, &topo, &budget, &plan, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_backend_create(plan, ck, 2, &be, &e) == DSV4_OK, "%s", e.message);
    uint16_t *x = malloc((size_t)(T * H) * 2), *y = calloc((size_t)(T * H), 2);
    int32_t *ids = malloc((size_t)T * 4), *tk = calloc((size_t)(T * K), 4);
    float *w = calloc((size_t)(T * K), 4);
    memcpy(x, tx->data, (size_t)(T * H) * 2);
    memcpy(ids, ti->data, (size_t)T * 4);
    dsv4_forward_out fo = {.y = y, .topk_ids = tk, .topk_weights = w};
    ck_assert_msg(dsv4_backend_forward(be, T, x, ids, &fo, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer *wr = NULL;
    int64_t sy[2] = {T, H}, sk[2] = {T, K};
    ck_assert_int_eq(dsv4_st_writer_create(&wr, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(wr, "y", DSV4_DTYPE_BF16, 2, sy, y, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(wr, "topk_ids", DSV4_DTYPE_I32, 2, sk, tk, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(wr, "topk_weights", DSV4_DTYPE_F32, 2, sk, w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(wr, opath, NULL, NULL, &e), DSV4_OK);
    dsv4_st_writer_free(wr);
    free(x), free(y), free(ids), free(tk), free(w);
    dsv4_backend_free(be);
    dsv4_plan_free(plan);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

START_TEST(diff_cpu_backend_and_numpy_engine_against_ref)
{
    static const struct {
        const char *preset;
        int layer;
    } L[] = {{"mini", 1}, {"mini-bf16", 1}, {"mini-topp", 2}};
    int i = _i;
    char dir[512], args[4096];
    char name[64];
    snprintf(name, sizeof name, "eng_diff_%d", i);
    tu_path(dir, sizeof dir, name);
    char cfg[64];
    snprintf(cfg, sizeof cfg, "--preset %s --layer %d", L[i].preset, L[i].layer);
    ck_assert_msg(gen_ref(cfg, "--tokens 40 --seed 5", dir) == 0, "%.3000s", out_buf);
    cpu_dump(dir, L[i].preset, L[i].layer);
    snprintf(args, sizeof args, "diff %s/cpu.safetensors %s/ref.safetensors", dir, dir);
    ck_assert_msg(run_cli(args) == 0, "cpu vs ref: %.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "within tolerance"));
    ck_assert_ptr_nonnull(strstr(out_buf, "topk_ids+topk_weights    routing"));
    ck_assert_ptr_nonnull(strstr(out_buf, "id sets differ 0"));
    /* The own backends' bf16 rule is what run applies: the same verdict through diff --rule */
    snprintf(args, sizeof args, "diff %s/cpu.safetensors %s/ref.safetensors --rule %s", dir, dir,
             !strcmp(L[i].preset, "mini-bf16") ? "exact-bf16" : "exact-quant");
    ck_assert_msg(run_cli(args) == 0, "cpu vs ref (own rule): %.3000s", out_buf);
}
END_TEST

START_TEST(diff_nan_shapes_and_sentinels)
{
    char dir[512], args[4096], cmd[4096];
    tu_path(dir, sizeof dir, "eng_diff_bad");
    ck_assert_msg(gen_ref("--preset mini-topp --layer 2", "--tokens 24 --seed 3", dir) == 0, "%.3000s", out_buf);
    /* A candidate written by Python: NaN in the reference, NaN pairs, -1 sentinels, shuffled slots. */
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH=%s/python %s -c \"\n"
             "import numpy as np\n"
             "from dsv4moe import testing as t\n"
             "r = t.read_safetensors('%s/ref.safetensors')\n"
             "y, ids, w = r['y'][1].copy(), r['topk_ids'][1].copy(), r['topk_weights'][1].copy()\n"
             "E = 16\n"
             "t.write_safetensors('%s/perm.safetensors', {'y': ('BF16', y), 'topk_ids': ('I32', ids[:, ::-1]), "
             "'topk_weights': ('F32', w[:, ::-1])})\n"
             "t.write_safetensors('%s/m1.safetensors', {'y': ('BF16', y), 'topk_ids': ('I32', np.where(ids == E, -1, "
             "ids)), 'topk_weights': ('F32', w)})\n"
             "yn = y.copy(); yn[0, 0] = 0x7FC0\n"
             "t.write_safetensors('%s/refnan.safetensors', {'y': ('BF16', yn)}, {'n_routed_experts': E})\n"
             "t.write_safetensors('%s/nanpair.safetensors', {'y': ('BF16', yn)})\n"
             "t.write_safetensors('%s/short.safetensors', {'y': ('BF16', y[:-1])})\n"
             "assert (ids == E).any(), 'the case prunes nothing'\n"
             "\"",
             src(), py(), dir, dir, dir, dir, dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "diff %s/perm.safetensors %s/ref.safetensors", dir, dir);
    ck_assert_msg(run_cli(args) == 0, "slot order must not matter: %.3000s", out_buf);
    snprintf(args, sizeof args, "diff %s/m1.safetensors %s/ref.safetensors", dir, dir);
    ck_assert_msg(run_cli(args) == 1, "-1 read with the E convention must fail: %.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "nor the sentinel"));
    snprintf(args, sizeof args, "diff %s/m1.safetensors %s/ref.safetensors --sentinel -1", dir, dir);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    /* NaN in the reference where A is finite fails; so does a NaN pair */
    snprintf(args, sizeof args, "diff %s/ref.safetensors %s/refnan.safetensors --tensor y", dir, dir);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "non-finite"));
    snprintf(args, sizeof args, "diff %s/nanpair.safetensors %s/refnan.safetensors", dir, dir);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    /* shapes printed on a mismatch, exit 2 */
    snprintf(args, sizeof args, "diff %s/short.safetensors %s/ref.safetensors", dir, dir);
    ck_assert_msg(run_cli(args) == 2, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "[23, 256]"));
    ck_assert_ptr_nonnull(strstr(out_buf, "[24, 256]"));
    snprintf(args, sizeof args, "diff %s/perm.safetensors %s/ref.safetensors --rule loose", dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    snprintf(args, sizeof args, "diff %s/perm.safetensors %s/ref.safetensors --tensor nope", dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
}
END_TEST

/* ---------------- export -> engine -> check ---------------- */

static char cases_dir[512];

static void export_once(void)
{
    static bool done;
    if (done)
        return;
    char args[2048];
    tu_path(cases_dir, sizeof cases_dir, "eng_cases");
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s", src(), cases_dir);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "16 case folders"));
    done = true;
}

/* Runs the NumPy engine (with `opts`) into dir/NAME, then check; returns check's exit status. */
static int engine_then_check(const char *name, const char *opts, const char *check_opts)
{
    char out[600], rep[640], cmd[4096], args[4096];
    tu_path(out, sizeof out, name);
    snprintf(rep, sizeof rep, "%s-report", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s %s/tests/tools/numpy_engine.py %s %s %s", out, py(), src(), cases_dir,
             out, opts);
    ck_assert_msg(run_sh(cmd) == 0, "engine %s: %.3000s", opts, out_buf);
    snprintf(args, sizeof args, "check %s --outputs %s --report %s %s", cases_dir, out, rep, check_opts);
    return run_cli(args);
}

START_TEST(export_layout_and_case_json)
{
    export_once();
    char p[700], buf[8192];
    snprintf(p, sizeof p, "%s/engines.topp/case.json", cases_dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"format\": \"dsv4moe-engine-case\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"version\": 3"));
    ck_assert_ptr_nonnull(strstr(buf, "\"top_p\": 0.6"));
    ck_assert_ptr_nonnull(strstr(buf, "\"rule\": \"outside\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"terms_scale\": 0.00390625"));
    ck_assert_ptr_nonnull(strstr(buf, "\"weights_rtol_bf16_ops\": 0.03125"));
    ck_assert_ptr_nonnull(strstr(buf, "\"bf16_ops\": \"expected.bf16_ops.safetensors\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"fp32\": \"expected.fp32.safetensors\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"engine_key\": \"engine_rounding\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"pruned_slots\""));
    snprintf(p, sizeof p, "%s/engines.two-ranks.rank1/case.json", cases_dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"tokens\": 9"));
    ck_assert_ptr_nonnull(strstr(buf, "two-ranks rank 1"));
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s %s/tests/tools/st_check.py %s/engines.two-ranks.rank1/input.safetensors --expect x:BF16:9,256 "
             "--expect input_ids:I32:9 && for p in '' .bf16_ops .fp32; do %s %s/tests/tools/st_check.py "
             "%s/engines.topp/expected$p.safetensors --expect y:BF16:32,256 --expect topk_ids:I32:32,4 "
             "--expect topk_weights:F32:32,4 --expect y_terms:F32:32,256 || exit 1; done",
             py(), src(), cases_dir, py(), src(), cases_dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    /* the stacked layout: HF's key names with the model. prefix, bf16 */
    char d2[512], args[2048];
    tu_path(d2, sizeof d2, "eng_cases_stacked");
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s --layout stacked --filter quant=2,layer=0",
             src(), d2);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "inspect %s/engines.quant=2,layer=0/model.safetensors", d2);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "model.layers.0.mlp.experts.gate_up_proj"));
    ck_assert_ptr_nonnull(strstr(out_buf, "model.layers.0.mlp.gate.tid2eid"));
    /* --rounding: spec always, the others as listed */
    char d3[512];
    tu_path(d3, sizeof d3, "eng_cases_fp32");
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s --filter topp-bf16 --rounding fp32", src(),
             d3);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    snprintf(p, sizeof p, "%s/engines.topp-bf16/expected.fp32.safetensors", d3);
    ck_assert(tu_file_exists(p));
    snprintf(p, sizeof p, "%s/engines.topp-bf16/expected.bf16_ops.safetensors", d3);
    ck_assert(!tu_file_exists(p));
    snprintf(p, sizeof p, "%s/engines.topp-bf16/case.json", d3);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_null(strstr(buf, "\"bf16_ops\": "));
    ck_assert_ptr_nonnull(strstr(buf, "\"spec\": \"expected.safetensors\""));
    static const char *const bad_lists[] = {"fp16", "spec,", ",fp32", ""};
    for (size_t k = 0; k < sizeof bad_lists / sizeof bad_lists[0]; k++) {
        snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s --rounding '%s'", src(), d3,
                 bad_lists[k]);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, "option --rounding"), "%s: %.3000s", bad_lists[k], out_buf);
    }
    ck_assert_int_eq(run_cli("export --dir /tmp/x"), 2);
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s --layout folded", src(), d2);
    ck_assert_int_eq(run_cli(args), 2);
}
END_TEST

START_TEST(clean_engine_passes_check)
{
    export_once();
    int rc = engine_then_check("eng_out_clean", "", "");
    ck_assert_msg(rc == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "16 cases: 16 passed, 0 failed, 0 errors"));
    char p[700], buf[4096];
    tu_path(p, sizeof p, "eng_out_clean-report/junit.xml");
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "tests=\"16\" failures=\"0\" errors=\"0\""));
    tu_path(p, sizeof p, "eng_out_clean-report/report.json");
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"ran_on\": \"numpy-indep\""));
    tu_path(p, sizeof p, "eng_out_clean-report/report.html");
    ck_assert(tu_file_exists(p));
    /* an engine's freedom: slot order, the -1 convention (with --sentinel -1), float32 y, y only */
    ck_assert_msg(engine_then_check("eng_out_rev", "--slot-order reversed", "") == 0, "%.3000s", out_buf);
    ck_assert_msg(engine_then_check("eng_out_m1", "--sentinel -1", "--sentinel -1") == 0, "%.3000s", out_buf);
    ck_assert_msg(engine_then_check("eng_out_m1b", "--sentinel -1", "") == 1, "%.3000s", out_buf);
    ck_assert_msg(engine_then_check("eng_out_yonly", "--no-routing", "") == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "routing not given by the engine"));
    /* diff holds the independent NumPy engine's dumps against the reference's within tolerance on every tensor */
    const char *ids[] = {"engines.topp", "engines.quant=2,layer=0", "engines.quant=1,layer=1"};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        char o[600], args[4096];
        tu_path(o, sizeof o, "eng_out_clean");
        snprintf(args, sizeof args, "diff %s/%s/output.safetensors %s/%s/expected.safetensors", o, ids[k], cases_dir,
                 ids[k]);
        ck_assert_msg(run_cli(args) == 0, "%s: %.3000s", ids[k], out_buf);
        ck_assert_ptr_nonnull(strstr(out_buf, "3 tensors compared in 2 rows, topk_ids and topk_weights in one "
                                              "routing row (rule exact-quant): within tolerance"));
    }
    ck_assert_msg(engine_then_check("eng_out_yonly", "--no-routing", "") == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "routing not given by the engine"));
}
END_TEST

/* The defect table, in every rounding profile of SPEC.md section 10: each defect patched into an
   engine that rounds at that profile and sums its experts in bf16 fails check (the engine declaring
   its profile in engine_rounding) on the cases that can show it. The weight point is a defect on
   layers whose activation quantization has power-of-two (ue8m0) scales: under act_quant fp32 the
   scale follows h w, so in the fp32 profile the point changes y by rounding only (quant=1 there). */
static const struct {
    const char *defect;
    const char *must_fail[5]; /* case ids that must fail */
    int min_fail;
} DEFECTS[] = {
    {"routed_clamp_dropped", {"quant=0,layer=1", "quant=2,layer=0", "topp", NULL}, 9},
    {"shared_clamp_dropped", {"quant=0,layer=1", "quant=2,layer=1", "two-ranks rank 0", NULL}, 9},
    {"weight_point_swapped", {"quant=0,layer=0", "quant=0,layer=1", "topp:", "two-ranks rank 0", NULL}, 5},
    {"topp_slot_as_expert0", {"topp:", "topp-bf16", NULL}, 2},
    /* the field's reports (docs/engines.md names each one's source) */
    {"weights_not_normalized", {"quant=0,layer=0", "quant=1,layer=1", "two-ranks rank 1", NULL}, 10},
    {"bias_in_weights", {"quant=0,layer=1", "topp:", "two-ranks rank 0", NULL}, 7},
    {"route_scale_twice", {"quant=0,layer=0", "quant=2,layer=1", "topp-bf16", NULL}, 10},
    {"route_scale_on_shared", {"quant=1,layer=0", "quant=2,layer=1", "two-ranks rank 1", NULL}, 10},
    {"hash_without_ids", {"quant=0,layer=0", "quant=1,layer=0", "quant=2,layer=0", NULL}, 3},
    {"hash_uniform_weights", {"quant=0,layer=0", "quant=1,layer=0", "quant=2,layer=0", NULL}, 3},
    {"topp_renorm_switched", {"topp:", "topp-bf16", NULL}, 2},
    {"clamp_gate_both_sides", {"small-limit", NULL}, 1}, /* moves only silu's tail unless L is small */
    {"clamp_up_one_side", {"small-limit", "quant=0,layer=1", "two-ranks rank 1", NULL}, 12},
    {"tid2eid_through_bf16", {"hash-384", NULL}, 1}, /* ids above 256 only */
    {"ue8m0_byte_as_value", {"quant=0,layer=0", "hash-384", "two-ranks rank 1", NULL}, 7},
    {"ue8m0_bias_off_one_expert", {"quant=0,layer=1", "small-limit", "topp:", NULL}, 6},
    {"act_scale_per_token", {"quant=1,layer=0", "quant=1,layer=1", NULL}, 2}, /* fp32 activation scales */
    {"act_scale_per_tensor", {"quant=1,layer=0", "quant=1,layer=1", NULL}, 2},
    {"workspace_wrong_dim", {"quant=0,layer=0", "hash-384", "two-ranks rank 1", NULL}, 15}, /* the memory check */
    {"padding_leaks", {"padded", NULL}, 1}, /* a padding row's output on the last token's row */
    {"fp4_scales_misaligned_tp", {"tp2 rank 0", "tp2 rank 1", NULL}, 2}, /* tensor-parallel cases only */
};
#define N_DEFECTS (int)(sizeof DEFECTS / sizeof DEFECTS[0])

/* The sanitizer and coverage builds leave out the catalogue's table of the other two profiles
   (the same code as each_defect_fails_check's runs) and run the suites beside each other (.ci/run). */
static bool one_profile_build(void)
{
#ifdef __SANITIZE_ADDRESS__
    return true;
#endif
    const char *cov = getenv("DSV4MOE_TEST_COVERAGE");
    return cov && !strcmp(cov, "1");
}

START_TEST(each_defect_fails_check)
{
    /* the spec profile here in every build; the release build's catalogue_table runs every class in
       the other two (fp32, bf16_ops) */
    export_once();
    int i = _i % N_DEFECTS;
    const char *rnd = dsv4_rounding_name((dsv4_rounding)(_i / N_DEFECTS));
    char name[96], opts[160];
    snprintf(name, sizeof name, "eng_out_%s_%s", DEFECTS[i].defect, rnd);
    snprintf(opts, sizeof opts, "--defect %s --rounding %s --bf16-sums", DEFECTS[i].defect, rnd);
    int rc = engine_then_check(name, opts, "");
    ck_assert_msg(rc == 1, "%s %s: exit %d: %.3000s", DEFECTS[i].defect, rnd, rc, out_buf);
    int fails = count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0);
    ck_assert_msg(fails >= DEFECTS[i].min_fail, "%s %s: %d failing cases: %.3000s", DEFECTS[i].defect, rnd, fails,
                  out_buf);
    ck_assert_msg(count_of(out_buf, "from the output's engine_rounding") == 16, "%.3000s", out_buf);
    /* check names the class on every failing case (the reference computed each known-wrong way,
       compare/diagnose.c) */
    char likely[96];
    snprintf(likely, sizeof likely, "likely %s: ", DEFECTS[i].defect);
    ck_assert_msg(count_of(out_buf, likely) == fails, "%s %s: %d failing, %d named: %.3000s", DEFECTS[i].defect, rnd,
                  fails, count_of(out_buf, likely), out_buf);
    for (int k = 0; DEFECTS[i].must_fail[k]; k++) {
        char needle[128];
        snprintf(needle, sizeof needle, "FAIL  engines/%s", DEFECTS[i].must_fail[k]);
        const char *at = strstr(out_buf, needle), *eol = at ? strchr(at, '\n') : NULL, *named = at ? strstr(at, likely) : NULL;
        ck_assert_msg(at, "%s %s: case %s not failed: %.3000s", DEFECTS[i].defect, rnd, DEFECTS[i].must_fail[k],
                      out_buf);
        ck_assert_msg(named && (!eol || named < eol), "%s %s: case %s not named: %.3000s", DEFECTS[i].defect, rnd,
                      DEFECTS[i].must_fail[k], out_buf);
    }
    /* y alone catches the top-p defect too (the slot computed as expert 0 changes y) */
    if (!strcmp(DEFECTS[i].defect, "topp_slot_as_expert0") && _i < N_DEFECTS) {
        rc = engine_then_check("eng_out_topp_yonly", "--defect topp_slot_as_expert0 --no-routing", "");
        ck_assert_msg(rc == 1 && strstr(out_buf, "FAIL  engines/topp:"), "%.3000s", out_buf);
    }
    /* The Python helper gives the same verdicts */
    char out[600], cmd[4096];
    tu_path(out, sizeof out, name);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/python %s -m dsv4moe.testing %s --outputs %s", src(), py(), cases_dir,
             out);
    ck_assert_int_eq(run_sh(cmd), 1);
    int pyfails = count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0);
    ck_assert_msg(pyfails == fails, "python %d vs check %d failing: %.3000s", pyfails, fails, out_buf);
}
END_TEST

/* An engine at bf16_ops runs its router in bf16 too: its weights are held to 2^-5 |b|
   (DSV4_ROUTING_WEIGHT_RTOL_BF16), an engine at fp32 to 1e-5 |b|; CLI and Python helper agree. */
START_TEST(bf16_router_weights_at_bf16_ops)
{
    export_once();
    static const struct {
        const char *name, *opts, *want;
        int rc;
    } runs[] = {
        {"eng_out_wbf16", "--rounding bf16_ops --bf16-sums --weights-off 0.014", "16 passed", 0},
        {"eng_out_wfp32", "--rounding fp32 --bf16-sums --weights-off 0.014", "+ 1e-05 |b|; first", 1},
        {"eng_out_wbf16_far", "--rounding bf16_ops --bf16-sums --weights-off 0.04", "+ 0.03125 |b|; first", 1},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        ck_assert_msg(engine_then_check(runs[k].name, runs[k].opts, "") == runs[k].rc, "%s: %.3000s", runs[k].opts,
                      out_buf);
        ck_assert_msg(strstr(out_buf, runs[k].want), "%s: %.3000s", runs[k].opts, out_buf);
        char out[600], cmd[4096];
        tu_path(out, sizeof out, runs[k].name);
        snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/python %s -m dsv4moe.testing %s --outputs %s", src(), py(),
                 cases_dir, out);
        ck_assert_msg(run_sh(cmd) == runs[k].rc, "python on %s: %.3000s", runs[k].opts, out_buf);
        if (runs[k].rc)
            ck_assert_msg(strstr(out_buf, runs[k].want), "python on %s: %.3000s", runs[k].opts, out_buf);
    }
}
END_TEST

/* SPEC.md section 10: an engine at each rounding profile, summing its experts in bf16, passes every
   case against the reference at its own profile (named by engine_rounding or by --rounding); held
   to another profile's reference the same outputs fail on the quantized layers (so the profile is
   shown to matter) and still pass on the bf16 ones. */
START_TEST(each_profile_passes_its_own_reference)
{
    export_once();
    const char *rnd = dsv4_rounding_name((dsv4_rounding)_i), *other = _i ? "spec" : "fp32";
    char name[64], opts[128], copts[64];
    snprintf(name, sizeof name, "eng_out_clean_%s", rnd);
    snprintf(opts, sizeof opts, "--rounding %s --bf16-sums", rnd);
    ck_assert_msg(engine_then_check(name, opts, "") == 0, "%s: %.3000s", rnd, out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "16 cases: 16 passed, 0 failed, 0 errors"));
    char want[96];
    snprintf(want, sizeof want, "rounding %s from the output's engine_rounding", rnd);
    ck_assert_msg(count_of(out_buf, want) == 16, "%.3000s", out_buf);
    /* the bf16 sums put elements beyond atol + rtol |b| that the S term absorbs */
    ck_assert_msg(count_of(out_buf, "beyond 0 with S") == 16 && count_of(out_buf, "beyond 0 with S, 0 without") < 16,
                  "%.3000s", out_buf);
    char p[128], buf[1 << 16];
    snprintf(p, sizeof p, "%s-report/report.json", name);
    char rp[1400];
    tu_path(rp, sizeof rp, p);
    ck_assert(tu_read_file(rp, buf, sizeof buf) > 0);
    snprintf(want, sizeof want, "\"rounding\": \"%s\"", rnd);
    ck_assert_ptr_nonnull(strstr(buf, want));
    ck_assert_ptr_nonnull(strstr(buf, "\"beyond_terms\": 0"));
    /* undeclared: --rounding names the profile; held to another, the quantized layers fail */
    snprintf(name, sizeof name, "eng_out_undeclared_%s", rnd);
    snprintf(opts, sizeof opts, "--rounding %s --bf16-sums --no-declare", rnd);
    snprintf(copts, sizeof copts, "--rounding %s", rnd);
    ck_assert_msg(engine_then_check(name, opts, copts) == 0, "%s: %.3000s", rnd, out_buf);
    snprintf(copts, sizeof copts, "--rounding %s", other);
    ck_assert_msg(engine_then_check(name, opts, copts) == 1, "%s: %.3000s", rnd, out_buf);
    static const char *const quantized[] = {"quant=0,layer=0", "quant=0,layer=1", "quant=1,layer=0", "quant=1,layer=1",
                                            "topp:", "two-ranks rank 0"};
    for (size_t k = 0; k < sizeof quantized / sizeof quantized[0]; k++) {
        char needle[96];
        snprintf(needle, sizeof needle, "FAIL  engines/%s", quantized[k]);
        ck_assert_msg(strstr(out_buf, needle), "%s held to %s: %s passed: %.3000s", rnd, other, quantized[k],
                      out_buf);
    }
    ck_assert_msg(strstr(out_buf, "pass  engines/quant=2,layer=0") && strstr(out_buf, "pass  engines/topp-bf16"),
                  "%.3000s", out_buf);
    /* check names the cause: the output passes at the engine's own profile */
    char named[96];
    snprintf(named, sizeof named, "passes against the reference at rounding %s", rnd);
    int nfail = count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0);
    ck_assert_msg(count_of(out_buf, "likely rounding_profile: ") == nfail && count_of(out_buf, named) == nfail,
                  "%.3000s", out_buf);
    /* the Python helper gives the same verdicts on the same outputs */
    char out[600], cmd[4096];
    tu_path(out, sizeof out, name);
    int fails = count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/python %s -m dsv4moe.testing %s --outputs %s --rounding %s", src(), py(),
             cases_dir, out, other);
    ck_assert_int_eq(run_sh(cmd), 1);
    int pyfails = count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0);
    ck_assert_msg(pyfails == fails, "python %d vs check %d failing: %.3000s", pyfails, fails, out_buf);
    /* diff --rule outside on one dump: within against its own profile's expected outputs (their y_terms
       the S), outside against another's, and no S to be had is bad input */
    char args[4096], exp[700];
    const char *one = "engines.quant=0,layer=1";
    snprintf(exp, sizeof exp, "%s/%s/expected%s%s.safetensors", cases_dir, one, _i ? "." : "", _i ? rnd : "");
    snprintf(args, sizeof args, "diff %s/%s/output.safetensors %s --rule outside", out, one, exp);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "beyond_with_S 0"));
    snprintf(args, sizeof args, "diff %s/%s/output.safetensors %s/%s/expected%s%s.safetensors --rule outside --terms %s",
             out, one, cases_dir, one, _i ? "" : ".", _i ? "" : "fp32", exp);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    snprintf(args, sizeof args, "diff %s/%s/output.safetensors %s/%s/output.safetensors --rule outside", out, one, out,
             one);
    ck_assert_msg(run_cli(args) == 2, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "give --terms FILE"));
}
END_TEST

/* check --catalogue: the independent engine run clean and with each class of the catalogue
   (profiles fp32 and bf16_ops here; spec in each_defect_fails_check), each class caught and named on
   every failing case, the table written; and its bad uses. */
START_TEST(catalogue_table)
{
    export_once();
    char rep[600], args[4096], p[700], buf[16384], cmd[4096];
    tu_path(rep, sizeof rep, "eng_catalogue");
    snprintf(cmd, sizeof cmd, "rm -rf %s", rep);
    ck_assert_int_eq(run_sh(cmd), 0);
    /* the table of the two profiles each_defect_fails_check leaves out, in the release build (the
       sanitizer and coverage builds run the same code in each_defect_fails_check's profile) */
    if (!one_profile_build()) {
        snprintf(args, sizeof args,
                 "check %s --catalogue --rounding fp32,bf16_ops --report %s --engine '%s %s/tests/tools/numpy_engine.py {cases} "
                 "{outputs} --defect {class} --rounding {rounding} --bf16-sums'",
                 cases_dir, rep, py(), src());
        ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
        ck_assert_ptr_nonnull(strstr(out_buf, "| none (the engine as it is) |  | 16 of 16 pass |"));
        ck_assert_ptr_nonnull(strstr(out_buf, "every class caught and named in every profile"));
        size_t n = dsv4_check_class_count();
        ck_assert_uint_ge(n, 19);
        for (size_t i = 0; i < n; i++) {
            const dsv4_check_class *k = dsv4_check_class_at(i);
            char row[160];
            snprintf(row, sizeof row, "| %s | %s | caught ", k->name, k->source);
            const char *at = strstr(out_buf, row);
            ck_assert_msg(!k->computed || at, "%s: %.3000s", k->name, out_buf);
            ck_assert_msg(k->computed || !at, "%s is not injected: %.3000s", k->name, out_buf);
            if (!at)
                continue;
            unsigned caught, cases, named;
            ck_assert_int_eq(sscanf(at + strlen(row), "%u of %u, named %u", &caught, &cases, &named), 3);
            ck_assert_msg(caught >= 1 && caught == named && cases == 16, "%s: %.200s", k->name, at);
        }
        ck_assert_ptr_null(dsv4_check_class_at(n));
        snprintf(p, sizeof p, "%s/catalogue.md", rep);
        ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
        ck_assert_ptr_nonnull(strstr(buf, "| routed_clamp_dropped | vLLM 41935 | caught 15 of 16, named 15; first "));
    }
    /* bad uses: exit 2, nothing judged */
    static const struct {
        const char *opts, *want;
    } bad[] = {
        {"--catalogue", "--catalogue needs --engine CMD"},
        {"--catalogue --engine true --outputs x", "no --outputs"},
        {"--engine true --outputs x", "--engine is an option of --catalogue"},
        {"--catalogue --engine true --rounding spec,fp16", "'fp16' is not a rounding profile"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(args, sizeof args, "check %s --report %s %s", cases_dir, rep, bad[k].opts);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, bad[k].want), "%s: %.3000s", bad[k].opts, out_buf);
    }
    /* an engine that fails: the run is not made, its log named */
    snprintf(args, sizeof args, "check %s --catalogue --rounding fp32 --report %s --engine 'echo broken; exit 3'",
             cases_dir, rep);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "not run: the engine exited 3 (its output: "));
    ck_assert_ptr_nonnull(strstr(out_buf, "some run could not be made"));
    /* an engine that writes nothing passes no case; a catalogue folder not made by the command is kept */
    snprintf(args, sizeof args, "check %s --catalogue --rounding fp32 --report %s --engine true", cases_dir, rep);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "not judged: 16 of 16 cases in error (engines/"));
    snprintf(cmd, sizeof cmd, "mkdir -p %s-mine/catalogue && touch %s-mine/catalogue/keep", rep, rep);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "check %s --catalogue --report %s-mine --engine true", cases_dir, rep);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "was not made by check --catalogue"));
    snprintf(p, sizeof p, "%s-mine/catalogue/keep", rep);
    ck_assert(tu_file_exists(p));
    /* --no-diagnose: the verdict ends at the numbers */
    ck_assert_int_eq(engine_then_check("eng_out_nodiag", "--defect routed_clamp_dropped", "--no-diagnose"), 1);
    ck_assert_ptr_null(strstr(out_buf, "likely "));
    ck_assert_ptr_null(strstr(out_buf, "no known class"));
}
END_TEST

/* The memory verdict: the engine's peak_workspace_bytes held to case.json's bound times its factor,
   both numbers named; a malformed report or bound is bad input (check and the Python helper). */
START_TEST(memory_verdict)
{
    export_once();
    ck_assert_int_eq(engine_then_check("eng_out_mem", "", ""), 0);
    ck_assert_msg(count_of(out_buf, "memory: peak workspace ") == 16 && !strstr(out_buf, "x; over"), "%.3000s",
                  out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "the planner's for 32 tokens on this rank); within 2x"));
    ck_assert_int_eq(engine_then_check("eng_out_mem9", "--defect workspace_wrong_dim", ""), 1);
    ck_assert_msg(count_of(out_buf, "; over 2x; likely workspace_wrong_dim: the workspace sized on the wrong "
                                    "dimension (9x too large) (aiconfigurator 1055, FlashInfer 4916)") == 15,
                  "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "pass  engines/empty"));
    /* without the report no memory check is made */
    ck_assert_int_eq(engine_then_check("eng_out_mem0", "--defect workspace_wrong_dim --no-workspace", ""), 0);
    ck_assert_ptr_null(strstr(out_buf, "memory:"));
    /* a report that is not a byte count, a bound that is not one: exit 2, named */
    char out[600], cmd[8192], args[4096];
    tu_path(out, sizeof out, "eng_out_mem");
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH=%s/python %s -c \"\n"
             "from dsv4moe import testing as t\n"
             "p = '%s/engines.topp/output.safetensors'\n"
             "r = t.read_safetensors(p)\n"
             "meta = r.pop('__metadata__')[1]\n"
             "meta['peak_workspace_bytes'] = '12e6'\n"
             "t.write_safetensors(p, r, meta)\n\"",
             src(), py(), out);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "check %s --outputs %s --report %s-r2", cases_dir, out, out);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "metadata peak_workspace_bytes '12e6' is not a decimal byte count"));
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/python %s -m dsv4moe.testing %s --outputs %s", src(), py(), cases_dir, out);
    ck_assert_int_eq(run_sh(cmd), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "peak_workspace_bytes '12e6' is not a decimal byte count"));
}
END_TEST

/* A padded case (pad_to): the input inside a bucket with hostile padding, the bucket's output judged
   on the tokens' rows, y of the tokens' rows alone accepted too; the format's errors. */
START_TEST(padded_case)
{
    export_once();
    char p[700], buf[8192], cmd[8192], args[4096], out[600];
    snprintf(p, sizeof p, "%s/engines.padded/case.json", cases_dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"bucket\": 32"));
    ck_assert_ptr_nonnull(strstr(buf, "\"tokens\": 20"));
    snprintf(cmd, sizeof cmd,
             "%s %s/tests/tools/st_check.py %s/engines.padded/input.safetensors --expect x:BF16:20,256 "
             "--expect input_ids:I32:20 --expect x_padded:BF16:32,256 --expect input_ids_padded:I32:32",
             py(), src(), cases_dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    /* the NumPy engine writes the bucket's 32 rows (NaN in the padding's): passes; the tokens' rows alone too */
    ck_assert_int_eq(engine_then_check("eng_out_pad", "", ""), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "pass  engines/padded: "));
    tu_path(out, sizeof out, "eng_out_pad");
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH=%s/python %s -c \"\n"
             "from dsv4moe import testing as t\n"
             "p = '%s/engines.padded/output.safetensors'\n"
             "r = t.read_safetensors(p)\n"
             "meta = r.pop('__metadata__')[1]\n"
             "assert r['y'][1].shape[0] == 32\n"
             "t.write_safetensors(p, {k: (d, a[:20]) for k, (d, a) in r.items()}, meta)\n\"",
             src(), py(), out);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "check %s --outputs %s --report %s-r", cases_dir, out, out);
    ck_assert_msg(run_cli(args) == 0 && strstr(out_buf, "pass  engines/padded: "), "%.3000s", out_buf);
    /* the padding leaking: named */
    ck_assert_int_eq(engine_then_check("eng_out_padleak", "--defect padding_leaks", ""), 1);
    ck_assert_ptr_nonnull(strstr(out_buf, "likely padding_leaks: padded rows leaking into valid rows"));
    ck_assert_int_eq(count_of(out_buf, "\nFAIL ") + (strncmp(out_buf, "FAIL ", 5) == 0), 1);
    /* malformed: a bucket not above the tokens, padded in a version 2 folder */
    static const char *const sed[] = {"s/\"bucket\": 32/\"bucket\": 20/", "s/\"version\": 3/\"version\": 2/"};
    for (size_t k = 0; k < 2; k++) {
        char cd[640];
        tu_path(cd, sizeof cd, k ? "eng_cases_pad_v2" : "eng_cases_pad_small");
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && mkdir -p %s && cp -r %s/engines.padded %s/ && sed -i '%s' %s/engines.padded/case.json && "
                 "%s %s/tests/tools/seal_cases.py %s",
                 cd, cd, cases_dir, cd, sed[k], cd, py(), src(), cd);
        ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
        snprintf(args, sizeof args, "check %s --outputs %s", cd, out);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, "\"padded\" must be {\"bucket\": B, ...} with B above \"tokens\""), "%.3000s",
                      out_buf);
        snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/python %s -m dsv4moe.testing %s --outputs %s", src(), py(), cd, out);
        ck_assert_int_eq(run_sh(cmd), 2);
        ck_assert_msg(strstr(out_buf, "\"padded\" must be"), "%.3000s", out_buf);
    }
    /* the scenario key: a bucket must exceed every rank's tokens */
    char yml[600];
    tu_path(yml, sizeof yml, "pad_small.yaml");
    static const char text[] = "name: p\ndefaults: {preset: mini, layer: 1}\ncases:\n"
                               "  - {name: a, tokens: [16, 24], topology: {world: 2, dp: 2}, pad_to: 20}\n";
    ck_assert(tu_write_file(yml, text, strlen(text)) == 0);
    snprintf(args, sizeof args, "export %s --dir %s-x", yml, out);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "pad_to 20 must exceed the tokens of every rank (rank 1 has 24)"), "%.3000s",
                  out_buf);
}
END_TEST

START_TEST(check_bad_outputs_exit_2)
{
    export_once();
    ck_assert_int_eq(engine_then_check("eng_out_bad", "", ""), 0);
    char out[600], cmd[4096], args[4096];
    tu_path(out, sizeof out, "eng_out_bad");
    /* a case without an output is an error, not a skip */
    snprintf(cmd, sizeof cmd, "rm -rf %s/engines.topp", out);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "check %s --outputs %s --report %s-r", cases_dir, out, out);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "engines.topp/output.safetensors does not exist"));
    ck_assert_ptr_nonnull(strstr(out_buf, "15 passed, 0 failed, 1 errors"));
    /* a truncated output, and one whose y has another name (readable with --map) */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/engines.topp && head -c 100 %s/engines.empty/output.safetensors > "
             "%s/engines.topp/output.safetensors && PYTHONPATH=%s/python %s -c \"\n"
             "from dsv4moe import testing as t\n"
             "p = '%s/engines.quant=0,layer=0/output.safetensors'\n"
             "r = t.read_safetensors(p)\n"
             "t.write_safetensors(p, {'hidden_out': r['y']})\n\"",
             out, out, out, src(), py(), out);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "engines.topp/output.safetensors"));
    ck_assert_ptr_nonnull(strstr(out_buf, "has no tensor y (names: hidden_out)"));
    snprintf(args, sizeof args, "check %s --outputs %s --report %s-r --map hidden_out=y", cases_dir, out, out);
    ck_assert_int_eq(run_cli(args), 2); /* the truncated one still */
    ck_assert_ptr_nonnull(strstr(out_buf, "pass  engines/quant=0,layer=0"));
    snprintf(args, sizeof args, "check %s --outputs %s/nowhere", cases_dir, out);
    ck_assert_int_eq(run_cli(args), 2);
    snprintf(args, sizeof args, "check %s --outputs %s --map y", cases_dir, out);
    ck_assert_int_eq(run_cli(args), 2);
    snprintf(args, sizeof args, "check %s --outputs %s", out, out); /* no case folder there */
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "no case folder"));
    /* malformed case folders: a newer format version, a config value out of range, not JSON */
    static const struct {
        const char *sed, *msg;
    } broken[] = {{"s/\"version\": 3/\"version\": 7/", "\"version\" must be 2"},
                  {"s/\"version\": 3/\"version\": 1/", "exported before the rounding profiles"},
                  {"s|\"bf16_ops\": \"expected.bf16_ops.safetensors\"|\"bf16_ops\": \"../x\"|",
                   "files.expected_by_rounding.bf16_ops must be a file name in the case folder"},
                  {"s/\"fp32\": \"expected.fp32.safetensors\"/\"fp16\": \"expected.fp32.safetensors\"/",
                   "'fp16' is not a rounding profile"},
                  {"s/\"n_activated\": 4/\"n_activated\": 99/", "n_activated"},
                  {"s/\"factor\": 2.0/\"factor\": 0.5/", "\"memory\" must be {\"workspace_bound_bytes\""},
                  {"s/\"workspace_bound_bytes\": [0-9]*/\"workspace_bound_bytes\": -3/", "\"memory\" must be"},
                  {"s/{/[/", "case.json"}};
    for (size_t k = 0; k < sizeof broken / sizeof broken[0]; k++) {
        char cd[640];
        snprintf(cd, sizeof cd, "%s-cases-%zu", out, k);
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && mkdir -p %s && cp -r %s/engines.topp %s/ && sed -i '%s' %s/engines.topp/case.json && "
                 "%s %s/tests/tools/seal_cases.py %s",
                 cd, cd, cases_dir, cd, broken[k].sed, cd, py(), src(), cd);
        ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
        snprintf(args, sizeof args, "check %s --outputs %s", cd, out);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, broken[k].msg), "%zu: %.3000s", k, out_buf);
        ck_assert_ptr_nonnull(strstr(out_buf, "engines.topp/case.json"));
    }
    /* rounding profiles (SPEC.md section 10): an unknown --rounding; a profile file missing, its y_terms of
       the wrong shape or negative; an output naming no known profile; a profile the case lacks */
    snprintf(args, sizeof args, "check %s --outputs %s --rounding bf16", cases_dir, out);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "--rounding: 'bf16' is not a rounding profile (spec, bf16_ops, fp32)"));
    char cd[640], big[16384];
    snprintf(cd, sizeof cd, "%s-cases-prof", out);
    snprintf(big, sizeof big,
             "rm -rf %s && mkdir -p %s && cp -r %s/engines.quant=0,layer=0 %s/engines.quant=0,layer=1 "
             "%s/engines.quant=1,layer=0 %s/engines.quant=1,layer=1 %s/ && rm %s/engines.quant=0,layer=0/expected.fp32.safetensors && "
             "PYTHONPATH=%s/python %s -c \"\n"
             "import numpy as np\n"
             "from dsv4moe import testing as t\n"
             "for name, terms in (('quant=0,layer=1', np.zeros((32, 255), np.float32)),\n"
             "                    ('quant=1,layer=0', -np.ones((32, 256), np.float32))):\n"
             "    p = '%s/engines.' + name + '/expected.fp32.safetensors'\n"
             "    r = t.read_safetensors(p)\n"
             "    r.pop('__metadata__')\n"
             "    r['y_terms'] = ('F32', terms)\n"
             "    t.write_safetensors(p, r)\n"
             "for name in ('quant=0,layer=0', 'quant=0,layer=1', 'quant=1,layer=0', 'quant=1,layer=1'):\n"
             "    p = '%s/engines.' + name + '/output.safetensors'\n"
             "    r = t.read_safetensors(p)\n"
             "    r.pop('__metadata__', None)\n"
             "    t.write_safetensors(p, r, {'engine_rounding': 'fp16'} if name == 'quant=1,layer=1' else None)\n"
             "\"",
             cd, cd, cases_dir, cases_dir, cases_dir, cases_dir, cd, cd, src(), py(), cd, out);
    ck_assert_msg(run_sh(big) == 0, "%.3000s", out_buf);
    snprintf(big, sizeof big, "%s %s/tests/tools/seal_cases.py %s", py(), src(), cd);
    ck_assert_msg(run_sh(big) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "check %s --outputs %s --report %s-r --rounding fp32", cd, out, out);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "engines.quant=0,layer=0/expected.fp32.safetensors") &&
                      strstr(out_buf, "y_terms must be F32 [32, 256] (SPEC.md section 10.2); found F32 [32, 255]") &&
                      strstr(out_buf, "y_terms[0, 0] is -1 where y is finite") &&
                      strstr(out_buf, "metadata engine_rounding 'fp16' is not a rounding profile"),
                  "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "0 passed, 0 failed, 4 errors"));
    snprintf(big, sizeof big,
             "rm %s/engines.quant=0,layer=0/case.json && %s -c \"import json; p = '%s/engines.quant=0,layer=1/case.json'; "
             "d = json.load(open(p)); del d['files']['expected_by_rounding']['fp32']; json.dump(d, open(p, 'w'))\" && "
             "%s %s/tests/tools/seal_cases.py %s",
             cd, py(), cd, py(), src(), cd);
    ck_assert_msg(run_sh(big) == 0, "%.3000s", out_buf);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "the case was exported without rounding fp32 (it has: spec bf16_ops)"), "%.3000s",
                  out_buf);
}
END_TEST

/* The Python helper gives check's exit status on malformed outputs and case folders (one of the
   hostile-input classes of docs/reliability.md): every variant of tests/tools/hostile_outputs.py (a
   duplicate tensor name, a header without data_offsets, a header that is a list, length 0, truncated, overlapping
   or gapped data, an integer y, float ids, a metadata number, a negative or overflowing shape, a
   FIFO, a link to /dev/zero) and every malformed case.json below is exit 2 from both, in bounded
   time, without a traceback. */
START_TEST(check_and_helper_agree_on_hostile_input)
{
    export_once();
    char dir[600], cmd[8192];
    tu_path(dir, sizeof dir, "hostile_io");
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s/cases && cp -r %s/engines.topp %s/cases/ && %s %s/tests/tools/seal_cases.py "
             "%s/cases && %s %s/tests/tools/numpy_engine.py %s/cases %s/valid >/dev/null && %s "
             "%s/tests/tools/hostile_outputs.py %s/valid/engines.topp/output.safetensors engines.topp %s/bad",
             dir, dir, cases_dir, dir, py(), src(), dir, py(), src(), dir, dir, py(), src(), dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    char variants[1024];
    size_t vl = strlen(out_buf);
    ck_assert_uint_lt(vl, sizeof variants);
    memcpy(variants, out_buf, vl + 1);
    ck_assert_msg(count_of(variants, " ") >= 12, "%s", variants);
    int n = 0;
    for (char *v = strtok(variants, " \n"); v; v = strtok(NULL, " \n"), n++) {
        char args[2048];
        snprintf(args, sizeof args, "check %s/cases --outputs %s/bad/%s --report %s/r", dir, dir, v, dir);
        ck_assert_msg(run_cli(args) == 2, "check on %s: %.2000s", v, out_buf);
        snprintf(cmd, sizeof cmd, "cd %s && timeout 60 env PYTHONPATH=%s/python %s -m dsv4moe.testing %s/cases --outputs %s/bad/%s",
                 dir, src(), py(), dir, dir, v);
        int rc = run_sh(cmd);
        ck_assert_msg(rc == 2 && !strstr(out_buf, "Traceback"), "helper on %s: exit %d: %.2000s", v, rc, out_buf);
    }
    ck_assert_int_ge(n, 13);
    /* diff: a metadata n_routed_experts beyond --experts' range is bad input, not saturated */
    snprintf(cmd, sizeof cmd,
             "%s -c \"import sys; sys.path.insert(0, '%s/python'); from dsv4moe import testing as t; "
             "r = t.read_safetensors('%s/cases/engines.topp/expected.safetensors'); r.pop('__metadata__'); "
             "t.write_safetensors('%s/e-big.safetensors', r, {'n_routed_experts': '99999999999999999999'})\"",
             py(), src(), dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.2000s", out_buf);
    char dargs[2048];
    snprintf(dargs, sizeof dargs, "diff %s/valid/engines.topp/output.safetensors %s/e-big.safetensors", dir, dir);
    ck_assert_int_eq(run_cli(dargs), 2);
    ck_assert_msg(strstr(out_buf, "n_routed_experts '99999999999999999999' is not an integer in [1, 1048576]"), "%.2000s",
                  out_buf);
    /* malformed case.json: no config, a list, duplicate keys, a model path outside the folder, tokens < 0 */
    static const char *const sed[] = {"s/\"config\": {/\"konfig\": {/", "1s/^/[/; $s/$/]/",
                                      "s/\"tokens\": 32/\"tokens\": 32, \"tokens\": 32/",
                                      "s|\"model\": \"model.safetensors\"|\"model\": \"../x\"|",
                                      "s/\"tokens\": 32/\"tokens\": -32/"};
    for (size_t k = 0; k < sizeof sed / sizeof sed[0]; k++) {
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s/c2 && cp -r %s/cases %s/c2 && sed -i '%s' %s/c2/engines.topp/case.json && "
                 "! cmp -s %s/c2/engines.topp/case.json %s/cases/engines.topp/case.json && "
                 "%s %s/tests/tools/seal_cases.py %s/c2",
                 dir, dir, dir, sed[k], dir, dir, dir, py(), src(), dir);
        ck_assert_msg(run_sh(cmd) == 0, "%zu: %.2000s", k, out_buf);
        char args[2048];
        snprintf(args, sizeof args, "check %s/c2 --outputs %s/valid --report %s/r", dir, dir, dir);
        ck_assert_msg(run_cli(args) == 2, "check, case.json %zu: %.2000s", k, out_buf);
        snprintf(cmd, sizeof cmd, "cd %s && timeout 60 env PYTHONPATH=%s/python %s -m dsv4moe.testing %s/c2 --outputs %s/valid",
                 dir, src(), py(), dir, dir);
        int rc = run_sh(cmd);
        ck_assert_msg(rc == 2 && !strstr(out_buf, "Traceback"), "helper, case.json %zu: exit %d: %.2000s", k, rc,
                      out_buf);
    }
}
END_TEST

/* Export writes nothing outside its folder and leaves either a complete, sealed export or none that
   check takes: case ids are checked before anything is written (two names that sanitize to one id,
   an id too long for a folder name), a link in a case's place is refused and not followed, each
   case is renamed into place complete, and the manifest is written last; check (and the Python
   helper) refuse a folder without it, with a case added or missing, or a file altered. */
START_TEST(export_is_atomic_and_sealed)
{
    char dir[600], cmd[8192], args[4096], yaml[700];
    tu_path(dir, sizeof dir, "export_atomic");
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/elsewhere %s/d", dir, dir, dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    /* collisions and length, before anything is written */
    static const char *const bad[] = {
        "name: col\ndefaults: {preset: mini, layer: 1, tokens: [4]}\ncases:\n  - {name: a b}\n  - {name: a_b}\n",
        "name: col\ndefaults: {preset: mini, layer: 1, tokens: [4]}\naxes:\n"
        "  route_scale: [1.5000000000000000000000000000000000000000000000000000000000]\n"
        "  swiglu_limit: [10.000000000000000000000000000000000000000000000000000000000]\n"
        "  norm_eps: [0.0000000000000000000000000000000000000000000000000000000000000]\n"
        "  top_p: [1.0000000000000000000000000000000000000000000000000000000000000]\n"};
    static const char *const why[] = {"is also the id of case 'col/a b'", "a case folder's name is at most 200"};
    for (size_t k = 0; k < 2; k++) {
        snprintf(yaml, sizeof yaml, "%s/bad%zu.yaml", dir, k);
        ck_assert_int_eq(tu_write_file(yaml, bad[k], strlen(bad[k])), 0);
        snprintf(args, sizeof args, "export %s --dir %s/d", yaml, dir);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, why[k]), "%zu: %.2000s", k, out_buf);
        snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s/d)\"", dir);
        ck_assert_msg(run_sh(cmd) == 0, "%zu: something was written", k);
    }
    /* the same across the files of one call: refused before anything is written */
    static const char s1[] = "name: s\ndefaults: {preset: mini, layer: 1, tokens: [4]}\ncases:\n  - {name: a b}\n",
                      s2[] = "name: s\ndefaults: {preset: mini, layer: 1, tokens: [4]}\ncases:\n  - {name: a_b}\n";
    char y1[700], y2[700];
    snprintf(y1, sizeof y1, "%s/s1.yaml", dir);
    snprintf(y2, sizeof y2, "%s/s2.yaml", dir);
    ck_assert_int_eq(tu_write_file(y1, s1, strlen(s1)), 0);
    ck_assert_int_eq(tu_write_file(y2, s2, strlen(s2)), 0);
    snprintf(args, sizeof args, "export %s %s --dir %s/d", y1, y2, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "case 's/a_b' has the case id 's.a_b' of case 's/a b'"), "%.2000s", out_buf);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s/d)\"", dir);
    ck_assert_msg(run_sh(cmd) == 0, "two files: something was written");
    /* a link planted where a case goes: refused, nothing written through it */
    snprintf(cmd, sizeof cmd, "ln -s %s/elsewhere %s/d/engines.topp", dir, dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s/d", src(), dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "engines.topp: is a symbolic link: an export refuses to write through or over it"),
                  "%.2000s", out_buf);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s/elsewhere)\" && test -z \"$(ls -A %s/d | grep -v engines.topp)\"",
             dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "written through the link or beside it");
    /* an export stopped part-way (a file-size limit) leaves no manifest: check refuses the folder */
    snprintf(cmd, sizeof cmd, "rm -f %s/d/engines.topp && ulimit -f 4096 && %s export %s/scenarios/engines.yaml --dir %s/d "
             ">%s/x.txt 2>&1; echo $? > %s/rc.txt",
             dir, getenv("DSV4MOE_CLI"), src(), dir, dir, dir);
    run_sh(cmd);
    snprintf(cmd, sizeof cmd, "test \"$(cat %s/rc.txt)\" = 2 && test ! -e %s/d/manifest.json && "
             "test -z \"$(ls -A %s/d | grep '^\\.')\"", dir, dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "a stopped export: exit 2, no manifest, no staging folder left");
    snprintf(cmd, sizeof cmd, "test -d '%s/d/engines.quant=0,layer=0'", dir); /* it stopped part-way */
    ck_assert_msg(run_sh(cmd) == 0, "the limit stopped the export before its first case");
    snprintf(args, sizeof args, "check %s/d --outputs %s/d", dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "no manifest: not a complete export"), "%.2000s", out_buf);
    /* a complete export; then a case added, a case removed, a file altered: each refused */
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s/d", src(), dir);
    ck_assert_msg(run_cli(args) == 0, "%.2000s", out_buf);
    snprintf(cmd, sizeof cmd, "rm -rf %s/out && %s %s/tests/tools/numpy_engine.py %s/d %s/out >/dev/null", dir, py(), src(),
             dir, dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "check %s/d --outputs %s/out --report %s/r", dir, dir, dir);
    ck_assert_msg(run_cli(args) == 0, "%.2000s", out_buf);
    static const struct {
        const char *sh, *undo, *msg;
    } probes[] = {
        {"cp -r D/engines.topp D/engines.extra", "rm -rf D/engines.extra", "'engines.extra' is not in the manifest"},
        {"mv D/engines.empty D/.gone", "mv D/.gone D/engines.empty", "case 'engines.empty' of the manifest is missing"},
        {"cp D/engines.topp/expected.fp32.safetensors D/keep && printf x >> D/engines.topp/expected.fp32.safetensors",
         "mv D/keep D/engines.topp/expected.fp32.safetensors", "expected.fp32.safetensors: differs from the export's"},
    };
    for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
        char sh[1024], d[700];
        snprintf(d, sizeof d, "%s/d", dir);
        size_t o = 0;
        for (const char *p = probes[k].sh; *p && o + 700 < sizeof sh; p++)
            o += (size_t)snprintf(sh + o, sizeof sh - o, "%s", *p == 'D' && p[1] == '/' ? d : (char[]){*p, 0});
        ck_assert_int_eq(run_sh(sh), 0);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, probes[k].msg), "%zu: %.2000s", k, out_buf);
        snprintf(cmd, sizeof cmd, "cd %s && PYTHONPATH=%s/python %s -m dsv4moe.testing %s/d --outputs %s/out", dir, src(),
                 py(), dir, dir);
        ck_assert_msg(run_sh(cmd) == 2, "helper %zu: %.2000s", k, out_buf);
        o = 0;
        for (const char *p = probes[k].undo; *p && o + 700 < sizeof sh; p++)
            o += (size_t)snprintf(sh + o, sizeof sh - o, "%s", *p == 'D' && p[1] == '/' ? d : (char[]){*p, 0});
        ck_assert_int_eq(run_sh(sh), 0);
    }
    ck_assert_msg(run_cli(args) == 0, "%.2000s", out_buf);
    /* exporting again over a complete export replaces it case by case and seals it again */
    snprintf(args, sizeof args, "export %s/scenarios/engines.yaml --dir %s/d --filter topp", src(), dir);
    ck_assert_msg(run_cli(args) == 0, "%.2000s", out_buf);
    snprintf(args, sizeof args, "check %s/d --outputs %s/out --report %s/r", dir, dir, dir);
    ck_assert_msg(run_cli(args) == 0, "%.2000s", out_buf);
}
END_TEST

START_TEST(python_helper_unit_tests)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s/python && %s -m unittest discover -s tests -t . -p 'test_testing.py' 2>&1", src(),
             py());
    int rc = run_sh(cmd);
    ck_assert_msg(rc == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "OK"));
}
END_TEST

/* An engine's CI in two lines (docs/engines.md): `pip install ./python` into a clean virtual
   environment builds the library and the CLI with the Makefile (here: the release build, already
   made, so make has nothing to do) and installs both (the CLI on the venv's PATH, the library found
   by the package with no environment variable); `pytest --dsv4moe-cases D --dsv4moe-engine M:F`
   then runs one test per exported case, the verdict line as the failure message. The package's own
   tests run from the install too. Without the build's Debian packages the install fails with the
   apt-get line that fixes it. The venv sees Debian's numpy and pytest (--system-site-packages: no
   network). Release build only: the sanitizer and coverage builds would run the same make and pip
   on the same folders side by side. */
START_TEST(pip_install_then_pytest)
{
#ifdef __SANITIZE_ADDRESS__
    printf("pip + pytest: skipped in a sanitizer build (its library cannot load into the interpreter)\n");
    return;
#endif
    const char *cov = getenv("DSV4MOE_TEST_COVERAGE");
    if (cov && !strcmp(cov, "1")) {
        printf("pip + pytest: skipped in the coverage build (the release build runs it)\n");
        return;
    }
    const char *cli = getenv("DSV4MOE_CLI");
    ck_assert_ptr_nonnull(cli);
    char dir[600], cmd[16384];
    tu_path(dir, sizeof dir, "pipvenv");
    /* the install, the CLI and the library from it */
    snprintf(cmd, sizeof cmd,
             "unset DSV4MOE_BUILD DSV4MOE_LIB; rm -rf %s && %s -m venv --system-site-packages %s/venv && cd %s && "
             "%s/venv/bin/pip install --no-build-isolation --no-index %s/python 2>&1 && "
             "%s/venv/bin/dsv4moe export %s/scenarios/engines.yaml --dir %s/cases && "
             "%s/venv/bin/python -c 'from dsv4moe import _lib; print(\"library\", _lib.lib_path())'",
             dir, py(), dir, dir, dir, src(), dir, src(), dir, dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "Successfully installed dsv4moe-0.1.0"));
    ck_assert_ptr_nonnull(strstr(out_buf, "16 case folders"));
    char want[800];
    snprintf(want, sizeof want, "library %s/venv/lib/", dir);
    ck_assert_msg(strstr(out_buf, want) && strstr(out_buf, "/site-packages/dsv4moe/_native/libdsv4moe.so.0"),
                  "%.3000s", out_buf);
    /* the plugin: engine functions of tests/tools/pytest_engine.py */
    static const struct {
        const char *engine, *opts, *want;
        int rc;
    } runs[] = {
        {"clean", "", "16 passed", 0},
        {"bf16_ops", "", "16 passed", 0},                  /* its result names its profile */
        {"fp32", "", "16 passed", 0},                      /* the function's dsv4moe_rounding */
        {"y_only", "--dsv4moe-sentinel -1", "16 passed", 0},
        {"clean", "--dsv4moe-rounding fp32", "11 failed, 5 passed", 1},
        {"routed_clamp_dropped", "", "15 failed, 1 passed", 1},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s/w && cd %s/w && PYTHONPATH=%s/tests/tools %s/venv/bin/python -m pytest -p "
                 "no:cacheprovider --dsv4moe-cases %s/cases --dsv4moe-engine pytest_engine:%s %s 2>&1",
                 dir, dir, src(), dir, dir, runs[k].engine, runs[k].opts);
        int rc = run_sh(cmd);
        ck_assert_msg(rc == runs[k].rc && strstr(out_buf, runs[k].want), "%s %s: exit %d: %.3000s", runs[k].engine,
                      runs[k].opts, rc, out_buf);
    }
    /* the failure message is the verdict line */
    ck_assert_msg(strstr(out_buf, "FAIL engines.quant=0,layer=0 (rule outside, rounding spec): y beyond"), "%.3000s",
                  out_buf);
    snprintf(cmd, sizeof cmd,
             "cd %s && %s/venv/bin/python -m pytest -p no:cacheprovider --dsv4moe-cases %s/cases --dsv4moe-engine "
             "nosuch:fn 2>&1",
             dir, dir, dir);
    ck_assert_int_ne(run_sh(cmd), 0);
    ck_assert_msg(strstr(out_buf, "--dsv4moe-engine nosuch:fn: cannot import nosuch"), "%.3000s", out_buf);
    /* the package's tests from the install (no DSV4MOE_BUILD: the package finds its library) */
    snprintf(cmd, sizeof cmd,
             "unset DSV4MOE_BUILD DSV4MOE_LIB; mkdir -p %s/t && cp -r %s/python/tests %s/t/ && cd %s/t && "
             "DSV4MOE_CLI=%s %s/venv/bin/python -m "
             "unittest discover -v -s tests -t . -p 'test_[lh]*.py' 2>&1",
             dir, src(), dir, dir, cli, dir);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "test_cpu_bit_identical"));
    ck_assert_ptr_nonnull(strstr(out_buf, "test_held_checkpoint_matches_ref"));
    ck_assert_msg(strstr(out_buf, "skipped") == NULL, "%.3000s", out_buf);
    /* no build packages: one apt-get line (a compiler that sees no system header stands in) */
    snprintf(cmd, sizeof cmd,
             "%s -m venv --system-site-packages %s/venv2 && cd %s && CC='cc -nostdinc' %s/venv2/bin/pip install "
             "--no-build-isolation --no-index %s/python 2>&1",
             py(), dir, dir, dir, src());
    ck_assert_int_ne(run_sh(cmd), 0);
    ck_assert_msg(strstr(out_buf, "sudo apt-get install -y libjansson-dev libyaml-dev libopenblas-dev"), "%.3000s",
                  out_buf);
}
END_TEST

/* ---------------- collective traces ---------------- */

typedef struct {
    dsv4_sim_world *w;
    int rank;
    dsv4_coll_record rec[16];
    size_t n;
    char path[600];
} trace_rank;

static void *trace_thread(void *p)
{
    trace_rank *r = p;
    dsv4_comm *c = dsv4_sim_world_comm(r->w, r->rank);
    float buf[8] = {0};
    dsv4_error e;
    dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, buf, 8, "step 0 meta", &e);
    dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, buf, 2, buf + 4, "step 0 counts", &e);
    dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "step 0 end", &e);
    size_t n = 0;
    const dsv4_coll_record *t = dsv4_comm_trace(c, &n);
    r->n = n < 16 ? n : 16;
    memcpy(r->rec, t, r->n * sizeof *t);
    return NULL;
}

START_TEST(symmetry_jsonl_from_the_communicator)
{
    dsv4_comm_groups g;
    dsv4_error e;
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 2, 1, 2, 2, &e), DSV4_OK);
    dsv4_sim_world *w = NULL;
    ck_assert_int_eq(dsv4_sim_world_create(&g, NULL, &w, &e), DSV4_OK);
    trace_rank r[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        memset(&r[k], 0, sizeof r[k]);
        r[k].w = w;
        r[k].rank = k;
        ck_assert_int_eq(pthread_create(&th[k], NULL, trace_thread, &r[k]), 0);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    dsv4_sim_world_free(w);
    ck_assert_int_eq(r[0].n, 3);
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "trace_rank%d.jsonl", k);
        tu_path(r[k].path, sizeof r[k].path, name);
        ck_assert_int_eq(dsv4_trace_write_jsonl(r[k].rec, r[k].n, k, 2, r[k].path, &e), DSV4_OK);
    }
    char args[2048], buf[4096];
    ck_assert(tu_read_file(r[1].path, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":1,\"world\":2}\n"));
    ck_assert_ptr_nonnull(strstr(buf, "\"op\":\"all_gather\""));
    snprintf(args, sizeof args, "symmetry %s %s", r[1].path, r[0].path);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "2 ranks issued the same collectives: 3 compared"));
    /* divergent copies: another count on rank 1; a collective rank 1 never issued */
    char bad[600], cmd[2048];
    tu_path(bad, sizeof bad, "trace_bad_rank1.jsonl");
    snprintf(cmd, sizeof cmd, "sed 's/\"count\":8,/\"count\":9,/' %s > %s", r[1].path, bad);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "symmetry %s %s", r[0].path, bad);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 0 [world seq 0 all_reduce F32 count 8 'step 0 meta']"));
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 1 [world seq 0 all_reduce F32 count 9"));
    snprintf(cmd, sizeof cmd, "grep -v barrier %s > %s", r[1].path, bad);
    ck_assert_int_eq(run_sh(cmd), 0);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 1 [(none"));
    ck_assert_ptr_nonnull(strstr(out_buf, "barrier"));
    /* bad input */
    snprintf(cmd, sizeof cmd, "printf '{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":1}\\n{\"seq\":\"x\"}\\n' > %s",
             bad);
    ck_assert_int_eq(run_sh(cmd), 0);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "line 2"));
    snprintf(args, sizeof args, "symmetry %s %s", r[0].path, r[0].path);
    ck_assert_int_eq(run_cli(args), 2); /* the same rank twice */
    snprintf(args, sizeof args, "symmetry %s", r[0].path);
    ck_assert_int_eq(run_cli(args), 2);
}
END_TEST

START_TEST(run_writes_traces_symmetry_reads)
{
    char d[512], args[2048], cmd[2048];
    tu_path(d, sizeof d, "run_traces");
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "run %s/tests/smoke.yaml --report %s/rep --cache %s/cache --traces %s/t", src(), d, d, d);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "symmetry %s/t/smoke.topology=2/rank0.jsonl %s/t/smoke.topology=2/rank1.jsonl", d, d);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "2 JSONL traces: the same"));
    /* rank 1 skips its last collective */
    snprintf(cmd, sizeof cmd, "sed -i '$d' %s/t/smoke.topology=2/rank1.jsonl", d);
    ck_assert_int_eq(run_sh(cmd), 0);
    ck_assert_int_eq(run_cli(args), 1);
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 1 [(none"));
    /* world-1 cases write none */
    snprintf(cmd, sizeof cmd, "test ! -e %s/t/smoke.topology=0", d);
    ck_assert_int_eq(run_sh(cmd), 0);
}
END_TEST

START_TEST(symmetry_flight_recorder_dumps)
{
    /* tests/data/nccl_trace_rank_0.json: a world-of-one dump in the format of torch's
       _dump_nccl_trace_json (FlightRecorder dump_json); its copies play the other ranks. */
    char d[512], cmd[8192], args[4096];
    tu_path(d, sizeof d, "fr");
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && cp %s/tests/data/nccl_trace_rank_0.json %s/ && "
             "cp %s/tests/data/nccl_trace_rank_0.json %s/nccl_trace_rank_1.json && "
             "sed 's/\"collective_seq_id\":2,/\"collective_seq_id\":3,/' %s/tests/data/nccl_trace_rank_0.json > "
             "%s/seq_rank_2.json && "
             "sed 's/\\[\\[1024,4096\\]\\]/[[1024,2048]]/' %s/tests/data/nccl_trace_rank_0.json > %s/size_rank_3.json",
             d, d, src(), d, src(), d, src(), d, src(), d);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    snprintf(args, sizeof args, "symmetry %s/nccl_trace_rank_0.json %s/nccl_trace_rank_1.json", d, d);
    ck_assert_msg(run_cli(args) == 0, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "flight-recorder traces: the same"));
    dsv4_trace *t = NULL;
    dsv4_error e;
    char p[700];
    snprintf(p, sizeof p, "%s/nccl_trace_rank_0.json", d);
    ck_assert_int_eq(dsv4_trace_load(p, -1, &t, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_trace_rank(t), 0);
    ck_assert_int_eq(dsv4_trace_format_of(t), DSV4_TRACE_FLIGHT_RECORDER);
    ck_assert_int_eq(dsv4_trace_count(t), 4); /* the send/recv pair is left out */
    dsv4_trace_free(t);
    snprintf(args, sizeof args, "symmetry %s/nccl_trace_rank_0.json %s/seq_rank_2.json", d, d);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 0 [0 seq 2 nccl:all_gather"));
    ck_assert_ptr_nonnull(strstr(out_buf, "rank 2 [0 seq 3"));
    snprintf(args, sizeof args, "symmetry %s/nccl_trace_rank_0.json %s/size_rank_3.json", d, d);
    ck_assert_msg(run_cli(args) == 1, "%.3000s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "count 4194304"));
    ck_assert_ptr_nonnull(strstr(out_buf, "count 2097152"));
    /* a malformed dump names its entry */
    snprintf(cmd, sizeof cmd, "sed 's/\"profiling_name\"/\"profiling_nom\"/' %s/nccl_trace_rank_0.json > %s/bad_rank_4.json", d, d);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "symmetry %s/nccl_trace_rank_0.json %s/bad_rank_4.json", d, d);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "flight recorder entry 0"));
    /* a JSONL trace does not mix with a dump */
    snprintf(cmd, sizeof cmd, "printf '{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":5}\\n' > %s/r5.jsonl", d);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "symmetry %s/nccl_trace_rank_0.json %s/r5.jsonl", d, d);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "format"));
    /* hostile traces (docs/reliability.md): input_sizes with a non-integer dimension, or a product
       past 64 bits (both had counted as 0 and matched [[0]]); headers of different worlds, a rank past
       its world; /dev/zero and a FIFO named as a trace (refused, not read) */
    snprintf(cmd, sizeof cmd,
             "sed 's/\\[\\[1024,4096\\]\\]/[[\"x\",4096]]/' %s/tests/data/nccl_trace_rank_0.json > %s/str_rank_5.json && "
             "sed 's/\\[\\[1024,4096\\]\\]/[[4294967296,4294967296]]/' %s/tests/data/nccl_trace_rank_0.json > "
             "%s/wrap_rank_6.json && "
             "printf '{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":0,\"world\":2}\\n' > %s/w2.jsonl && "
             "printf '{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":1,\"world\":4}\\n' > %s/w4.jsonl && "
             "printf '{\"format\":\"dsv4moe-trace\",\"version\":1,\"rank\":2,\"world\":2}\\n' > %s/r2w2.jsonl && "
             "ln -sf /dev/zero %s/zero.jsonl && rm -f %s/fifo.jsonl && mkfifo %s/fifo.jsonl",
             src(), d, src(), d, d, d, d, d, d, d);
    ck_assert_msg(run_sh(cmd) == 0, "%.3000s", out_buf);
    static const struct {
        const char *a, *b, *msg;
    } hostile[] = {
        {"nccl_trace_rank_0.json", "str_rank_5.json", "input_sizes must be lists of integers >= 0"},
        {"nccl_trace_rank_0.json", "wrap_rank_6.json", "fit 64 bits"},
        {"w2.jsonl", "w4.jsonl", "says world 2"},
        {"w2.jsonl", "r2w2.jsonl", "0 <= rank < world"},
        {"w2.jsonl", "zero.jsonl", "must be a regular file"},
        {"w2.jsonl", "fifo.jsonl", "must be a regular file"},
    };
    for (size_t k = 0; k < sizeof hostile / sizeof hostile[0]; k++) {
        snprintf(args, sizeof args, "symmetry %s/%s %s/%s", d, hostile[k].a, d, hostile[k].b);
        ck_assert_msg(run_cli(args) == 2, "%zu: %.3000s", k, out_buf);
        ck_assert_msg(strstr(out_buf, hostile[k].msg), "%zu: %.3000s", k, out_buf);
    }
}
END_TEST


/* ---------------- the library's argument checks ---------------- */

START_TEST(api_rejects_bad_arguments)
{
    dsv4_error e;
    dsv4_error_clear(&e);
    char buf[256];
    /* export */
    dsv4_export_options eo;
    dsv4_export_options_init(&eo);
    dsv4_export_options_init(NULL);
    ck_assert_int_eq(dsv4_export_scenario(NULL, "/tmp", &eo, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    dsv4_scenario *scn = NULL;
    char path[700];
    snprintf(path, sizeof path, "%s/tests/smoke.yaml", src());
    ck_assert_int_eq(dsv4_scenario_load(path, &scn, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_export_scenario(scn, "", &eo, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    eo.struct_size = 3;
    ck_assert_int_eq(dsv4_export_scenario(scn, "/tmp/x", &eo, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "struct_size"));
    dsv4_export_options_init(&eo);
    eo.layout = (dsv4_layout)7;
    ck_assert_int_eq(dsv4_export_scenario(scn, "/tmp/x", &eo, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    dsv4_export_options_init(&eo);
    eo.threads = 0;
    ck_assert_int_eq(dsv4_export_scenario(scn, "/tmp/x", &eo, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    dsv4_export_options_init(&eo);
    ck_assert_int_eq(dsv4_export_scenario(scn, "/dev/null/x", &eo, NULL, NULL, &e), DSV4_ERR_IO);
    /* a filter and the refusal left out: smoke has 4 cases, one a refusal? count what is written */
    char d[512];
    tu_path(d, sizeof d, "eng_api_export");
    size_t w = 99, l = 99;
    eo.filter = "hash-layer";
    ck_assert_msg(dsv4_export_scenario(scn, d, &eo, &w, &l, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(w, 1);
    ck_assert_uint_eq(l, 0);
    dsv4_scenario_free(scn);
    dsv4_export_case_id(".hidden/a b", 3, buf, sizeof buf);
    ck_assert_str_eq(buf, "_hidden.a_b.rank3");
    dsv4_export_case_id("x/y", -1, buf, 3);
    ck_assert_str_eq(buf, "x.");
    dsv4_export_case_id(NULL, -1, buf, sizeof buf);
    ck_assert_str_eq(buf, "");
    dsv4_export_case_id("a", -1, NULL, 0);
    /* check */
    dsv4_check_options co;
    dsv4_check_options_init(&co);
    dsv4_check_options_init(NULL);
    dsv4_run_results *R = (dsv4_run_results *)1;
    ck_assert_int_eq(dsv4_check_engine(NULL, d, &co, &R, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_check_engine(d, d, &co, NULL, &e), DSV4_ERR_INVALID_ARG);
    co.struct_size = 1;
    ck_assert_int_eq(dsv4_check_engine(d, d, &co, &R, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_null(R);
    dsv4_check_options_init(&co);
    co.n_map = DSV4_CHECK_MAP_MAX + 1;
    ck_assert_int_eq(dsv4_check_engine(d, d, &co, &R, &e), DSV4_ERR_INVALID_ARG);
    co.n_map = 1;
    co.map_from[0] = "out";
    co.map_to[0] = "z";
    ck_assert_int_eq(dsv4_check_engine(d, d, &co, &R, &e), DSV4_ERR_INVALID_ARG);
    dsv4_check_options_init(&co);
    ck_assert_int_eq(dsv4_check_engine("/nonexistent-dir", d, &co, &R, &e), DSV4_ERR_IO);
    /* the exported case without outputs: results with one error case */
    char o[600];
    snprintf(o, sizeof o, "%s/outs", d);
    snprintf(path, sizeof path, "mkdir -p %s", o);
    ck_assert_int_eq(run_sh(path), 0);
    ck_assert_msg(dsv4_check_engine(d, o, NULL, &R, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_run_count(R), 1);
    ck_assert_int_eq(dsv4_case_status(dsv4_run_get(R, 0)), DSV4_RESULT_ERROR);
    dsv4_run_results_free(R);
    /* traces */
    dsv4_trace *t = NULL;
    ck_assert_int_eq(dsv4_trace_load(NULL, 0, &t, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_trace_load("/nonexistent.jsonl", 0, &t, &e), DSV4_ERR_IO);
    snprintf(path, sizeof path, "%s/empty.jsonl", d);
    ck_assert_int_eq(tu_write_file(path, "", 0), 0);
    ck_assert_int_eq(dsv4_trace_load(path, 0, &t, &e), DSV4_ERR_FORMAT);
    ck_assert_int_eq(tu_write_file(path, "\n\n", 2), 0);
    ck_assert_int_eq(dsv4_trace_load(path, 0, &t, &e), DSV4_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.message, "no header"));
    ck_assert_int_eq(tu_write_file(path, "[1]\n", 4), 0);
    ck_assert_int_eq(dsv4_trace_load(path, 0, &t, &e), DSV4_ERR_FORMAT);
    ck_assert_int_eq(tu_write_file(path, "{\"format\":\"x\"}\n", 15), 0);
    ck_assert_int_eq(dsv4_trace_load(path, 0, &t, &e), DSV4_ERR_FORMAT);
    const char *fr = "{\"entries\": 5}";
    snprintf(path, sizeof path, "%s/fr.json", d);
    ck_assert_int_eq(tu_write_file(path, fr, strlen(fr)), 0);
    ck_assert_int_eq(dsv4_trace_load(path, 0, &t, &e), DSV4_ERR_FORMAT);
    fr = "{\"pg_config\": {}, \"entries\": []}";
    ck_assert_int_eq(tu_write_file(path, fr, strlen(fr)), 0);
    ck_assert_int_eq(dsv4_trace_load(path, -1, &t, &e), DSV4_ERR_INVALID_ARG); /* no rank in the name */
    ck_assert_ptr_nonnull(strstr(e.message, "rank"));
    ck_assert_int_eq(dsv4_trace_load(path, 2, &t, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_trace_rank(t), 2);
    ck_assert_uint_eq(dsv4_trace_count(t), 0);
    dsv4_symmetry_result sr;
    const dsv4_trace *one[1] = {t};
    ck_assert_int_eq(dsv4_trace_symmetry(one, 1, &sr, &e), DSV4_ERR_INVALID_ARG);
    const dsv4_trace *two[2] = {t, NULL};
    ck_assert_int_eq(dsv4_trace_symmetry(two, 2, &sr, &e), DSV4_ERR_INVALID_ARG);
    dsv4_trace_free(t);
    dsv4_trace_free(NULL);
    ck_assert_int_eq(dsv4_trace_rank(NULL), -1);
    ck_assert_uint_eq(dsv4_trace_count(NULL), 0);
    ck_assert_int_eq(dsv4_trace_write_jsonl(NULL, 1, 0, 1, path, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_trace_write_jsonl(NULL, 0, 2, 2, path, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_trace_write_jsonl(NULL, 0, 0, 1, "/dev/null/x", &e), DSV4_ERR_IO);
    /* comparison helpers */
    dsv4_routing_metrics rm;
    int64_t ids[2] = {0, 1};
    ck_assert(!dsv4_compare_routing(1, 4, 2, ids, NULL, DSV4_SENTINEL_E, 2, ids, NULL, NULL));
    ck_assert(!dsv4_compare_routing(-1, 4, 2, ids, NULL, DSV4_SENTINEL_E, 2, ids, NULL, &rm));
    ck_assert(!dsv4_compare_routing(1, 4, 0, ids, NULL, DSV4_SENTINEL_E, 2, ids, NULL, &rm));
    ck_assert(dsv4_compare_routing(0, 4, 0, NULL, NULL, DSV4_SENTINEL_E, 0, NULL, NULL, &rm));
    ck_assert(dsv4_routing_within(&rm, NULL, 0));
    ck_assert(!dsv4_routing_within(NULL, buf, sizeof buf));
    dsv4_routing_format(&rm, buf, sizeof buf);
    ck_assert_ptr_nonnull(strstr(buf, "weights not compared"));
    dsv4_routing_format(NULL, buf, sizeof buf);
    ck_assert_str_eq(buf, "");
    dsv4_routing_format(&rm, NULL, 0);
    dsv4_sentinel sn;
    ck_assert(dsv4_sentinel_parse("e", &sn) && sn == DSV4_SENTINEL_E);
    ck_assert(dsv4_sentinel_parse("-1", &sn) && sn == DSV4_SENTINEL_MINUS1);
    ck_assert(dsv4_sentinel_parse("absent", &sn) && sn == DSV4_SENTINEL_ABSENT);
    ck_assert(!dsv4_sentinel_parse("none", &sn) && !dsv4_sentinel_parse(NULL, &sn));
    ck_assert_str_eq(dsv4_sentinel_name(DSV4_SENTINEL_ABSENT), "absent");
    ck_assert_str_eq(dsv4_sentinel_name((dsv4_sentinel)9), "?");
    ck_assert_str_eq(dsv4_tolerance_name((dsv4_tolerance)9), "?");
    ck_assert_str_eq(dsv4_tolerance_describe((dsv4_tolerance)9), "?");
    ck_assert(!dsv4_tolerance_parse(NULL, NULL));
    ck_assert(!dsv4_compare_within(DSV4_TOL_EXACT_QUANT, NULL, buf, sizeof buf));
    dsv4_compare_metrics m;
    memset(&m, 0, sizeof m);
    ck_assert(!dsv4_compare_within((dsv4_tolerance)9, &m, NULL, 0));
    ck_assert(dsv4_compare_within(DSV4_TOL_EXACT_BF16, &m, NULL, 0)); /* nothing compared */
    ck_assert(!dsv4_compare_any(DSV4_DTYPE_F32, NULL, NULL, 0, NULL));
    /* routing tensors that do not fit together name both shapes */
    dsv4_tensor_info ta, tb;
    memset(&ta, 0, sizeof ta);
    memset(&tb, 0, sizeof tb);
    int32_t d32[4] = {0, 1, 1, 2};
    ta.name = "topk_ids";
    ta.dtype = DSV4_DTYPE_I32;
    ta.ndim = 2;
    ta.shape[0] = 2;
    ta.shape[1] = 2;
    ta.numel = 4;
    ta.data = d32;
    tb = ta;
    tb.shape[0] = 1;
    tb.shape[1] = 4;
    char msg[768];
    ck_assert(!dsv4_compare_routing_tensors(4, &ta, NULL, DSV4_SENTINEL_E, &tb, NULL, &rm, msg, sizeof msg));
    ck_assert_ptr_nonnull(strstr(msg, "[2, 2]"));
    ck_assert_ptr_nonnull(strstr(msg, "[1, 4]"));
    ck_assert(!dsv4_compare_routing_tensors(4, NULL, NULL, DSV4_SENTINEL_E, &tb, NULL, &rm, NULL, 0));
    ck_assert(dsv4_compare_routing_tensors(4, &ta, NULL, DSV4_SENTINEL_E, &ta, NULL, &rm, msg, sizeof msg));
    ck_assert(dsv4_routing_within(&rm, NULL, 0));
    dsv4_tensor_shape_str(&ta, NULL, 0);
}
END_TEST

Suite *engines_suite(void)
{
    Suite *s = suite_create("engines");
    TCase *tc = tcase_create("engines");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, compare_every_float_dtype);
    tcase_add_test(tc, nan_rules_fail_under_every_tolerance);
    tcase_add_test(tc, tolerance_rules_bounds);
    tcase_add_test(tc, routing_as_sets_with_sentinels);
    tcase_add_loop_test(tc, diff_cpu_backend_and_numpy_engine_against_ref, 0, 3);
    tcase_add_test(tc, diff_nan_shapes_and_sentinels);
    tcase_add_test(tc, export_layout_and_case_json);
    tcase_add_test(tc, clean_engine_passes_check);
    tcase_add_loop_test(tc, each_defect_fails_check, 0, N_DEFECTS);
    tcase_add_loop_test(tc, each_profile_passes_its_own_reference, 0, DSV4_ROUNDING_COUNT);
    tcase_add_test(tc, bf16_router_weights_at_bf16_ops);
    tcase_add_test(tc, catalogue_table);
    tcase_add_test(tc, memory_verdict);
    tcase_add_test(tc, padded_case);
    tcase_add_test(tc, check_bad_outputs_exit_2);
    tcase_add_test(tc, python_helper_unit_tests);
    tcase_add_test(tc, check_and_helper_agree_on_hostile_input);
    tcase_add_test(tc, export_is_atomic_and_sealed);
    tcase_add_test(tc, pip_install_then_pytest);
    tcase_add_test(tc, symmetry_jsonl_from_the_communicator);
    tcase_add_test(tc, run_writes_traces_symmetry_reads);
    tcase_add_test(tc, symmetry_flight_recorder_dumps);
    tcase_add_test(tc, api_rejects_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}
