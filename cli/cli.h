/* The dsv4moe command line: shared helpers of the subcommands. */
#ifndef DSV4MOE_CLI_H
#define DSV4MOE_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/config.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/scenario.h"

/* Exit statuses of every subcommand. */
enum { EXIT_OK = 0, EXIT_CHECK_FAILED = 1, EXIT_BAD_INPUT = 2 };

/* Prints "dsv4moe <cmd>: <message>" to stderr; returns EXIT_BAD_INPUT. */
int cli_fail(const char *cmd, const dsv4_error *err);
int cli_failf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Collects the config options shared by every subcommand that builds a layer:
 * --preset P, --config FILE, --layer N, --set key=value (repeatable).
 * Returns 1 when argv[*i] was one of them (advancing *i past its value),
 * 0 when it was not, -1 on error (printed).
 */
typedef struct cli_config_opts {
    const char *preset;
    const char *config_file;
    const char *layer;
    const char *sets[64];
    int nsets;
} cli_config_opts;
int cli_config_arg(const char *cmd, int argc, char **argv, int *i, cli_config_opts *o);
/*
 * A subcommand's option loop: cli_next_arg walks argv from argv[1]. With co (the layer-building
 * commands: gen, ref, plan) it takes the config options (cli_config_arg) into *co on the way and
 * prints --help / -h as the format `help` given CLI_CONFIG_HELP; without, `help` as it is. It
 * returns true with the next argument for the caller in *opt: one of `flags` (no value; may be
 * NULL) with *val = NULL, or one of `value_opts` with its value in *val. With positional, the
 * operands (arguments that are not options, "-" included) are not returned but moved, in order,
 * to argv[1 .. nops] (as GNU getopt permutes argv: only slots already read are written), so a
 * command taking several files needs no list of its own to allocate and free on every error.
 * It returns false at the end, status then -1 after the last argument, else the command's exit
 * status (EXIT_OK after the help, EXIT_BAD_INPUT after a printed error: an unknown option or
 * unexpected argument, a missing value).
 */
typedef struct cli_args {
    const char *cmd;
    int argc;
    char **argv;
    cli_config_opts *co;
    const char *help;
    const char *const *flags, *const *value_opts;
    bool positional;
    int i;      /* the argument read last (0 before the first) */
    int nops;   /* with positional: the operands so far, at argv[1 .. nops] */
    int status; /* when cli_next_arg returned false: -1 or an exit status */
} cli_args;
bool cli_next_arg(cli_args *it, const char **opt, const char **val);
/* Builds and validates the config; returns EXIT_OK or prints and returns EXIT_BAD_INPUT. */
int cli_config_build(const char *cmd, const cli_config_opts *o, dsv4_config *cfg);
/* Where a config's dim came from and how to get another, for shape errors: "dim 4096 comes from the
   preset v4-flash, the default; the preset mini has dim 256: give --preset mini (or --set dim=256)". */
void cli_dim_hint(const cli_config_opts *o, const dsv4_config *cfg, int64_t want_dim, char *buf, size_t n);
extern const char CLI_CONFIG_HELP[];

/* Parses a whole decimal integer in [lo, hi]; prints and returns -1 on error. */
int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* Returns 0 when `arg` is one of the NULL-terminated `options`; else prints "unknown option"
   (or "unexpected argument") naming the command's --help and returns -1. */
int cli_known(const char *cmd, const char *arg, const char *const *options);
/* The value of --layout (gen, export): split or stacked; prints and returns -1 otherwise. */
int cli_parse_layout(const char *cmd, const char *s, dsv4_layout *out);
/* The value of export's --rounding: a comma-separated list of rounding profiles (SPEC.md section
   10) as a mask of 1u << dsv4_rounding; prints and returns -1 on an empty list or an unknown name. */
int cli_parse_roundings(const char *cmd, const char *s, unsigned *mask);
/* Loads every scenario file a finished option loop collected (args->argv[1 .. nops], the run and
   export operands) into *out (nops entries, free with cli_free_scenarios) before the command does
   anything with them, so that a malformed file is bad input before a case runs or a folder is
   written. Prints the first failure and returns EXIT_BAD_INPUT (*out NULL, nothing to free),
   else EXIT_OK. */
int cli_load_scenarios(const cli_args *args, dsv4_scenario ***out);
void cli_free_scenarios(dsv4_scenario **scns, int n);
/* check --catalogue (cli/check_catalogue.c): the engine command run clean and with each class of
   the catalogue in each profile of the mask, checked with opt; prints the table. An exit status. */
int cli_check_catalogue(const char *dir, const char *engine, const char *report, const dsv4_check_options *opt,
                        unsigned profiles);
/* Takes the value of option argv[*i]; prints and returns NULL when missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* Seconds on the monotonic clock (durations of the commands' steps). */
double cli_now(void);
/* A progress line on stderr for long work (a large layer's generation, an export), only on a
   terminal and unless quiet: "\r<what>: 42 % of 3.4 GB, 31 s left", at most five times a second;
   cli_progress_end clears it. cli_progress_bytes fits dsv4_gen_options.progress. */
typedef struct cli_progress {
    bool on;
    const char *what;
    double t0, last;
} cli_progress;
void cli_progress_start(cli_progress *p, const char *what, bool quiet);
void cli_progress_bytes(void *user, uint64_t done, uint64_t total);
void cli_progress_count(cli_progress *p, size_t done, size_t total, const char *item);
void cli_progress_end(cli_progress *p);

/* Prints, one line each to stderr, the folder entries the checkpoint left out and why. */
void cli_print_skipped(const char *cmd, const dsv4_checkpoint *ck);

/* `s` with control characters (C0, DEL, C1 as UTF-8) written as \xNN, into buf[0, n); returns buf. */
const char *cli_esc(const char *s, char *buf, size_t n);
/* "BF16 [8, 256]", or "missing" for NULL; returns buf. */
const char *cli_tensor_desc(const dsv4_tensor_info *t, char *buf, size_t n);

int cmd_gen(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_ref(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_symmetry(int argc, char **argv);

#endif
