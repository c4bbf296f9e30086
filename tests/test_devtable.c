/* ci/device-table.py, the table that ci/device-check.sh prints last: run on hand-written bench JSONs,
 * its results.json and its text checked (which mode leads, best configuration per T, ratios to each
 * peer, ceiling shares, the targets, peers that did not run); device-check's other helpers,
 * ci/ncu-stall-regions.py and ci/scen-isolate.py, on hand-written inputs. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"

Suite *devtable_suite(void);

static char out_buf[1 << 16];

static void put(const char *dir, const char *name, const char *text)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_msg(tu_write_file(p, text, strlen(text)) == 0, "cannot write %s", p);
}

/* A fresh folder `name` in the scratch folder, with bench/ and out/ below it; its path into dir. */
static void fresh(char *dir, size_t n, const char *name)
{
    char cmd[1200];
    tu_path(dir, n, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/bench' '%s/out'", dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Runs device-table.py on dir/bench (steps dir/steps.tsv), output into out_buf; returns results.json. */
static json_t *table(const char *dir)
{
    const char *py = getenv("DSV4MOE_PYTHON"), *src = getenv("DSV4MOE_SRC");
    char cmd[4096], log[700], res[700];
    snprintf(log, sizeof log, "%s/table.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s/ci/device-table.py --steps %s/steps.tsv --bench %s/bench --out %s/out --seconds 7 >%s 2>&1",
             py && py[0] ? py : "python3", src && src[0] ? src : ".", dir, dir, dir, log);
    int rc = system(cmd);
    ck_assert_msg(tu_read_file(log, out_buf, sizeof out_buf) >= 0, "no output from %s", cmd);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s\n%s", cmd, out_buf);
    snprintf(res, sizeof res, "%s/out/results.json", dir);
    json_error_t je;
    json_t *r = json_load_file(res, 0, &je);
    ck_assert_msg(r != NULL, "%s: %s", res, je.text);
    return r;
}

static json_t *row_of(json_t *res, int tokens)
{
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(res, "table"), i, row)
    {
        if (json_integer_value(json_object_get(row, "tokens")) == tokens)
            return row;
    }
    ck_abort_msg("no table row for T = %d", tokens);
    return NULL;
}

static double get_num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    ck_assert_msg(json_is_number(v), "%s is not a number", k);
    return json_number_value(v);
}

static const char *CEIL = "{\"copy_gbs\": 4000, \"fp8_gemm_tflops\": 1000, \"fp8_gemm_kind\": \"block-scaled\"}";

