/*
 * make bench (core): throughput of the number formats against a memcpy of the
 * same bytes measured in the same run, and the reference layer's time per
 * token at 1 and 2 threads. Prints a table and writes JSON (argv[1]).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/safetensors.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* out = the best of `reps` runs of stmt, in seconds. */
#define BEST(out, reps, stmt)                                                                               \
    do {                                                                                                    \
        (out) = 1e30;                                                                                       \
        for (int r_ = 0; r_ < (reps); r_++) {                                                               \
            double t0_ = now();                                                                             \
            stmt;                                                                                           \
            double dt_ = now() - t0_;                                                                       \
            (out) = dt_ < (out) ? dt_ : (out);                                                              \
        }                                                                                                   \
    } while (0)

int main(int argc, char **argv)
{
    const char *json = argc > 1 ? argv[1] : "out/bench/core.json";
    const char *tmp = argc > 2 ? argv[2] : "out/bench";
    const int64_t N = 4096, K = 4096; /* one 4096 x 4096 matrix: 64 MiB of fp32 */
    size_t nf = (size_t)(N * K);
    float *w = malloc(nf * sizeof *w), *o = malloc(nf * sizeof *o), *o2 = malloc(nf * sizeof *o2);
    uint8_t *q8 = malloc(nf), *q4 = malloc(nf / 2), *s4 = malloc(nf / 32);
    uint8_t *s8 = malloc((size_t)(N / 128 * K / 128));
    if (!w || !o || !o2 || !q8 || !q4 || !s4 || !s8) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nf; i++)
        w[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-3f;
    double t_copy;
    BEST(t_copy, 5, memcpy(o2, w, nf * sizeof *w));
    double copy_gbs = (double)(nf * 2 * sizeof(float)) / t_copy / 1e9; /* read + write */
    dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q8, s8, "bench", NULL);
    dsv4_quant_fp4_block(w, N, K, q4, s4, "bench", NULL);
    double t_q8;
    BEST(t_q8, 3, dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q8, s8, "bench", NULL));
    double t_q4;
    BEST(t_q4, 3, dsv4_quant_fp4_block(w, N, K, q4, s4, "bench", NULL));
    double t_d8;
    BEST(t_d8, 5, dsv4_dequant_fp8_rows(q8, s8, DSV4_SCALE_UE8M0, N, K, 0, N, o));
    double t_d4;
    BEST(t_d4, 5, dsv4_dequant_fp4_rows(q4, s4, N, K, 0, N, o));
    double t_aq;
    BEST(t_aq, 3, for (int64_t r = 0; r < N; r++) dsv4_act_quant_row(w + r * K, K, DSV4_ACT_QUANT_UE8M0,
                                                                               o + r * K, NULL, NULL));
    /* Bytes touched per op: fp32 in/out plus the codes; as a share of memcpy's rate. */
    struct {
        const char *name;
        double t, bytes;
    } rows[] = {
        {"quant fp8 128x128", t_q8, (double)nf * 5},
        {"quant fp4 1x32", t_q4, (double)nf * 4.5},
        {"dequant fp8", t_d8, (double)nf * 5},
        {"dequant fp4", t_d4, (double)nf * 4.5},
        {"act quant 1x128", t_aq, (double)nf * 8},
    };
    FILE *jf = fopen(json, "w");
    if (!jf) {
        fprintf(stderr, "bench: cannot write %s\n", json);
        return 1;
    }
    fprintf(jf, "{\n  \"memcpy_gbs\": %.3f,\n  \"formats\": [\n", copy_gbs);
    printf("%-20s %10s %12s %10s\n", "formats (4096^2)", "ms", "Gelem/s", "vs memcpy");
    printf("%-20s %10.2f %12s %9.2fx   (%.2f GB/s read+write)\n", "memcpy fp32", t_copy * 1e3, "-", 1.0, copy_gbs);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double gbs = rows[i].bytes / rows[i].t / 1e9;
        printf("%-20s %10.2f %12.3f %9.2fx\n", rows[i].name, rows[i].t * 1e3, (double)nf / rows[i].t / 1e9,
               gbs / copy_gbs);
        fprintf(jf, "    {\"name\": \"%s\", \"ms\": %.3f, \"gelem_per_s\": %.4f, \"share_of_memcpy\": %.4f}%s\n",
                rows[i].name, rows[i].t * 1e3, (double)nf / rows[i].t / 1e9, gbs / copy_gbs,
                i + 1 < sizeof rows / sizeof rows[0] ? "," : "");
    }
    fprintf(jf, "  ],\n  \"ref\": [\n");
    free(w);
    free(o);
    free(o2);
    free(q8);
    free(q4);
    free(s4);
    free(s8);

    /* The reference: mini at T = 256, and the v4-flash shapes (8 experts) at T = 16. */
    const struct {
        const char *preset;
        int64_t experts, tokens;
    } cases[] = {{"mini", 16, 256}, {"v4-flash", 8, 16}};
    printf("\n%-24s %8s %12s %12s %10s\n", "reference", "tokens", "1 thread ms", "2 threads ms", "speed-up");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        dsv4_config c;
        dsv4_config_preset(cases[ci].preset, &c, NULL);
        c.layer = c.n_hash_layers;
        c.n_routed_experts = cases[ci].experts;
        char wp[1024], ip[1024];
        snprintf(wp, sizeof wp, "%s/%s.safetensors", tmp, cases[ci].preset);
        snprintf(ip, sizeof ip, "%s/%s_in.safetensors", tmp, cases[ci].preset);
        dsv4_gen_options go;
        dsv4_gen_options_init(&go);
        go.threads = 2;
        dsv4_error e;
        dsv4_checkpoint *ck = NULL;
        dsv4_st_file *in = NULL;
        if (dsv4_gen_weights(&c, &go, wp, &e) || dsv4_gen_input(&c, &go, cases[ci].tokens, ip, &e) ||
            dsv4_checkpoint_open(wp, &ck, &e) || dsv4_st_open(ip, &in, &e)) {
            fprintf(stderr, "bench: %s\n", e.message);
            return 1;
        }
        int64_t T = cases[ci].tokens;
        uint16_t *x = malloc((size_t)(T * c.dim) * 2), *y = malloc((size_t)(T * c.dim) * 2);
        memcpy(x, dsv4_st_find(in, "x")->data, (size_t)(T * c.dim) * 2);
        double t[2];
        uint64_t h[2];
        for (int th = 1; th <= 2; th++) {
            dsv4_ref *r;
            if (dsv4_ref_create(&c, ck, th, &r, &e)) {
                fprintf(stderr, "bench: %s\n", e.message);
                return 1;
            }
            dsv4_ref_output out = {.y = y};
            BEST(t[th - 1], 2, dsv4_ref_forward(r, T, x, NULL, &out, &e));
            h[th - 1] = dsv4_ref_hash(&c, T, &out);
            dsv4_ref_free(r);
        }
        char label[64];
        snprintf(label, sizeof label, "%s (E %lld)", cases[ci].preset, (long long)c.n_routed_experts);
        printf("%-24s %8lld %12.1f %12.1f %9.2fx%s\n", label, (long long)T, t[0] * 1e3, t[1] * 1e3, t[0] / t[1],
               h[0] == h[1] ? "" : "  OUTPUT DIFFERS");
        fprintf(jf, "    {\"preset\": \"%s\", \"experts\": %lld, \"tokens\": %lld, \"ms_1_thread\": %.3f, "
                    "\"ms_2_threads\": %.3f, \"same_output\": %s}%s\n",
                cases[ci].preset, (long long)c.n_routed_experts, (long long)T, t[0] * 1e3, t[1] * 1e3,
                h[0] == h[1] ? "true" : "false", ci + 1 < sizeof cases / sizeof cases[0] ? "," : "");
        free(x);
        free(y);
        dsv4_st_close(in);
        dsv4_checkpoint_close(ck);
        if (h[0] != h[1])
            return 1;
    }
    fprintf(jf, "  ]\n}\n");
    fclose(jf);
    printf("\nbench: JSON in %s\n", json);
    return 0;
}
