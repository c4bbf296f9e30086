/*
 * Internal to the scenario harness: one case's context, built once (plans, data, the reference's
 * output, the backend's outputs and measurements per rank, the ranks' traces), and the table of
 * checks run over it (harness/checks.c). Not an installed header.
 *
 * The build goes as far as the case's requested checks need and stops at the first stage that
 * cannot go on (a refused plan, data that cannot be generated, a backend that will not start):
 * `stage` says how far it got, `stop` what the checks it did not reach report. Each check decides
 * from what the context holds; a check the build never reached gets the stop's verdict. One rank and
 * several go the same way: one rank runs its plan's backend, several the distributed driver, and
 * both leave one dsv4_dist_rank record per rank.
 */
#ifndef DSV4MOE_HARNESS_CASE_H
#define DSV4MOE_HARNESS_CASE_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/ref.h"
#include "dsv4moe_harness/run.h"
#include "compare/results.h"

/* The clamp must be seen once a case has this many tokens (see docs/scenarios.md). */
#define DSV4_H_CLAMP_MIN_TOKENS 8
/* Tokens of the determinism check when rank 0 has none. */
#define DSV4_H_DETERMINISM_TOKENS 16
#define DSV4_H_MSG_MAX (DSV4_ERROR_MESSAGE_MAX + 256)

typedef enum {
    DSV4_H_NOTHING = 0, /* no plan table (out of memory) */
    DSV4_H_PLANNED,     /* every rank planned or one refused (refused, refusal) */
    DSV4_H_ACCEPTED,    /* accepted and expected to be: the planned memory is known */
    DSV4_H_REFERENCE,   /* data open, outputs allocated, the reference run on every rank (ref_ok) */
    DSV4_H_RUN_BEGUN,   /* a check needs the backend: its run was attempted or stopped before it */
    DSV4_H_RAN          /* the backend (one rank) or the driver (several) ran: ranks[] filled */
} dsv4_h_stage;

typedef struct {
    /* what the runner passes */
    const dsv4_run_options *o;
    const char *cache;
    int timeout_ms; /* the simulated communicator's deadlock timeout; 0: the driver's default */
    /* the case */
    const dsv4_scenario_case *sc;
    const dsv4_config *cfg;
    dsv4_topology topo; /* the case's, with options.backend applied */
    int world;
    unsigned req;
    int64_t H, K, all_rows;
    dsv4_h_stage stage;
    /* the stop: what the checks the build did not reach report (rest_set false: nothing) */
    bool rest_set;
    bool rest_unrun; /* the checks could not run here (no CUDA device, ...): the case is skipped, not passed */
    dsv4_result rest;
    char rest_detail[DSV4_H_MSG_MAX];
    /* verdicts the stopping stage decided itself (a loader or backend under test failing) */
    char stop_numerics[DSV4_H_MSG_MAX]; /* numerics fails with this detail when not empty */
    char stop_empty[DSV4_H_MSG_MAX];    /* empty: this detail, with stop_empty_result */
    dsv4_result stop_empty_result;
    bool stop_refusal_oom; /* refusal: error, out of memory */
    /* plans */
    dsv4_plan **plans;
    bool refused;
    char refusal[DSV4_ERROR_MESSAGE_MAX + 128];
    char planned_bad[512]; /* the first rank whose planned maximum exceeds the budget */
    /* data and the reference */
    dsv4_checkpoint *ck, *ckb; /* the reference's layer; the backend's copy (key checkpoint) or NULL */
    char ckwords[160];
    dsv4_st_file *in;
    const uint16_t *X;
    const int32_t *IDS;
    dsv4_ref *ref; /* at the run's threads (the bits do not depend on them) */
    int64_t *off;                      /* each rank's first token in the pool */
    uint16_t *y, *yr;                  /* backend, reference [all_rows, H], rank after rank */
    int32_t *ids_b, *ids_r;            /* [all_rows, K] */
    float *w_b, *w_r;                  /* [all_rows, K] */
    bool ref_ok;
    char ref_error[DSV4_H_MSG_MAX];
    dsv4_ref_stats ref_stats; /* summed over the ranks */
    /* the backend's run */
    bool cuda_missing;        /* one rank, a cuda plan, no device or no CUDA in this build */
    char cuda_why[160];       /* why (the memory check's planned half still holds) */
    dsv4_backend *be;         /* one rank */
    dsv4_plan *fallback_plan; /* one rank, a backend missing here: the reference's plan */
    bool self_compared;       /* one rank on the reference's own code with the reference's checkpoint: numerics
                                 has nothing between its two sides */
    dsv4_gemm_mode gemm;      /* the gemm mode of the plan that ran (one rank) */
    dsv4_backend_stats bs;    /* one rank: the backend's counters */
    char be_name[64];         /* one rank: the backend's name; several: the computing backend's */
    const char *note;         /* what stood in, for details ("" when nothing did) */
    dsv4_dist_options dopt;   /* several ranks */
    dsv4_dist_rank *ranks;    /* [world] after DSV4_H_RAN */
    dsv4_status run_status;   /* several ranks: the driver's result */
    char run_error[DSV4_ERROR_MESSAGE_MAX + 128];
    char trace_error[DSV4_H_MSG_MAX]; /* writing the traces of options.trace_dir failed */
} dsv4_h_case;

/* Builds the case's context as far as its checks need (stage, stop); fills c's requested checks,
   topology, ran_on and memory figures. */
void dsv4_h_case_build(dsv4_h_case *k, dsv4_case_result *c);
/* Frees what the build holds. */
void dsv4_h_case_release(dsv4_h_case *k);

/* Runs the check table over a built case, then the stop's verdicts, then the case's status. */
void dsv4_h_case_check(dsv4_h_case *k, dsv4_case_result *c);

/* The reference over [off, off + T) of the pool (the determinism check runs it again). */
dsv4_status dsv4_h_ref_run(dsv4_ref *ref, const dsv4_config *cfg, const uint16_t *x, const int32_t *ids, int64_t off,
                           int64_t T, uint16_t *y, int32_t *topk, float *w, dsv4_ref_stats *stats, dsv4_error *e);

#endif
