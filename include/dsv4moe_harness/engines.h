/*
 * dsv4moe: verifying another engine's MoE layer (docs/engines.md).
 *
 * dsv4_export_scenario() writes the cases of a scenario matrix as self-contained folders
 * (the layer's checkpoint, the input, the reference's outputs at each rounding profile of
 * SPEC.md section 10 with their y_terms, and case.json); an engine runs each case and writes
 * output.safetensors; dsv4_check_engine() holds those outputs against the reference at the
 * engine's rounding profile by the outside-engine rule of section 10 and returns results that
 * the report writers of dsv4moe_harness/run.h take (report.json, junit.xml, report.html).
 */
#ifndef DSV4MOE_ENGINES_H
#define DSV4MOE_ENGINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/ref.h"
#include "dsv4moe_harness/run.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/scenario.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the exported folder format (case.json "version"); docs/engines.md. Version 2
   added the rounding profiles' expected files and y_terms; version 3 the padded cases (case.json
   "padded", input.safetensors' x_padded and input_ids_padded). check reads versions 2 and 3. */
#define DSV4_ENGINE_FORMAT_VERSION 3

typedef struct dsv4_export_options {
    uint32_t struct_size; /* sizeof(dsv4_export_options), set by init */
    dsv4_layout layout;   /* DSV4_LAYOUT_SPLIT (default: the official release's keys and formats) or
                             DSV4_LAYOUT_STACKED (HF transformers' keys with the "model." prefix, bf16;
                             the reference quantizes it at load as the case's formats say) */
    int threads;          /* the reference's threads (>= 1; the outputs do not depend on it); default 2 */
    const char *filter;   /* only cases whose name contains this substring; NULL: all */
    unsigned roundings;   /* the rounding profiles whose expected outputs are written, a mask of
                             1u << dsv4_rounding; spec's are always written (expected.safetensors).
                             0 (default): all three */
    /* Called after each case folder is placed with the folders done, the scenario's total and the
       case id (a long export's progress line). NULL: none. A caller built before these two fields
       passes their offset as struct_size and gets none. */
    void (*progress)(void *user, size_t done, size_t total, const char *case_id);
    void *progress_user;
} dsv4_export_options;

/* split layout, 2 threads, no filter, every rounding profile. NULL is a no-op. */
DSV4_API void dsv4_export_options_init(dsv4_export_options *opt);

/*
 * Writes every world-1 case of scn, and each rank of its multi-rank cases, that expects a pass
 * and whose config validates, as dir/<case-id>/ (created; an existing case folder is
 * overwritten file by file, each file atomically): model.safetensors, input.safetensors,
 * expected.safetensors (the spec profile) and expected.<profile>.safetensors for the other
 * profiles asked for (each: y, topk_ids, topk_weights, y_terms), case.json naming them. *written (may be NULL) gets the number of
 * folders written. Cases that expect a refusal or whose config is invalid are left out and
 * counted in *left_out (may be NULL).
 */
DSV4_API dsv4_status dsv4_export_scenario(const dsv4_scenario *scn, const char *dir, const dsv4_export_options *opt,
                                          size_t *written, size_t *left_out, dsv4_error *err);

/*
 * Checks, before anything is written, that the scenarios exported together into dir (as
 * dsv4_export_scenario would, one after the other) give every case a distinct case id: within a
 * scenario and across them, each id at most 200 characters, and no link or non-folder in a
 * case's place under dir. DSV4_ERR_FORMAT names both cases of a collision; nothing is written.
 */
DSV4_API dsv4_status dsv4_export_check_ids(const dsv4_scenario *const *scns, size_t n, const char *dir,
                                           const dsv4_export_options *opt, dsv4_error *err);

/* The folder name of a case (rank -1 for a world-1 case): the case name with '/' as "." and every
   character other than [A-Za-z0-9._=,+-] as '_', then ".rank<r>" for a rank. */
DSV4_API void dsv4_export_case_id(const char *case_name, int rank, char *buf, size_t size);

#define DSV4_CHECK_MAP_MAX 8

