/* The dsv4moe binary as a user runs it: exit statuses and messages. */
#include <check.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dsv4moe/config.h"
#include "tests/testutil.h"

Suite *cli_suite(void);

static char out_buf[1 << 16];

/* Runs `dsv4moe ARGS` with stdout and stderr captured into out_buf; returns the exit status. */
static int run_cli(const char *args)
{
    int rc = tu_run_cli(args, "cli_out.txt", out_buf, sizeof out_buf);
    ck_assert_msg(rc != -2, "DSV4MOE_CLI is not set (run through make test)");
    return rc;
}

/* tu_cli_gen_ref into dir (the reference output dir/y.safetensors), the output in out_buf. */
static int gen_ref(const char *cfg, const char *gen, const char *dir)
{
    return tu_cli_gen_ref(cfg, gen, dir, "y.safetensors", "cli_out.txt", out_buf, sizeof out_buf);
}

static int run_sh(const char *cmd) { int rc = system(cmd); return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1; }

START_TEST(help_for_every_command)
{
    const char *cmds[] = {"gen", "inspect", "ref", "plan", "run", "diff", "export", "check", "symmetry", "bench"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char a[64];
        snprintf(a, sizeof a, "%s --help", cmds[i]);
        ck_assert_int_eq(run_cli(a), 0);
        ck_assert_ptr_nonnull(strstr(out_buf, "usage: dsv4moe"));
    }
    ck_assert_int_eq(run_cli("--help"), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "inspect"));
    ck_assert_int_eq(run_cli("help presets"), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "v4-flash"));
    ck_assert_ptr_nonnull(strstr(out_buf, "mini-topp"));
    ck_assert_int_eq(run_cli("help keys"), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "swiglu_limit"));
    ck_assert_int_eq(run_cli("--version"), 0);
    ck_assert_int_eq(run_cli(""), 2);
    ck_assert_int_eq(run_cli("frobnicate"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "unknown command 'frobnicate'"));
    ck_assert_int_eq(run_cli("ref"), 2);
    /* bench is not a command: it names the make targets that are */
    ck_assert_int_eq(run_cli("bench"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "`make bench`"));
}
END_TEST

/* gen's, export's and ref's progress lines: on a terminal (script(1) gives one), not into a pipe,
   not with --quiet. */
