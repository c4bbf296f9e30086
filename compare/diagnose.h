/*
 * Internal to check (compare/engines.c): naming the known class a failing engine's output fits
 * (docs/engines.md, "Naming the likely class"). Not installed.
 */
#ifndef DSV4MOE_HARNESS_DIAGNOSE_H
#define DSV4MOE_HARNESS_DIAGNOSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4moe_harness/compare.h"
#include "dsv4moe/config.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/safetensors.h"

/* The class a memory verdict over its bound names (check's memory check, compare/engines.c). */
#define DSV4_H_MEMORY_CLASS "workspace_wrong_dim"

/* What check saw of a failing case, for dsv4_h_diagnose. */
typedef struct dsv4_h_failure {
    const char *case_dir;          /* holds model.safetensors and input.safetensors */
    const dsv4_config *cfg;
    int64_t T;
    dsv4_rounding rounding;        /* the engine's profile */
    dsv4_tolerance rule;
    const uint16_t *y;             /* the engine's y as bf16 [T, H] */
    const uint16_t *y_ref;         /* the contract's y and y_terms at that profile */
    const float *terms_ref;
    const int32_t *ids_ref;        /* the contract's topk_ids [T, K] (sentinel E) */
    const dsv4_tensor_info *ids;   /* the engine's routing, or NULL */
    bool routing_ok;               /* it matched the contract's (or was not given) */
    bool padded;                   /* the case ran inside a bucket with hostile (NaN) padding */
    int64_t bad_nonfinite;         /* the engine's non-finite elements where the contract's are finite */
    const dsv4_tensor_info *weights;
    dsv4_sentinel sentinel;
    double weights_rtol;
    int64_t beyond;                /* the engine's elements beyond against the contract */
} dsv4_h_failure;

/*
 * Writes to out the class the failure fits: "likely NAME: WHAT (SOURCE); ..." when the engine's
 * output passes the check against the reference computed that way (or, for the classes seen in
 * the output's pattern, when the pattern holds), else "no known class fits". Best effort: an
 * error reading the case says so in out. Never fails the check's verdict.
 */
void dsv4_h_diagnose(const dsv4_h_failure *f, char *out, size_t size);

#endif
