#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/fileio.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"

static const char REF_HELP[] =
    "usage: dsv4moe ref --weights W.safetensors|DIR --input X.safetensors --layer N\n"
    "                   [--preset P | --config FILE] [--set KEY=VALUE ...] --out Y.safetensors\n"
    "                   [--threads N] [--rounding spec|bf16_ops|fp32] [--quiet]\n\n"
    "Runs the deterministic reference of one MoE layer (SPEC.md) and writes y (BF16 [T, H]),\n"
    "topk_ids (I32 [T, K], pruned slots hold E), topk_weights (F32 [T, K]) and y_terms (F32\n"
    "[T, H]: |shared output| + sum of |weighted expert outputs|, SPEC.md section 10). The output\n"
    "bytes do not depend on --threads. Prints the routing and clamp statistics and the hash.\n\n"
    "%s"
    "  --weights PATH       checkpoint: a file, a folder, or an index (split or stacked layout)\n"
    "  --input FILE         x BF16 [T, H] and input_ids I32 [T]\n"
    "  --out FILE           where to write the outputs (atomically)\n"
    "  --threads N          worker threads (default: online CPUs)\n"
    "  --rounding P         where the expected output rounds before an activation quantization\n"
    "                       (SPEC.md section 10): spec (default, section 4 as written), bf16_ops\n"
    "                       (every elementwise result in bf16, as eager PyTorch on a bf16 model)\n"
    "                       or fp32 (g, u, h and o in fp32); recorded as metadata 'rounding'\n"
    "  --quiet              no progress line (on a terminal the tokens are run in slices and counted;\n"
    "                       every token's outputs depend on its own row only, so the bytes are the same)\n";