START_TEST(two_modes_and_three_peers)
{
    char d[600];
    fresh(d, sizeof d, "devtable_modes");
    put(d, "steps.tsv", "build\tpass\t40\t\nhf-peer\tpass\t61\t\n");
    put(d, "bench/ceilings.json", CEIL);
    /* exact: T = 1 twice (the faster configuration counts), a failed row that must not count */
    put(d, "bench/bench_cuda_exact.json",
        "{\"available\": true, \"runs\": [{\"graph\": false, \"io\": \"host\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.2},"
        "{\"graph\": true, \"io\": \"device\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.1, \"share_of_copy\": 0.1},"
        "{\"graph\": true, \"io\": \"device\", \"tokens\": 1, \"ok\": false, \"median_ms\": -1},"
        "{\"graph\": true, \"error\": \"no plan\"},"
        "{\"graph\": false, \"io\": \"device\", \"tokens\": 16384, \"ok\": true, \"median_ms\": 20}]}");
    put(d, "bench/bench_cuda_fp8.json",
        "{\"available\": true, \"runs\": ["
        "{\"graph\": true, \"io\": \"device\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.04, \"share_of_copy\": 0.3},"
        "{\"graph\": true, \"io\": \"stream\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.035, \"share_of_copy\": 0.35},"
        "{\"graph\": false, \"io\": \"device\", \"tokens\": 4096, \"ok\": true, \"median_ms\": 2.0},"
        "{\"graph\": false, \"io\": \"device\", \"tokens\": 16384, \"ok\": true, \"median_ms\": 5.0,"
        " \"share_of_copy\": 0.02, \"share_of_fp8_gemm\": 0.6}]}");
    put(d, "bench/torch_peer.json",
        "{\"shared_path\": \"bf16\", \"runs\": [{\"tokens\": 1, \"peer_ms\": 0.3}, {\"tokens\": 16384, \"peer_ms\": 40}]}");
    put(d, "bench/hf_peer.json",
        "{\"available\": true, \"transformers\": \"5.17.0\", \"graph\": \"ok\", \"runs\": ["
        "{\"tokens\": 1, \"ms\": 0.2, \"mode\": \"graph\"}, {\"tokens\": 4096, \"ms\": 3.0, \"mode\": \"graph\"},"
        "{\"tokens\": 16384, \"ms\": 12.0, \"mode\": \"eager\"}]}");
    put(d, "bench/gmm_peer.json",
        "{\"available\": true, \"groups\": \"as routed\", \"runs\": [{\"tokens\": 16384, \"gemm_ms\": 4.0, \"tflops\": 800}]}");
    json_t *r = table(d);

    /* the fp8 mode leads; each mode keeps its own best time per T (at T = 1 the fp8 mode's io
       stream row: bench_cuda's event-timed enqueues, named in the row and the text's cfg) */
    ck_assert_double_eq_tol(get_num(json_object_get(r, "cuda_best_ms"), "1"), 0.035, 1e-12);
    ck_assert_str_eq(json_string_value(json_object_get(row_of(r, 1), "fp8_io")), "stream");
    ck_assert_msg(strstr(out_buf, "on stream"), "%s", out_buf);
    json_t *ex = json_object_get(json_object_get(json_object_get(r, "cuda_modes"), "exact"), "best_ms");
    ck_assert_double_eq_tol(get_num(ex, "1"), 0.1, 1e-12);
    ck_assert_double_eq_tol(get_num(ex, "16384"), 20.0, 1e-12);

    json_t *big = row_of(r, 16384);
    ck_assert_double_eq_tol(get_num(big, "x_hf"), 12.0 / 5.0, 1e-12);
    ck_assert_double_eq_tol(get_num(big, "x_torch"), 40.0 / 5.0, 1e-12);
    ck_assert_double_eq_tol(get_num(big, "x_gmm"), 4.0 / 5.0, 1e-12);
    ck_assert_double_eq_tol(get_num(big, "gmm_share_of_fp8"), 0.8, 1e-12);
    ck_assert_double_eq_tol(get_num(big, "fp8_share_of_fp8"), 0.6, 1e-12);
    ck_assert_str_eq(json_string_value(json_object_get(big, "hf_mode")), "eager");
    /* the targets of bench/targets.json that cover each T, on the fp8 mode */
    ck_assert_str_eq(json_string_value(json_object_get(big, "targets")),
                     "prefill_fp8_rate MISS prefill_vs_gemm_only MISS prefill_vs_hf MISS"); /* 0.6, 0.8x, 2.4x */
    ck_assert_str_eq(json_string_value(json_object_get(row_of(r, 4096), "targets")),
                     "prefill_vs_gemm_only n/a prefill_vs_hf MISS"); /* no GEMM-only time there; 1.5x HF */
    ck_assert_str_eq(json_string_value(json_object_get(row_of(r, 1), "targets")), "decode_latency ok decode_vs_peers ok");

    json_t *tg = json_object_get(r, "targets_met");
    ck_assert_str_eq(json_string_value(json_object_get(tg, "mode")), "fp8");
    ck_assert(json_is_true(json_object_get(tg, "decode_latency"))); /* 35 us, the stream row */
    ck_assert(json_is_null(json_object_get(tg, "decode_bandwidth"))); /* no T in [8, 256] */
    ck_assert(json_is_true(json_object_get(tg, "decode_vs_peers")));
    ck_assert(json_is_false(json_object_get(tg, "prefill_fp8_rate")));
    ck_assert(json_is_false(json_object_get(tg, "prefill_vs_gemm_only")));
    ck_assert(json_is_false(json_object_get(tg, "prefill_vs_hf")));
    ck_assert_msg(strstr(json_string_value(json_object_get(r, "targets_file")), "targets.json"), "targets_file");

    /* the text: both modes' columns, the HF mode letter, the verdicts */
    ck_assert_msg(strstr(out_buf, "exact ms") && strstr(out_buf, "fp8 ms"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "12.0000e"), "%s", out_buf);
    char line[128];
    snprintf(line, sizeof line, "  %-22s %-8s T = 4096 and 16384 at 2.5x HF's block", "prefill_vs_hf", "NOT met");
    ck_assert_msg(strstr(out_buf, line), "%s", out_buf);
    snprintf(line, sizeof line, "  %-22s %-8s T 8 to 256", "decode_bandwidth", "not run");
    ck_assert_msg(strstr(out_buf, line), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "hf-peer"), "%s", out_buf);
    json_decref(r);
}
END_TEST