START_TEST(gen_progress_on_a_terminal_only)
{
    const char *cli = getenv("DSV4MOE_CLI");
    if (!cli || access("/usr/bin/script", X_OK) != 0)
        return;
    char dir[512], log[600], cmd[4096], out[8192];
    tu_path(dir, sizeof dir, "cli_gen_progress");
    tu_path(log, sizeof log, "cli_gen_progress.txt");
    static const char *const quiet[] = {"", " --quiet"};
    for (int q = 0; q < 2; q++) {
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/script -qec '%s gen --preset mini --set n_routed_experts=64 --layer 1 --out %s%s' /dev/null "
                 ">%s 2>&1 </dev/null",
                 cli, dir, quiet[q], log);
        ck_assert_int_eq(system(cmd), 0);
        ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
        ck_assert_msg((strstr(out, "dsv4moe gen: weights: 100 % of ") != NULL) == (q == 0), "%s", out);
    }
    char args[2048];
    snprintf(args, sizeof args, "gen --preset mini --layer 1 --out %s", dir);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_null(strstr(out_buf, "weights: 100 %"));
    /* export's line: the folders of the file and the case id */
    const char *src = getenv("DSV4MOE_SRC");
    snprintf(cmd, sizeof cmd,
             "/usr/bin/script -qec '%s export %s/scenarios/engines.yaml --filter topp-bf16 --dir %s-cases' /dev/null "
             ">%s 2>&1 </dev/null",
             cli, src ? src : ".", dir, log);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "dsv4moe export: 1 of 1, ") && strstr(out, "engines.topp-bf16"), "%s", out);
    /* ref's: on a terminal the tokens run in slices; the same bytes and statistics as in one call */
    snprintf(args, sizeof args, "gen --preset mini-topp --layer 2 --tokens 200 --out %s-ref", dir);
    ck_assert_int_eq(run_cli(args), 0);
    snprintf(args, sizeof args,
             "ref --preset mini-topp --layer 2 --weights %s-ref/model.safetensors --input %s-ref/input.safetensors "
             "--out %s-ref/y1.safetensors",
             dir, dir, dir);
    ck_assert_int_eq(run_cli(args), 0);
    char stats[512];
    const char *rt = strstr(out_buf, "  routing: ");
    ck_assert_ptr_nonnull(rt);
    snprintf(stats, sizeof stats, "%.*s", (int)strcspn(rt, "\n"), rt);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/script -qec '%s ref --preset mini-topp --layer 2 --weights %s-ref/model.safetensors --input "
             "%s-ref/input.safetensors --out %s-ref/y2.safetensors' /dev/null >%s 2>&1 </dev/null",
             cli, dir, dir, dir, log);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "dsv4moe ref: tokens: 200 of 200") && strstr(out, stats), "%s\n%s", stats, out);
    snprintf(cmd, sizeof cmd, "cmp %s-ref/y1.safetensors %s-ref/y2.safetensors", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(gen_then_inspect_then_independent_parser)
{
    char dir[512], args[2048];
    tu_path(dir, sizeof dir, "cli_gen");
    snprintf(args, sizeof args, "gen --preset mini --layer 1 --tokens 8 --seed 3 --threads 2 --out %s", dir);
    ck_assert_msg(run_cli(args) == 0, "%s", out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "clamp probe"));
    ck_assert_ptr_nonnull(strstr(out_buf, "split layout"));
    snprintf(args, sizeof args, "inspect %s/model.safetensors", dir);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "layout split"));
    ck_assert_ptr_nonnull(strstr(out_buf, "layers.1.ffn.experts.0.w1.weight"));
    ck_assert_ptr_nonnull(strstr(out_buf, "F8_E8M0"));
    ck_assert_ptr_nonnull(strstr(out_buf, "[256, 64]"));
    /* mini: 16 experts x 3 fp4 projections, 256 128-groups each, generated scales well inside the bound */
    ck_assert_ptr_nonnull(strstr(out_buf, "fp4 weights for gemm fp8: 48 tensors, 12288 128-groups, 0 beyond"));
    snprintf(args, sizeof args, "inspect --quiet %s", dir); /* a folder without an index */
    ck_assert_int_eq(run_cli(args), 0);
    /* The folder holds the weights and the input: only the file holding layer tensors is the
       checkpoint, the input is named as skipped, with the reason. */
    ck_assert_ptr_nonnull(strstr(out_buf, "1 file,"));
    ck_assert_ptr_nonnull(strstr(out_buf, "skipped"));
    ck_assert_ptr_nonnull(strstr(out_buf, "input.safetensors: holds no layer tensor"));
    const char *src = getenv("DSV4MOE_SRC");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "python3 %s/tests/tools/st_check.py %s/model.safetensors >/dev/null "
             "--expect layers.1.ffn.experts.0.w1.weight:I8:128,128 "
             "--expect layers.1.ffn.experts.0.w1.scale:F8_E8M0:128,8 "
             "--expect layers.1.ffn.experts.15.w2.weight:I8:256,64 "
             "--expect layers.1.ffn.shared_experts.w1.weight:F8_E4M3:128,256 "
             "--expect layers.1.ffn.shared_experts.w1.scale:F8_E8M0:1,2 "
             "--expect layers.1.ffn.gate.weight:BF16:16,256 --expect layers.1.ffn.gate.bias:F32:16",
             src ? src : ".", dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "python3 %s/tests/tools/st_check.py %s/input.safetensors >/dev/null --expect x:BF16:8,256 "
             "--expect input_ids:I32:8",
             src ? src : ".", dir);
    ck_assert_int_eq(run_sh(cmd), 0);
}
END_TEST

