#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/fileio.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/safetensors.h"

static const char GEN_HELP[] =
    "usage: dsv4moe gen [--preset P | --config FILE] --layer N [--set KEY=VALUE ...]\n"
    "                   [--tokens T] [--seed S] [--threads N] [--layout split|stacked] [--model-prefix] [--quiet]\n"
    "                   [--out DIR | --weights FILE --input FILE] [--probe-tokens N] [--probe-experts N]\n\n"
    "Writes a deterministic synthetic layer in the real checkpoint layout and an input\n"
    "file (x BF16 [T, H], input_ids I32 [T]), then measures how often the SwiGLU clamp\n"
    "acts on a sample of them. The files depend only on the config and the seed.\n\n"
    "%s"
    "  --tokens T           tokens of the input (default 64)\n"
    "  --seed S             the generator's seed (default 1)\n"
    "  --threads N          worker threads (default: online CPUs); the output does not depend on it\n"
    "  --layout L           split (official release, default) or stacked (HF export, bf16 only)\n"
    "  --model-prefix       stacked layout: keys start with 'model.'\n"
    "  --out DIR            write DIR/model.safetensors and DIR/input.safetensors (default out/gen)\n"
    "  --weights FILE       where to write the weights (with --input)\n"
    "  --input FILE         where to write the input\n"
    "  --probe-tokens N     tokens of the clamp probe (default 16; 0 skips the probe)\n"
    "  --probe-experts N    experts of the clamp probe (default 8)\n"
    "  --quiet              no progress line (shown on a terminal while the weights are written)\n";

static int mkdirs(const char *dir)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    return mkdir(buf, 0755) == 0 || access(buf, W_OK) == 0 ? 0 : -1;
}

