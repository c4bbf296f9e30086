/*
 * dsv4moe_harness/harness.h: the whole public API of libdsv4moe_harness in one include.
 *
 * libdsv4moe_harness is the test rig beside the production library (libdsv4moe, dsv4moe/dsv4moe.h):
 * scenario matrices (scenario.h), the runner and its reports (run.h), the comparison metrics of
 * SPEC.md section 7 and routing (compare.h), the export of cases for outside engines and the check
 * of their outputs (engines.h), and the symmetry of collective traces of real ranks (symmetry.h).
 * A server that embeds the fast path links libdsv4moe alone; the CLI and engines' CI link both:
 * `cc prog.c $(pkg-config --cflags --libs dsv4moe_harness)` (its .pc requires dsv4moe's).
 * ci/release-clean.sh checks that every header of this folder is included below.
 */
#ifndef DSV4MOE_HARNESS_HARNESS_H
#define DSV4MOE_HARNESS_HARNESS_H

#include "dsv4moe/dsv4moe.h" /* the production API the harness runs */
#include "dsv4moe_harness/compare.h"         /* metrics */
#include "dsv4moe_harness/scenario.h"        /* scenario files */
#include "dsv4moe_harness/run.h"             /* the scenario runner */
#include "dsv4moe_harness/symmetry.h"        /* collective traces of real ranks: the symmetry check */
#include "dsv4moe_harness/engines.h"         /* verifying another engine's MoE layer: exported cases, check */

#endif