START_TEST(corrupt_files_exit_2_naming_file)
{
    char dir[512], args[2048], cmd[4096];
    tu_path(dir, sizeof dir, "cli_bad");
    snprintf(args, sizeof args, "gen --preset tiny --layer 1 --tokens 2 --out %s --probe-tokens 0", dir);
    ck_assert_msg(run_cli(args) == 0, "%s", out_buf);
    /* Truncations at several points: inside the length, the header and the data. */
    const long cuts[] = {3, 9, 100, 5000, 40000};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(cmd, sizeof cmd, "head -c %ld %s/model.safetensors > %s/cut.safetensors", cuts[i], dir, dir);
        ck_assert_int_eq(run_sh(cmd), 0);
        snprintf(args, sizeof args, "inspect %s/cut.safetensors", dir);
        ck_assert_int_eq(run_cli(args), 2);
        ck_assert_msg(strstr(out_buf, "cut.safetensors") != NULL, "message does not name the file: %s", out_buf);
    }
    /* A dtype name broken inside the header names the key. */
    snprintf(cmd, sizeof cmd, "sed 's/\"BF16\"/\"BF17\"/' %s/model.safetensors > %s/dt.safetensors", dir, dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    snprintf(args, sizeof args, "inspect %s/dt.safetensors", dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "dt.safetensors"));
    ck_assert_ptr_nonnull(strstr(out_buf, "BF17"));
    ck_assert_ptr_nonnull(strstr(out_buf, "layers.1.ffn."));
    snprintf(args, sizeof args, "inspect %s/none.safetensors", dir);
    ck_assert_int_eq(run_cli(args), 2);
}
END_TEST

START_TEST(bad_options_exit_2)
{
    char dir[512], args[2048];
    tu_path(dir, sizeof dir, "cli_never");
    snprintf(args, sizeof args, "gen --preset mini --layer 9 --out %s", dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "'layer'"));
    snprintf(args, sizeof args, "gen --preset mini --layer 1 --set top_p=2 --out %s", dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "'top_p'"));
    snprintf(args, sizeof args, "gen --preset mini --layer 1 --set nokey=2 --out %s", dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "nokey"));
    ck_assert_int_eq(run_cli("gen --preset nosuch --layer 1"), 2);
    ck_assert_int_eq(run_cli("gen --preset mini"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "--layer"));
    ck_assert_int_eq(run_cli("gen --preset mini --layer 1 --tokens -4"), 2);
    ck_assert_int_eq(run_cli("gen --preset mini --layer 1 --tokens"), 2);
    ck_assert_int_eq(run_cli("gen --bogus"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "unknown option '--bogus'"));
    ck_assert_int_eq(run_cli("ref --weights a --input b --out c --verbose"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "unknown option '--verbose'"));
    ck_assert_int_eq(run_cli("ref --weights a --input b --out c --rounding bf16"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "--rounding: 'bf16' is not a rounding profile (spec, bf16_ops, fp32)"));
    ck_assert_int_eq(run_cli("gen stray"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "unexpected argument 'stray'"));
    ck_assert_int_eq(run_cli("gen --preset mini --layer -3"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "value -3"));
    ck_assert_int_eq(run_cli("gen --preset mini --layer 1 --weights same.st --input same.st"), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "same file"));
    ck_assert(!tu_file_exists(dir));
}
END_TEST


