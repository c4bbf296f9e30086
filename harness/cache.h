/*
 * Internal to the scenario harness: the data cache of the runner (generated layers and input pools,
 * keyed by what they depend on) and the backend's own copy of a layer (key `checkpoint`: the stacked
 * layout, shards through model.safetensors.index.json). Not an installed header.
 */
#ifndef DSV4MOE_HARNESS_CACHE_H
#define DSV4MOE_HARNESS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/scenario.h"
#include "dsv4moe/status.h"

/* Opens the cached weights of (cfg, seed) in `dir`, generating them when absent or unreadable, on
   `threads` threads (the bytes do not depend on them). */
dsv4_status dsv4_h_open_weights(const char *dir, const dsv4_config *cfg, uint64_t seed, int threads,
                                dsv4_checkpoint **ck, dsv4_error *err);
/* Opens the cached input pool of at least `tokens` tokens. */
dsv4_status dsv4_h_open_input(const char *dir, const dsv4_config *cfg, uint64_t seed, int64_t tokens,
                              dsv4_st_file **in, dsv4_error *err);

/* Whether the case's backend reads a copy of the layer of its own (stacked, or in several files). */
bool dsv4_h_custom_checkpoint(const dsv4_scenario_case *sc);
/* The copy in words, for check details. */
void dsv4_h_checkpoint_words(const dsv4_scenario_case *sc, char *buf, size_t n);
/* The path of the backend's copy of the layer (generated or written on demand into the cache): `src`
   the one file of its layout (what the reference reads), `out` the file or folder the backend loads;
   generated on `threads` threads. */
dsv4_status dsv4_h_backend_checkpoint_path(const char *dir, const dsv4_config *cfg, const dsv4_scenario_case *sc,
                                           int threads, char *src, size_t srcn, char *out, size_t outn,
                                           dsv4_error *err);

#endif
