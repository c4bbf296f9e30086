/*
 * dsv4moe.h: the whole public API of libdsv4moe, the production library, in one include. The
 * test rig (scenario matrices, the runner and its reports, metrics, export/check of outside
 * engines, symmetry of collective traces) is a second library, libdsv4moe_harness, with its
 * headers in dsv4moe_harness/ (dsv4moe_harness/harness.h includes them all).
 *
 * libdsv4moe runs one DeepSeek-V4 MoE layer: router, routed experts and the shared expert
 * (SPEC.md). A bit-reproducible reference ("ref"), a production CPU backend ("cpu", OpenBLAS
 * and per-instruction-set kernels) and, in a CUDA build, "cuda" execute a plan that the planner
 * made for a config, a topology and a memory budget. Every fallible call returns a dsv4_status
 * and fills a dsv4_error whose message names the place, the bad value and the rule; the library
 * never prints and never exits. Handles are opaque with paired create/free (free(NULL) is a
 * no-op); option structs carry struct_size and are filled by their _init function.
 *
 * A complete program (tests/test_example.c extracts the lines between the EXAMPLE markers,
 * compiles them against this header and the library, and runs them):
 *
 * EXAMPLE-BEGIN
 * #include <stdio.h>
 * #include <stdlib.h>
 * #include <dsv4moe/dsv4moe.h>
 *
 * // Reports a failed call: the status's short text and the message naming place, value, rule.
 * static int fail(const char *what, const dsv4_error *err)
 * {
 *     fprintf(stderr, "%s: %s: %s\n", what, dsv4_status_str(err->status), err->message);
 *     return 1;
 * }
 *
 * int main(int argc, char **argv)
 * {
 *     const char *path = argc > 1 ? argv[1] : "layer.safetensors";
 *     dsv4_error err;
 *
 *     // 1. The config: a preset (v4-flash, v4-pro, mini, ...) with one field set, validated.
 *     dsv4_config cfg;
 *     if (dsv4_config_preset("mini", &cfg, &err) != DSV4_OK)
 *         return fail("preset", &err);
 *     cfg.layer = 3; // layers below n_hash_layers route by token id instead of by score
 *     if (dsv4_config_validate(&cfg, &err) != DSV4_OK)
 *         return fail("config", &err);
 *
 *     // 2. A checkpoint: here a generated layer (a real one is opened the same way).
 *     dsv4_gen_options gen;
 *     dsv4_gen_options_init(&gen);
 *     if (dsv4_gen_weights(&cfg, &gen, path, &err) != DSV4_OK)
 *         return fail("generate", &err);
 *     dsv4_checkpoint *ckpt = NULL;
 *     if (dsv4_checkpoint_open(path, &ckpt, &err) != DSV4_OK)
 *         return fail("checkpoint", &err);
 *
 *     // 3. A plan for one rank on the CPU backend, up to 64 tokens per forward.
 *     dsv4_topology topo;
 *     dsv4_topology_init(&topo);
 *     topo.backend = DSV4_BACKEND_CPU;
 *     topo.max_tokens_per_rank = 64;
 *     dsv4_budget budget;
 *     dsv4_budget_init(&budget);
 *     dsv4_plan *plan = NULL;
 *     if (dsv4_plan_create(&cfg, &topo, &budget, &plan, &err) != DSV4_OK) {
 *         dsv4_checkpoint_close(ckpt);
 *         return fail("plan", &err);
 *     }
 *
 *     // 4. The backend executing the plan: 2 threads, the best kernels this CPU runs.
 *     dsv4_backend_options bopt;
 *     dsv4_backend_options_init(&bopt);
 *     bopt.threads = 2;
 *     dsv4_backend *be = NULL;
 *     int rc = 0;
 *     if (dsv4_backend_create_with(plan, ckpt, &bopt, &be, &err) != DSV4_OK) {
 *         rc = fail("backend", &err);
 *         goto done;
 *     }
 *
 *     // 5. One forward of T tokens: x is bf16 [T, dim]; y receives bf16 [T, dim].
 *     enum { T = 5 };
 *     uint16_t *x = calloc((size_t)(T * cfg.dim), sizeof *x);
 *     uint16_t *y = calloc((size_t)(T * cfg.dim), sizeof *y);
 *     int32_t *ids = calloc((size_t)(T * cfg.n_activated), sizeof *ids);
 *     if (!x || !y || !ids) {
 *         rc = 1;
 *         goto done_buffers;
 *     }
 *     for (int64_t i = 0; i < T * cfg.dim; i++)
 *         x[i] = (uint16_t)(0x3C00 + (i * 37) % 256); // bf16 values in [2^-7, 2^-5)
 *     dsv4_forward_out out = {y, ids, NULL, NULL}; // y required; the rest optional
 *     if (dsv4_backend_forward(be, T, x, NULL, &out, &err) != DSV4_OK) {
 *         rc = fail("forward", &err);
 *         goto done_buffers;
 *     }
 *     printf("backend %s, kernels %s: token 0 went to experts %d and %d, y[0] bits 0x%04x\n",
 *            dsv4_backend_name(be), dsv4_backend_kernels(be), ids[0], ids[1], y[0]);
 *
 *     // 6. Errors are values: more tokens than the plan allows is refused, nothing is written.
 *     if (dsv4_backend_forward(be, 1000, x, NULL, &out, &err) == DSV4_ERR_INVALID_ARG)
 *         printf("refused as expected: %s\n", err.message);
 *     else
 *         rc = 1;
 *
 * done_buffers:
 *     free(x);
 *     free(y);
 *     free(ids);
 * done:
 *     dsv4_backend_free(be); // NULL-safe, as every _free / _close
 *     dsv4_plan_free(plan);
 *     dsv4_checkpoint_close(ckpt);
 *     return rc;
 * }
 * EXAMPLE-END
 *
 * Build it with `cc -std=c11 example.c $(pkg-config --cflags --libs dsv4moe)` after
 * `make install`. The headers below document each part; docs/ says how the parts fit.
 * Two installed headers are not included here, as their functions are not in libdsv4moe
 * itself: comm_nccl.h (the NCCL communicator, built by `make nccl` into its own library) and
 * comm_devsim.h (the device sim communicator, in the CUDA variant only, `make cuda`).
 * ci/release-clean.sh checks that every other installed header is included below.
 */
#ifndef DSV4MOE_DSV4MOE_H
#define DSV4MOE_DSV4MOE_H

#include "dsv4moe/api.h"         /* DSV4_API: what the shared library exports */
#include "dsv4moe/status.h"      /* dsv4_status, dsv4_error */
#include "dsv4moe/dtype.h"       /* element types */
#include "dsv4moe/config.h"      /* dsv4_config: presets, validation */
#include "dsv4moe/rng.h"         /* the counter-based generator of the test data */
#include "dsv4moe/alloc.h"       /* accounting allocators */
#include "dsv4moe/safetensors.h" /* safetensors files, checkpoints */
#include "dsv4moe/formats.h"     /* fp4 / fp8 / bf16 conversions, act_quant */
#include "dsv4moe/weights.h"     /* weight views of a checkpoint */
#include "dsv4moe/gen.h"         /* generated layers and inputs */
#include "dsv4moe/ref.h"         /* the reference implementation */
#include "dsv4moe/plan.h"        /* the planner */
#include "dsv4moe/backend.h"     /* backends: ref, cpu, cuda */
#include "dsv4moe/comm.h"        /* communicators */
#include "dsv4moe/dist.h"        /* the distributed driver */
#include "dsv4moe/files.h"       /* interrupted writes: their temporary files and the sweep of them */

#endif
