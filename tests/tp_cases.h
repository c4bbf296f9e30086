/*
 * The tp = 2 layers of the distributed tests (tests/test_dist.c on the cpu backend,
 * tests/cuda/test_devsim.c on the cuda backend): mini-bf16 (64-row shards), and mini with
 * I = 256 (128-row shards) on fp4 / fp8 weights with ue8m0 and fp32 block scales, and fp4
 * without activation quantization. The shards of w1 and w3 are row views, w2's column shards
 * copies with their scales.
 */
#ifndef DSV4MOE_TESTS_TP_CASES_H
#define DSV4MOE_TESTS_TP_CASES_H

#include "dsv4moe/config.h"

static const struct {
    const char *preset;
    int64_t inter;
    dsv4_weight_format routed, shared;
    dsv4_scale_format scale;
    dsv4_act_quant act;
} tp_cases[] = {
    {"mini-bf16", 0, DSV4_FORMAT_BF16, DSV4_FORMAT_BF16, DSV4_SCALE_UE8M0, DSV4_ACT_QUANT_NONE},
    {"mini", 256, DSV4_FORMAT_FP4, DSV4_FORMAT_FP8, DSV4_SCALE_UE8M0, DSV4_ACT_QUANT_UE8M0},
    {"mini", 256, DSV4_FORMAT_FP8, DSV4_FORMAT_FP8, DSV4_SCALE_FP32, DSV4_ACT_QUANT_FP32},
    {"mini", 256, DSV4_FORMAT_FP4, DSV4_FORMAT_BF16, DSV4_SCALE_UE8M0, DSV4_ACT_QUANT_NONE},
};
#define N_TP_CASES (int)(sizeof tp_cases / sizeof tp_cases[0])

/* Case i's layer (layer 1). */
static inline dsv4_status tp_case_config(int i, dsv4_config *c)
{
    dsv4_status st = dsv4_config_preset(tp_cases[i].preset, c, NULL);
    c->layer = 1;
    if (tp_cases[i].inter) {
        c->moe_inter_dim = tp_cases[i].inter;
        c->routed_format = tp_cases[i].routed;
        c->shared_format = tp_cases[i].shared;
        c->weight_scale = tp_cases[i].scale;
        c->act_quant = tp_cases[i].act;
    }
    return st;
}

#endif