START_TEST(modes_from_rows_and_peers_that_did_not_run)
{
    char d[600];
    fresh(d, sizeof d, "devtable_rows");
    put(d, "steps.tsv", "");
    put(d, "bench/ceilings.json", CEIL);
    /* one bench_cuda.json whose rows name their mode; the slower HF peer makes the torch/HF target fail */
    put(d, "bench/bench_cuda.json",
        "{\"available\": true, \"runs\": [{\"gemm\": \"exact\", \"tokens\": 128, \"ok\": true, \"median_ms\": 1.0,"
        " \"share_of_copy\": 0.5}, {\"gemm\": \"fp8\", \"tokens\": 128, \"ok\": true, \"median_ms\": 0.5, \"share_of_copy\": 0.8}]}");
    put(d, "bench/torch_peer.json", "{\"runs\": [{\"tokens\": 128, \"peer_ms\": 0.4}]}");
    put(d, "bench/hf_peer.json", "{\"available\": false, \"reason\": \"transformers has no DeepseekV4 MoE block here\"}");
    json_t *r = table(d);
    json_t *row = row_of(r, 128);
    ck_assert_double_eq_tol(get_num(row, "exact_ms"), 1.0, 1e-12);
    ck_assert_double_eq_tol(get_num(row, "fp8_ms"), 0.5, 1e-12);
    ck_assert_double_eq_tol(get_num(row, "x_torch"), 0.8, 1e-12);
    ck_assert(json_is_null(json_object_get(row, "x_hf")));
    ck_assert_str_eq(json_string_value(json_object_get(row, "targets")), "decode_bandwidth ok decode_vs_peers MISS");
    json_t *tg = json_object_get(r, "targets_met");
    ck_assert(json_is_true(json_object_get(tg, "decode_bandwidth"))); /* 0.8 of copy: the bound itself */
    ck_assert(json_is_false(json_object_get(tg, "decode_vs_peers"))); /* the torch peer is faster */
    ck_assert(json_is_false(json_object_get(json_object_get(r, "hf_peer"), "available")));
    ck_assert_msg(strstr(out_buf, "HF peer: not timed (transformers has no DeepseekV4 MoE block here)"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "scaled_grouped_mm peer: not timed (did not run)"), "%s", out_buf);
    json_decref(r);
}
END_TEST

START_TEST(nothing_measured)
{
    char d[600];
    fresh(d, sizeof d, "devtable_empty");
    put(d, "steps.tsv", "build\tfail\t3\texit 2: make\n");
    put(d, "bench/bench_cuda.json", "{\"available\": false, \"reason\": \"no CUDA backend in this build\", \"runs\": []}");
    json_t *r = table(d);
    ck_assert(json_is_false(json_object_get(r, "cuda_available")));
    ck_assert_int_eq((int)json_array_size(json_object_get(r, "table")), 0);
    ck_assert_msg(strstr(out_buf, "not timed (no CUDA backend in this build)"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "nothing timed"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "exit 2: make"), "%s", out_buf);
    json_decref(r);
}
END_TEST