START_TEST(ref_writes_outputs_and_rejects_bad_input)
{
    char dir[512], args[4096], cmd[4096];
    tu_path(dir, sizeof dir, "cli_ref");
    ck_assert_msg(gen_ref("--preset mini --layer 0 --threads 2", "--tokens 12 --probe-tokens 0", dir) == 0, "%s",
                  out_buf);
    ck_assert_ptr_nonnull(strstr(out_buf, "hash"));
    const char *src = getenv("DSV4MOE_SRC");
    snprintf(cmd, sizeof cmd,
             "python3 %s/tests/tools/st_check.py %s/y.safetensors >/dev/null --expect y:BF16:12,256 "
             "--expect topk_ids:I32:12,4 --expect topk_weights:F32:12,4",
             src ? src : ".", dir);
    ck_assert_int_eq(run_sh(cmd), 0);
    /* A dim that disagrees with the checkpoint names the tensor. */
    snprintf(args, sizeof args,
             "ref --preset mini --layer 0 --set moe_inter_dim=256 --weights %s/model.safetensors --input %s/input.safetensors "
             "--out %s/y2.safetensors",
             dir, dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "layers.0.ffn.experts.0.w1.weight"));
    ck_assert_msg(strstr(out_buf, "the config sets dim 256, moe_inter_dim 256, n_routed_experts 16"), "%s", out_buf);
    snprintf(args, sizeof args, "%s/y2.safetensors", dir);
    ck_assert(!tu_file_exists(args));
    /* The wrong layer id: its keys are not in the file. */
    snprintf(args, sizeof args,
             "ref --preset mini --layer 2 --weights %s/model.safetensors --input %s/input.safetensors --out %s/y3.safetensors",
             dir, dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "layers.2.ffn.gate.weight"));
    /* No --preset: the shape error names where dim came from and the preset that fits the file. */
    snprintf(args, sizeof args, "ref --layer 0 --weights %s/model.safetensors --input %s/input.safetensors --out %s/y5.st",
             dir, dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_msg(strstr(out_buf, "dim 4096 comes from the preset v4-flash, the default; the preset mini has dim "
                                  "256: give --preset mini"),
                  "%s", out_buf);
    ck_assert_int_eq(run_cli("ref --preset mini --layer 0"), 2);
    /* diff: a dump against itself, against a different quantization, and bad input. */
    snprintf(args, sizeof args,
             "ref --preset mini --layer 0 --set act_quant=fp32 --weights %s/model.safetensors --input "
             "%s/input.safetensors --out %s/y4.safetensors",
             dir, dir, dir);
    ck_assert_msg(run_cli(args) == 0, "%s", out_buf);
    snprintf(args, sizeof args, "diff %s/y.safetensors %s/y.safetensors", dir, dir);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "within tolerance"));
    ck_assert_ptr_nonnull(strstr(out_buf, "diff 0 "));
    snprintf(args, sizeof args, "diff %s/y4.safetensors %s/y.safetensors", dir, dir);
    ck_assert_int_eq(run_cli(args), 1);
    ck_assert_ptr_nonnull(strstr(out_buf, "outside tolerance"));
    snprintf(args, sizeof args, "diff %s/y4.safetensors %s/y.safetensors --tensor topk_ids", dir, dir);
    ck_assert_int_eq(run_cli(args), 0);
    ck_assert_ptr_nonnull(strstr(out_buf, "id sets differ 0")); /* routing-aware: the expert sets per token */
    snprintf(args, sizeof args, "diff %s/y.safetensors %s/y.safetensors --tensor nope", dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_ptr_nonnull(strstr(out_buf, "'nope'"));
    snprintf(args, sizeof args, "diff %s/y.safetensors %s/input.safetensors", dir, dir);
    ck_assert_int_eq(run_cli(args), 2);
    ck_assert_int_eq(run_cli("diff only-one.safetensors"), 2);
}
END_TEST


/* The reference against tests/tools/indep_ref.py, a NumPy implementation written from SPEC.md alone,
   in each rounding profile of section 10 (y and y_terms). */
static const struct {
    const char *preset;
    int layer;
    const char *sets;
    const char *rounding;
} indep_cases[] = {
    {"mini", 0, "", "spec"},
    {"mini", 1, "gate_logits=bf16", "spec"},
    {"mini-fp8", 2, "weight_point=after_w2", "spec"},
    {"mini-bf16", 3, "score_func=sigmoid shared_clamp=false", "spec"},
    {"mini-topp", 1, "top_p_renorm=true top_p_min_keep=2", "spec"},
    {"mini-topp", 2, "top_p_predictor=const top_p=0.6 score_func=softmax", "spec"},
    {"mini", 0, "", "bf16_ops"},
    {"mini", 1, "", "fp32"},
    {"mini-fp8", 2, "weight_point=after_w2", "bf16_ops"},
    {"mini-fp8", 2, "weight_point=after_w2", "fp32"},
    {"mini-fp8", 2, "act_quant=fp32", "fp32"},
    {"mini-bf16", 3, "", "bf16_ops"},
    {"mini-bf16", 3, "", "fp32"},
};