int cmd_gen(int argc, char **argv)
{
    const char *cmd = "gen";
    cli_config_opts co = {0};
    dsv4_gen_options opt;
    dsv4_gen_options_init(&opt);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    opt.threads = ncpu > 0 ? (ncpu > 64 ? 64 : (int)ncpu) : 1;
    int64_t tokens = 64, v, probe_tokens = 16, probe_experts = 8;
    const char *out_dir = NULL, *wpath = NULL, *ipath = NULL;
    static const char *const value_opts[] = {"--tokens", "--seed", "--threads", "--layout", "--out", "--weights", "--input", "--probe-tokens", "--probe-experts", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .co = &co, .help = GEN_HELP, .value_opts = value_opts,
                     .flags = (const char *const[]){"--model-prefix", "--quiet", NULL}};
    bool quiet = false;
    const char *a, *val;
    while (cli_next_arg(&args, &a, &val)) {
        if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "--model-prefix")) {
            opt.model_prefix = true;
        } else if (!strcmp(a, "--tokens")) {
            if (cli_parse_i64(cmd, a, val, 0, 1 << 24, &tokens))
                return EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_i64(cmd, a, val, 0, INT64_MAX, &v))
                return EXIT_BAD_INPUT;
            opt.seed = (uint64_t)v;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_i64(cmd, a, val, 1, 256, &v))
                return EXIT_BAD_INPUT;
            opt.threads = (int)v;
        } else if (!strcmp(a, "--layout")) {
            if (cli_parse_layout(cmd, val, &opt.layout))
                return EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--out")) {
            out_dir = val;
        } else if (!strcmp(a, "--weights")) {
            wpath = val;
        } else if (!strcmp(a, "--input")) {
            ipath = val;
        } else if (!strcmp(a, "--probe-tokens")) {
            if (cli_parse_i64(cmd, a, val, 0, 1 << 20, &probe_tokens))
                return EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--probe-experts")) {
            if (cli_parse_i64(cmd, a, val, 1, 1 << 16, &probe_experts))
                return EXIT_BAD_INPUT;
        } else {
            return cli_failf(cmd, "unknown option '%s' (see dsv4moe gen --help)", a);
        }
    }
    if (args.status >= 0)
        return args.status;
    if ((wpath != NULL) != (ipath != NULL))
        return cli_failf(cmd, "--weights and --input go together");
    if (wpath && !strcmp(wpath, ipath))
        return cli_failf(cmd, "--weights and --input name the same file '%s'", wpath);
    if (out_dir && wpath)
        return cli_failf(cmd, "--out conflicts with --weights/--input: give one or the other");
    dsv4_config cfg;
    int rc = cli_config_build(cmd, &co, &cfg);
    if (rc)
        return rc;
    char wbuf[1100], ibuf[1100];
    if (!wpath) {
        if (!out_dir)
            out_dir = "out/gen";
        if (strlen(out_dir) > 1000 || mkdirs(out_dir))
            return cli_failf(cmd, "cannot create the output folder '%s'", out_dir);
        snprintf(wbuf, sizeof wbuf, "%s/model.safetensors", out_dir);
        snprintf(ibuf, sizeof ibuf, "%s/input.safetensors", out_dir);
        wpath = wbuf;
        ipath = ibuf;
    }
    dsv4_error err;
    dsv4_error_clear(&err);
    /* Both destinations are checked before a minute of generation, not after. */
    mode_t dmode;
    if (dsv4_out_check_dest(wpath, &dmode, &err) || dsv4_out_check_dest(ipath, &dmode, &err))
        return cli_fail(cmd, &err);
    printf("dsv4moe gen: %s layer %lld (%s), H %lld I %lld E %lld K %lld, routed %s, shared %s, seed %llu, "
           "%d threads\n",
           co.preset ? co.preset : "v4-flash", (long long)cfg.layer, dsv4_config_is_hash_layer(&cfg) ? "hash" : "non-hash",
           (long long)cfg.dim, (long long)cfg.moe_inter_dim, (long long)cfg.n_routed_experts,
           (long long)cfg.n_activated, dsv4_weight_format_name(cfg.routed_format),
           dsv4_weight_format_name(cfg.shared_format), (unsigned long long)opt.seed, opt.threads);
    double t0 = cli_now();
    cli_progress prog;
    cli_progress_start(&prog, "dsv4moe gen: weights", quiet);
    opt.progress = cli_progress_bytes;
    opt.progress_user = &prog;
    dsv4_status gst = dsv4_gen_weights(&cfg, &opt, wpath, &err);
    cli_progress_end(&prog);
    if (gst)
        return cli_fail(cmd, &err);
    double t1 = cli_now();
    if (dsv4_gen_input(&cfg, &opt, tokens, ipath, &err))
        return cli_fail(cmd, &err);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    if (dsv4_checkpoint_open(wpath, &ck, &err) || dsv4_st_open(ipath, &in, &err)) {
        dsv4_checkpoint_close(ck);
        return cli_fail(cmd, &err);
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < dsv4_checkpoint_tensor_count(ck); i++)
        bytes += dsv4_checkpoint_tensor_meta(ck, i)->nbytes;
    printf("  weights  %s: %zu tensors, %.1f MB of data, %s layout (%.2f s)\n", wpath,
           dsv4_checkpoint_tensor_count(ck), (double)bytes / 1e6, dsv4_layout_name(dsv4_checkpoint_layout(ck)),
           t1 - t0);
    printf("  input    %s: x BF16 [%lld, %lld], input_ids I32 [%lld]\n", ipath, (long long)tokens,
           (long long)cfg.dim, (long long)tokens);
    rc = EXIT_OK;
    if (probe_tokens > 0 && tokens > 0) {
        dsv4_clamp_probe pr;
        if (dsv4_gen_probe_clamp(ck, &cfg, in, probe_tokens, probe_experts, &pr, &err)) {
            rc = cli_fail(cmd, &err);
        } else {
            double n = pr.values ? (double)pr.values : 1.0;
            printf("  clamp probe: %lld tokens x %lld experts, %llu values, L = %g: g > L %.3f %%, |u| > L %.3f %%\n",
                   (long long)pr.tokens, (long long)pr.experts, (unsigned long long)pr.values,
                   (double)cfg.swiglu_limit, 100.0 * (double)pr.g_clamped / n, 100.0 * (double)pr.u_clamped / n);
        }
    }
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    return rc;
}