/* Runs ci/ncu-stall-regions.py on dir/name (extra arguments args), output into out_buf; its exit status. */
/* Runs `python ci/SCRIPT ARGS` with its output into out_buf (through dir/ci.txt); its exit status. */
static int ci_script(const char *dir, const char *script, const char *args)
{
    const char *py = getenv("DSV4MOE_PYTHON"), *src = getenv("DSV4MOE_SRC");
    char cmd[4096], log[700];
    snprintf(log, sizeof log, "%s/ci.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s/ci/%s %s >%s 2>&1", py && py[0] ? py : "python3", src && src[0] ? src : ".",
             script, args, log);
    int rc = system(cmd);
    ck_assert_msg(tu_read_file(log, out_buf, sizeof out_buf) >= 0, "no output from %s", cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int stall_regions(const char *dir, const char *name, const char *args)
{
    char a[1400];
    snprintf(a, sizeof a, "%s/%s %s", dir, name, args);
    return ci_script(dir, "ncu-stall-regions.py", a);
}

/* ci/ncu-stall-regions.py on a hand-written source page, as a device-check step log holds it: the
   regions between barriers with their shares, instructions and lines, the fetch share; a log
   without a source page exits 2 naming the file. */
/* bench_cuda --timeline's rows, in any bench JSON of the folder: each recorded step listed after
   the targets (span, busy share, each kernel's time and the idle before it) and in results.json;
   a row whose records made no step says why. */
START_TEST(timelines_listed)
{
    char d[600];
    fresh(d, sizeof d, "devtable_timelines");
    put(d, "steps.tsv", "timeline-default-1\tpass\t30\t\n");
    put(d, "bench/timeline_default_1.json",
        "{\"available\": true, \"cuda_kernels\": \"\", \"runs\": ["
        "{\"graph\": true, \"io\": \"stream\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.1,"
        " \"timeline\": {\"steps\": 20, \"kernels\": 2, \"span_us\": 90.0, \"busy_us\": 72.0, \"sum_us\": 80.0,"
        " \"rows\": [{\"name\": \"k_logits_small<1,0>\", \"stream\": 0, \"start_us\": 0, \"dur_us\": 5.2, \"idle_us\": 0},"
        " {\"name\": \"k_dec<2,0,0,3,0>\", \"stream\": 0, \"start_us\": 9.0, \"dur_us\": 27.5, \"idle_us\": 3.8}]}},"
        "{\"graph\": false, \"io\": \"stream\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.12,"
        " \"timeline\": {\"error\": \"this build of bench_cuda has no CUPTI\"}},"
        "{\"graph\": false, \"io\": \"host\", \"tokens\": 1, \"ok\": true, \"median_ms\": 0.2}]}");
    json_t *r = table(d);
    ck_assert_msg(strstr(out_buf, "timeline_default_1.json T 1 graph on: span 90.0 us, GPU busy 72.0 us (80 %), kernels' sum 80.0 us"),
                  "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "k_logits_small<1,0> 5.2, k_dec<2,0,0,3,0> 27.5 (+3.8)"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "T 1 graph off: not recorded: this build of bench_cuda has no CUPTI"), "%s", out_buf);
    json_t *tls = json_object_get(r, "timelines");
    ck_assert_int_eq((int)json_array_size(tls), 2);
    json_t *t0 = json_array_get(tls, 0);
    ck_assert_double_eq_tol(get_num(t0, "span_us"), 90.0, 1e-12);
    ck_assert_int_eq((int)json_array_size(json_object_get(t0, "rows")), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(tls, 1), "error")), "this build of bench_cuda has no CUPTI");
    json_decref(r);
}
END_TEST

START_TEST(stall_regions_of_a_source_page)
{
    char dir[600];
    fresh(dir, sizeof dir, "stall_regions");
    static const char page[] =
        "== profile-route-detail\n"
        "   | \"Kernel Name\",\"k\"\n"
        "   | \"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Instructions Executed\",\"stall_barrier\",\"stall_no_inst\"\n"
        "   | \"0x1000\",\"      LDG.E R2, [R4]\",\"6\",\"8\",\"0\",\"6\"\n"
        "   | \"0x1010\",\"      BAR.SYNC.DEFER_BLOCKING 0x0\",\"2\",\"8\",\"2\",\"0\"\n"
        "   | \"0x1080\",\"      FADD R1, R2, R3\",\"1\",\"1\",\"0\",\"0\"\n"
        "   | \"0x1090\",\"      NOP\",\"0\",\"0\",\"0\",\"0\"\n"
        "   | \"0x10a0\",\"@!P0  EXIT\",\"1\",\"1\",\"0\",\"1\"\n";
    put(dir, "page.log", page);
    ck_assert_msg(stall_regions(dir, "page.log", "") == 0, "%s", out_buf);
    /* the first region: 8 of 10 samples, 16 warp instructions, 2 distinct in one line */
    ck_assert_msg(strstr(out_buf, "     0-1             8  80.0%         16        2     1  BAR.SYNC"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "barrier 2"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "     2-4             2  20.0%          2        2     1  @!P0  EXIT"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "all: 10 samples, 18 warp instructions, 4 distinct executed instructions in 2 lines"),
                  "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "instruction fetch (no_instruction): 70.0% of the samples"), "%s", out_buf);
    /* --min-share leaves the small region out */
    ck_assert_int_eq(stall_regions(dir, "page.log", "--min-share 50"), 0);
    ck_assert_ptr_null(strstr(out_buf, "EXIT:"));
    put(dir, "none.log", "== build\n   pass in 3s\n");
    ck_assert_int_eq(stall_regions(dir, "none.log", ""), 2);
    ck_assert_msg(strstr(out_buf, "none.log: no SASS source page"), "%s", out_buf);
}
END_TEST

/* ci/scen-isolate.py on a hand-written report of tests/smoke.yaml's cases, rerun on the
   CPU CLI: nothing to rerun without a device fault; from the first case that failed with an
   illegal address on, each failing case rerun alone with both verdicts (one that exists in no
   scenario file has no report and counts as failed: exit 1); bad input exits 2 naming it. */
START_TEST(scenario_cases_rerun_alone)
{
    char dir[600], args[3000];
    const char *cli = getenv("DSV4MOE_CLI"), *src = getenv("DSV4MOE_SRC");
    if (!cli || !cli[0])
        return; /* run through make test */
    fresh(dir, sizeof dir, "scen_isolate");
    put(dir, "out/report.json",
        "{\"cases\": [{\"name\": \"smoke/topology=0\", \"status\": \"fail\"},"
        " {\"name\": \"smoke/topology=1\", \"status\": \"pass\"}]}");
    snprintf(args, sizeof args, "%s/out 60 %s run %s/tests/smoke.yaml", dir, cli, src && src[0] ? src : ".");
    ck_assert_msg(ci_script(dir, "scen-isolate.py", args) == 0, "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "nothing to rerun"), "%s", out_buf);
    put(dir, "out/report.json",
        "{\"cases\": [{\"name\": \"smoke/topology=0\", \"status\": \"fail\"},"
        " {\"name\": \"smoke/topology=2\", \"status\": \"fail\", \"checks\": [{\"detail\":"
        " \"backend cuda: CUDA error: an illegal memory access was encountered\"}]},"
        " {\"name\": \"smoke/hash-layer\", \"status\": \"fail\"},"
        " {\"name\": \"smoke/no-such-case\", \"status\": \"fail\"},"
        " {\"name\": \"smoke/topology=1\", \"status\": \"pass\"}]}");
    ck_assert_msg(ci_script(dir, "scen-isolate.py", args) == 1, "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "first device fault in case smoke/topology=2 (illegal memory access)"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "smoke/hash-layer"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "whole run: fail   alone: pass"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "alone: no report"), "%s", out_buf);
    ck_assert_msg(strstr(out_buf, "3 rerun, 1 failed alone"), "%s", out_buf);
    ck_assert_ptr_null(strstr(out_buf, "smoke/topology=0 ")); /* before the fault: not rerun */
    snprintf(args, sizeof args, "%s/nothing 60 %s", dir, cli);
    ck_assert_int_eq(ci_script(dir, "scen-isolate.py", args), 2);
    ck_assert_msg(strstr(out_buf, "cannot read the run's cases"), "%s", out_buf);
    snprintf(args, sizeof args, "%s/out soon %s", dir, cli);
    ck_assert_int_eq(ci_script(dir, "scen-isolate.py", args), 2);
    ck_assert_msg(strstr(out_buf, "SECONDS: not a number"), "%s", out_buf);
}
END_TEST

/* ci/variant-table.py: each params variant against the default of the same pass, from the
   manifest device-check's bench_variants writes; a run whose JSON is missing left out; a faster,
   a slower and a within-spread verdict; bad input exit 2. */
static void variant_run(const char *dir, const char *name, double ms1024, double ms4096)
{
    char text[600];
    snprintf(text, sizeof text,
             "{\"runs\": [{\"io\": \"host\", \"graph\": false, \"tokens\": 1024, \"ok\": true, \"median_ms\": 9.0},"
             " {\"io\": \"stream\", \"graph\": false, \"tokens\": 1024, \"ok\": true, \"median_ms\": %.4f},"
             " {\"io\": \"stream\", \"graph\": true, \"tokens\": 1024, \"ok\": true, \"median_ms\": %.4f},"
             " {\"io\": \"stream\", \"graph\": false, \"tokens\": 4096, \"ok\": true, \"median_ms\": %.4f},"
             " {\"graph\": true}]}",
             ms1024 + 0.5, ms1024, ms4096);
    put(dir, name, text);
}

START_TEST(variants_against_the_default)
{
    char dir[600], args[700];
    fresh(dir, sizeof dir, "variant_table");
    variant_run(dir, "bench/flipp_default_1.json", 2.00, 3.40);
    variant_run(dir, "bench/flipp_default_2.json", 2.02, 3.50);
    variant_run(dir, "bench/flipp_logits_blas_1.json", 1.80, 3.45);
    variant_run(dir, "bench/flipp_logits_blas_2.json", 1.81, 3.44);
    variant_run(dir, "bench/flipp_gather_quant_1.json", 2.50, 3.41);
    put(dir, "bench/variants.tsv",
        "flipp\tdefault\t1\tflipp_default_1.json\nflipp\tlogits=blas\t1\tflipp_logits_blas_1.json\n"
        "flipp\tgather=quant\t1\tflipp_gather_quant_1.json\nflipp\tdefault\t2\tflipp_default_2.json\n"
        "flipp\tlogits=blas\t2\tflipp_logits_blas_2.json\nflipp\tgather=quant\t2\tflipp_gather_quant_2.json\n"
        "direct\tdirect=b64\t1\tnone.json\n");
    snprintf(args, sizeof args, "%s/bench/variants.tsv", dir);
    ck_assert_msg(ci_script(dir, "variant-table.py", args) == 0, "%s", out_buf);
    /* T 1024: 2.00/1.80 and 2.02/1.81 (graph on, the best of the pass), faster in both passes */
    ck_assert_msg(strstr(out_buf, "1.8000 / 1.8100        2.0000 / 2.0200        1.111 / 1.116    faster"), "%s",
                  out_buf);
    /* T 4096: 3.40/3.45 and 3.50/3.44: within the default's 2.9 % spread */
    ck_assert_msg(strstr(out_buf, "3.4500 / 3.4400        3.4000 / 3.5000        0.986 / 1.017    within spread"),
                  "%s", out_buf);
    /* gather=quant's second pass has no JSON: the first alone, slower at T 1024 */
    ck_assert_msg(strstr(out_buf, "2.5000                 2.0000                 0.800            slower"), "%s",
                  out_buf);
    ck_assert_ptr_null(strstr(out_buf, "direct")); /* no default of its own */
    put(dir, "bench/bad.tsv", "flipp\tdefault\tfirst\tflipp_default_1.json\n");
    snprintf(args, sizeof args, "%s/bench/bad.tsv", dir);
    ck_assert_int_eq(ci_script(dir, "variant-table.py", args), 2);
    ck_assert_msg(strstr(out_buf, "bad.tsv:1: not 'profile<TAB>params<TAB>pass<TAB>json'"), "%s", out_buf);
    put(dir, "bench/flipp_default_1.json", "{\"runs\": 3}");
    snprintf(args, sizeof args, "%s/bench/variants.tsv", dir);
    ck_assert_int_eq(ci_script(dir, "variant-table.py", args), 2);
    ck_assert_msg(strstr(out_buf, "no 'runs' list"), "%s", out_buf);
}
END_TEST

Suite *devtable_suite(void)
{
    Suite *s = suite_create("devtable");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, two_modes_and_three_peers);
    tcase_add_test(tc, modes_from_rows_and_peers_that_did_not_run);
    tcase_add_test(tc, nothing_measured);
    tcase_add_test(tc, stall_regions_of_a_source_page);
    tcase_add_test(tc, timelines_listed);
    tcase_add_test(tc, scenario_cases_rerun_alone);
    tcase_add_test(tc, variants_against_the_default);
    suite_add_tcase(s, tc);
    return s;
}