START_TEST(ref_agrees_with_independent_implementation)
{
    const char *py = getenv("DSV4MOE_PYTHON");
    if (!py || !py[0])
        py = "python3";
    char probe[600];
    snprintf(probe, sizeof probe, "%s -c 'import numpy' 2>/dev/null", py);
    ck_assert_msg(run_sh(probe) == 0, "%s has no numpy (ci/deps.sh installs python3-numpy)", py);
    int i = _i;
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(indep_cases[i].preset, &c, NULL), DSV4_OK);
    c.layer = indep_cases[i].layer;
    char sets[512] = "", all[4096] = "";
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", indep_cases[i].sets);
    for (char *kv = strtok(tmp, " "); kv; kv = strtok(NULL, " ")) {
        ck_assert_int_eq(dsv4_config_set_kv(&c, kv, NULL), DSV4_OK);
        strcat(sets, " --set ");
        strcat(sets, kv);
    }
    for (const char *const *k = dsv4_config_keys(); *k; k++) {
        char v[64], one[128];
        dsv4_config_get(&c, *k, v, sizeof v, NULL);
        snprintf(one, sizeof one, " --set %s=%s", *k, v);
        strcat(all, one);
    }
    char dir[512], args[4096], cmd[8192];
    char name[32];
    snprintf(name, sizeof name, "cli_indep_%d", i);
    tu_path(dir, sizeof dir, name);
    snprintf(args, sizeof args, "--preset %s --layer %d%s", indep_cases[i].preset, indep_cases[i].layer, sets);
    ck_assert_msg(gen_ref(args, "--tokens 48 --seed 11 --probe-tokens 0", dir) == 0, "%s", out_buf);
    const char *rnd = indep_cases[i].rounding;
    char yname[64] = "y.safetensors";
    if (strcmp(rnd, "spec")) {
        snprintf(yname, sizeof yname, "y_%s.safetensors", rnd);
        snprintf(cmd, sizeof cmd,
                 "ref %s --rounding %s --weights %s/model.safetensors --input %s/input.safetensors --out %s/%s", args,
                 rnd, dir, dir, dir, yname);
        ck_assert_msg(run_cli(cmd) == 0, "%s", out_buf);
        ck_assert_ptr_nonnull(strstr(out_buf, rnd));
    }
    const char *src = getenv("DSV4MOE_SRC");
    snprintf(cmd, sizeof cmd,
             "%s %s/tests/tools/indep_ref.py --weights %s/model.safetensors --input %s/input.safetensors "
             "--out-ref %s/%s --rounding %s%s > %s/indep.txt 2>&1",
             py, src ? src : ".", dir, dir, dir, yname, rnd, all, dir);
    int rc = run_sh(cmd);
    snprintf(args, sizeof args, "%s/indep.txt", dir);
    FILE *f = fopen(args, "r");
    size_t n = f ? fread(out_buf, 1, sizeof out_buf - 1, f) : 0;
    out_buf[n] = '\0';
    if (f)
        fclose(f);
    ck_assert_msg(rc == 0, "case %d: %s", i, out_buf);
    /* Both sides accumulate in double: every element agrees to the bit here, y_terms too. */
    ck_assert_msg(strstr(out_buf, "max ulp: 0 ") != NULL, "case %d: %s", i, out_buf);
    ck_assert_msg(strstr(out_buf, "y_terms bit-identical: 1.000000") != NULL, "case %d: %s", i, out_buf);
}
END_TEST

Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, help_for_every_command);
    tcase_add_test(tc, gen_then_inspect_then_independent_parser);
    tcase_add_test(tc, gen_progress_on_a_terminal_only);
    tcase_add_test(tc, corrupt_files_exit_2_naming_file);
    tcase_add_test(tc, bad_options_exit_2);
    tcase_add_test(tc, ref_writes_outputs_and_rejects_bad_input);
    tcase_add_loop_test(tc, ref_agrees_with_independent_implementation, 0,
                        (int)(sizeof indep_cases / sizeof indep_cases[0]));
    suite_add_tcase(s, tc);
    return s;
}