typedef struct dsv4_check_options {
    uint32_t struct_size;   /* sizeof(dsv4_check_options), set by init */
    dsv4_sentinel sentinel; /* how the engine marks a pruned slot in topk_ids (default E) */
    bool fp8_mma;           /* the engine accumulates on FP8 tensor cores: DSV4_TOL_OUTSIDE_FP8 (2 % beyond)
                               in place of DSV4_TOL_OUTSIDE (0.5 %) */
    int n_map;              /* tensor names of the engine: map_from[i] is read as map_to[i] ("y", "topk_ids",
                               "topk_weights") */
    const char *map_from[DSV4_CHECK_MAP_MAX];
    const char *map_to[DSV4_CHECK_MAP_MAX];
    dsv4_rounding rounding; /* the engine's rounding profile (SPEC.md section 10) where its output does not
                               name one in the metadata key "engine_rounding" (which wins); default spec */
    bool no_diagnose;       /* leave out the likely class of a failing case (its verdict line then ends at the
                               numbers): naming it runs the case's layer again once per class of the catalogue
                               (docs/engines.md), the reference's alternates of dsv4moe/ref.h */
} dsv4_check_options;

/* sentinel E, rule outside, no name map, rounding spec. NULL is a no-op. */
DSV4_API void dsv4_check_options_init(dsv4_check_options *opt);

/*
 * Checks an engine's outputs: for every case folder of cases_dir (a folder holding case.json),
 * outputs_dir/<case-id>/output.safetensors must hold y ([T, H], any float dtype: rounded to bf16
 * when it is not bf16) and may hold topk_ids (I32/I64 [T, k]) and topk_weights ([T, k]). The
 * numerics check of each case holds y against the case's expected outputs at the engine's
 * rounding profile (its output's "engine_rounding" metadata, else opt->rounding) by
 * DSV4_TOL_OUTSIDE (with fp8_mma DSV4_TOL_OUTSIDE_FP8), the beyond count taking the profile's
 * y_terms (ULP figures are reported, never judged), and, where the engine gave them, its
 * routing ids must match as sets per token and its weights by expert id. A case without an
 * output, with an unreadable or malformed one, an unknown engine_rounding, or a profile the case
 * was not exported with (or whose file or y_terms is missing or malformed) is a case with status
 * error naming the file and the rule. On success *results holds one case per folder (sorted by
 * id); a cases_dir that cannot be read, or holds no case, or a case.json that is malformed or of
 * another format version (version 1 folders predate y_terms: export them again), is an error of
 * the call (DSV4_ERR_IO / DSV4_ERR_FORMAT naming the file), *results then NULL.
 *
 * A failing case's verdict ends with the class it likely is, "likely NAME: what (where reported);
 * how it was seen", or "no known class fits" (unless opt->no_diagnose): the case's layer is
 * computed again in each known-wrong way of the catalogue below (dsv4_ref_set_alternates, or a
 * config change) and the output held to each with the same rule; the first it passes is named
 * (given the engine's routing, the ways that change the routing are tried only where it differs
 * from the contract's, the others only where it matches). Three classes are seen in the output's
 * pattern instead: a padded case's tokens' rows not finite (padding_leaks), scales read as values
 * (most elements more than 8 times the contract's) and one expert decoded wrong (every token with
 * an element beyond routed to one expert, at least half of its tokens). A memory check over its
 * bound names workspace_wrong_dim.
 */
DSV4_API dsv4_status dsv4_check_engine(const char *cases_dir, const char *outputs_dir, const dsv4_check_options *opt,
                                       dsv4_run_results **results, dsv4_error *err);

/*
 * Memory verdicts (docs/engines.md, "Memory"): an output may carry the engine's peak workspace for
 * the case as the metadata key "peak_workspace_bytes" (a decimal byte count). Each case.json
 * carries the contract's bound, memory.workspace_bound_bytes: the planner's figure for one eager
 * step of the case's tokens on this rank (dsv4_plan_workspace_bytes of the CUDA backend, the
 * scenario's topology and budget). An engine over DSV4_WORKSPACE_FACTOR times the bound fails the
 * case's memory check, the verdict naming both numbers; without the key no memory check is made.
 */
#define DSV4_WORKSPACE_FACTOR 2.0

/* One class of the catalogue: a way engines have computed the layer wrongly. */
typedef struct dsv4_check_class {
    const char *name;   /* the name verdicts give ("routed_clamp_dropped", ...) */
    const char *what;   /* one line */
    const char *source; /* where it was reported (an engine's issue number, SPEC.md section) */
    bool computed;      /* a wrong computation (an engine can carry it; `check --catalogue` runs each), not a
                           wrong declaration (rounding_profile: the engine rounds at another profile) */
} dsv4_check_class;

/* The catalogue, in the order check tries it: the count, and class i (NULL past the end). */
DSV4_API size_t dsv4_check_class_count(void);
DSV4_API const dsv4_check_class *dsv4_check_class_at(size_t i);

#ifdef __cplusplus
}
#endif
#endif