int cmd_ref(int argc, char **argv)
{
    const char *cmd = "ref";
    cli_config_opts co = {0};
    const char *wpath = NULL, *ipath = NULL, *opath = NULL;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t threads = ncpu > 0 ? (ncpu > 64 ? 64 : ncpu) : 1;
    static const char *const value_opts[] = {"--weights", "--input", "--out", "--threads", "--rounding", NULL};
    dsv4_rounding rounding = DSV4_ROUNDING_SPEC;
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .co = &co, .help = REF_HELP, .value_opts = value_opts,
                     .flags = (const char *const[]){"--quiet", NULL}};
    bool quiet = false;
    const char *a, *val;
    while (cli_next_arg(&args, &a, &val)) {
        if (!strcmp(a, "--quiet"))
            quiet = true;
        else if (!strcmp(a, "--weights"))
            wpath = val;
        else if (!strcmp(a, "--input"))
            ipath = val;
        else if (!strcmp(a, "--out"))
            opath = val;
        else if (!strcmp(a, "--threads")) {
            if (cli_parse_i64(cmd, a, val, 1, 256, &threads))
                return EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--rounding")) {
            dsv4_error perr;
            if (dsv4_rounding_parse(val, &rounding, &perr))
                return cli_failf(cmd, "--%s", perr.message);
        } else
            return cli_failf(cmd, "unknown option '%s' (see dsv4moe ref --help)", a);
    }
    if (args.status >= 0)
        return args.status;
    if (!wpath || !ipath || !opath)
        return cli_failf(cmd, "--weights, --input and --out are required (see dsv4moe ref --help)");
    dsv4_config cfg;
    int rc = cli_config_build(cmd, &co, &cfg);
    if (rc)
        return rc;
    dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    dsv4_ref *ref = NULL;
    dsv4_st_writer *w = NULL;
    uint16_t *x = NULL, *y = NULL;
    int32_t *ids = NULL, *topk = NULL;
    float *topw = NULL, *terms = NULL;
    rc = EXIT_BAD_INPUT;
    /* An impossible destination is refused before minutes of work, not after. */
    mode_t dmode;
    if (dsv4_out_check_dest(opath, &dmode, &err))
        return cli_fail(cmd, &err);
    double t0 = cli_now();
    if (dsv4_checkpoint_open(wpath, &ck, &err) || dsv4_st_open(ipath, &in, &err)) {
        cli_fail(cmd, &err);
        goto done;
    }
    cli_print_skipped(cmd, ck);
    const dsv4_tensor_info *tx = dsv4_st_find(in, "x"), *ti = dsv4_st_find(in, "input_ids");
    char found[160];
    if (!tx || tx->dtype != DSV4_DTYPE_BF16 || tx->ndim != 2 || tx->shape[1] != cfg.dim) {
        char hint[300] = "";
        if (tx && tx->ndim == 2 && tx->shape[1] != cfg.dim) {
            hint[0] = ' ';
            hint[1] = '(';
            cli_dim_hint(&co, &cfg, tx->shape[1], hint + 2, sizeof hint - 3);
            strcat(hint, ")");
        }
        cli_failf(cmd, "%s: tensor 'x' must exist as BF16 [T, dim = %lld]; found %s%s", ipath, (long long)cfg.dim,
                  cli_tensor_desc(tx, found, sizeof found), hint);
        goto done;
    }
    int64_t T = tx->shape[0], H = cfg.dim, K = cfg.n_activated;
    if (ti && (ti->dtype != DSV4_DTYPE_I32 || ti->ndim != 1 || ti->shape[0] != T)) {
        cli_failf(cmd, "%s: tensor 'input_ids' must be I32 [T = %lld]; found %s", ipath, (long long)T,
                  cli_tensor_desc(ti, found, sizeof found));
        goto done;
    }
    if (!ti && dsv4_config_is_hash_layer(&cfg)) {
        cli_failf(cmd, "%s: tensor 'input_ids' is required: layer %lld is a hash layer", ipath, (long long)cfg.layer);
        goto done;
    }
    x = malloc((size_t)(T * H + 1) * sizeof *x);
    ids = malloc((size_t)(T + 1) * sizeof *ids);
    y = malloc((size_t)(T * H + 1) * sizeof *y);
    topk = malloc((size_t)(T * K + 1) * sizeof *topk);
    topw = malloc((size_t)(T * K + 1) * sizeof *topw);
    terms = malloc((size_t)(T * H + 1) * sizeof *terms);
    if (!x || !ids || !y || !topk || !topw || !terms) {
        cli_failf(cmd, "out of memory for %lld tokens", (long long)T);
        goto done;
    }
    memcpy(x, tx->data, (size_t)(T * H) * sizeof *x);
    if (ti)
        memcpy(ids, ti->data, (size_t)T * sizeof *ids);
    if (dsv4_ref_create(&cfg, ck, (int)threads, &ref, &err) || dsv4_ref_set_rounding(ref, rounding, &err)) {
        cli_fail(cmd, &err);
        goto done;
    }
    double t1 = cli_now();
    dsv4_ref_output out = {.y = y, .topk_ids = topk, .topk_weights = topw};
    /* On a terminal the tokens go in slices, counted on the progress line; the statistics add up. */
    cli_progress prog;
    cli_progress_start(&prog, "dsv4moe ref: tokens", quiet);
    int64_t slice = prog.on ? (T + 49) / 50 : T;
    slice = slice < 1 ? 1 : slice;
    memset(&out.stats, 0, sizeof out.stats);
    for (int64_t t0s = 0; t0s < T || (T == 0 && t0s == 0); t0s += slice) {
        int64_t n = T - t0s < slice ? T - t0s : slice;
        dsv4_ref_output part = {.y = y + t0s * H, .topk_ids = topk + t0s * K, .topk_weights = topw + t0s * K};
        if (dsv4_ref_forward_terms(ref, n, x + t0s * H, ti ? ids + t0s : NULL, &part, terms + t0s * H, &err)) {
            cli_progress_end(&prog);
            cli_fail(cmd, &err);
            goto done;
        }
        dsv4_ref_stats *sa = &out.stats, *sb = &part.stats;
        sa->tokens += sb->tokens, sa->nonfinite_rows += sb->nonfinite_rows, sa->kept_slots += sb->kept_slots;
        sa->pruned_slots += sb->pruned_slots, sa->routed_values += sb->routed_values;
        sa->routed_g_clamped += sb->routed_g_clamped, sa->routed_u_clamped += sb->routed_u_clamped;
        sa->shared_values += sb->shared_values, sa->shared_g_clamped += sb->shared_g_clamped;
        sa->shared_u_clamped += sb->shared_u_clamped;
        cli_progress_count(&prog, (size_t)(t0s + n), (size_t)T, NULL);
        if (T == 0)
            break;
    }
    cli_progress_end(&prog);
    double t2 = cli_now();
    int64_t sy[2] = {T, H}, sk[2] = {T, K};
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)dsv4_ref_hash(&cfg, T, &out));
    char nexp[32]; /* the pruned-slot sentinel of topk_ids, for dsv4moe diff */
    snprintf(nexp, sizeof nexp, "%lld", (long long)cfg.n_routed_experts);
    if (dsv4_st_writer_create(&w, &err) || dsv4_st_writer_add(w, "y", DSV4_DTYPE_BF16, 2, sy, y, &err) ||
        dsv4_st_writer_add(w, "topk_ids", DSV4_DTYPE_I32, 2, sk, topk, &err) ||
        dsv4_st_writer_add(w, "topk_weights", DSV4_DTYPE_F32, 2, sk, topw, &err) ||
        dsv4_st_writer_add(w, "y_terms", DSV4_DTYPE_F32, 2, sy, terms, &err) ||
        dsv4_st_writer_set_metadata(w, "rounding", dsv4_rounding_name(rounding), &err) ||
        dsv4_st_writer_set_metadata(w, "ref_hash", hash, &err) ||
        dsv4_st_writer_set_metadata(w, "n_routed_experts", nexp, &err) ||
        dsv4_st_writer_write(w, opath, NULL, NULL, &err)) {
        cli_fail(cmd, &err);
        goto done;
    }
    const dsv4_ref_stats *s = &out.stats;
    printf("dsv4moe ref: layer %lld (%s), %lld tokens, %lld threads, rounding %s: load %.2f s, forward %.2f s\n",
           (long long)cfg.layer, dsv4_config_is_hash_layer(&cfg) ? "hash" : "non-hash", (long long)T,
           (long long)threads, dsv4_rounding_name(rounding), t1 - t0, t2 - t1);
    printf("  routing: %lld slots kept, %lld pruned, %lld non-finite rows\n", (long long)s->kept_slots,
           (long long)s->pruned_slots, (long long)s->nonfinite_rows);
    printf("  clamp (L = %g): routed g %llu, u %llu of %llu; shared g %llu, u %llu of %llu\n",
           (double)cfg.swiglu_limit, (unsigned long long)s->routed_g_clamped, (unsigned long long)s->routed_u_clamped,
           (unsigned long long)s->routed_values, (unsigned long long)s->shared_g_clamped,
           (unsigned long long)s->shared_u_clamped, (unsigned long long)s->shared_values);
    printf("  wrote %s (hash %s)\n", opath, hash);
    rc = EXIT_OK;
done:
    dsv4_st_writer_free(w);
    dsv4_ref_free(ref);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    free(x);
    free(ids);
    free(y);
    free(topk);
    free(topw);
    free(terms);
    return rc;
}
