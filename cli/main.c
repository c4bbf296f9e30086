/* dsv4moe: the command-line tool. Exit status 0 ok, 1 check failed, 2 bad input. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dsv4moe/config.h"
#include "dsv4moe/files.h"

static int cmd_pending(const char *name, const char *what, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4moe %s ...\n\n%s\n\nThis subcommand is not part of the command line.\n", name, what);
            return EXIT_OK;
        }
    fprintf(stderr, "dsv4moe %s: not part of the command line: %s\n", name, what);
    return EXIT_BAD_INPUT;
}

typedef struct {
    const char *name;
    const char *summary;
    int (*fn)(int, char **);
} command;

static int cmd_bench(int c, char **v)
{
    return cmd_pending("bench",
                       "the benchmarks are programs of their own: `make bench` times the CPU backend against the "
                       "reference, `make bench-cuda` (on a GPU machine) the CUDA backend against its ceilings and "
                       "peers (docs/cuda-bench.md)",
                       c, v);
}

static const command commands[] = {
    {"gen", "write a deterministic synthetic layer and its input", cmd_gen},
    {"inspect", "list a checkpoint's tensors, dtypes, shapes and layout", cmd_inspect},
    {"ref", "run the deterministic reference layer", cmd_ref},
    {"plan", "print the execution plan or the refusal", cmd_plan},
    {"run", "run scenario matrices and write reports", cmd_run},
    {"diff", "compare two output files", cmd_diff},
    {"export", "write a matrix's cases as folders an outside engine runs", cmd_export},
    {"check", "hold an outside engine's outputs against exported cases", cmd_check},
    {"symmetry", "compare the collective traces of an engine's ranks", cmd_symmetry},
    {"bench", "time the backends", cmd_bench},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4moe <command> [options]   (dsv4moe <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  %-9s %s\n", "help", "this text; `help presets`, `help keys`");
    fprintf(f, "\nexit status: 0 ok, 1 a check failed, 2 bad input\n");
}

static int help(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "presets")) {
        for (const char *const *p = dsv4_config_preset_names(); *p; p++) {
            dsv4_config c;
            dsv4_config_preset(*p, &c, NULL);
            printf("%-14s H %-5lld I %-5lld E %-4lld K %lld  hash layers %lld of %lld  routed %s  shared %s\n", *p,
                   (long long)c.dim, (long long)c.moe_inter_dim, (long long)c.n_routed_experts,
                   (long long)c.n_activated, (long long)c.n_hash_layers, (long long)c.n_layers,
                   dsv4_weight_format_name(c.routed_format), dsv4_weight_format_name(c.shared_format));
        }
        return EXIT_OK;
    }
    if (argc > 1 && !strcmp(argv[1], "keys")) {
        dsv4_config c;
        dsv4_config_init(&c);
        for (const char *const *k = dsv4_config_keys(); *k; k++) {
            char v[64];
            dsv4_config_get(&c, *k, v, sizeof v, NULL);
            printf("%-18s %s\n", *k, v);
        }
        return EXIT_OK;
    }
    if (argc > 1) {
        fprintf(stderr, "dsv4moe help: no help topic '%s' (topics: presets, keys, or a command's --help)\n", argv[1]);
        return EXIT_BAD_INPUT;
    }
    usage(stdout);
    return EXIT_OK;
}

/* SIGINT/SIGTERM: remove the temporary files being written, then die of the signal as
 * before, so the caller sees the usual status and the destinations are as they were. */
static void on_signal(int sig)
{
    dsv4_files_remove_temporaries();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A file-size limit makes write(2) fail with EFBIG instead of killing the process,
     * so the writer removes its temporary and says why. */
    signal(SIGXFSZ, SIG_IGN);
}

/* A command whose output could not be written has not done its job: flush and check both
 * streams (`dsv4moe plan > /dev/full` must not exit 0). */
static int finish(int rc)
{
    int bad_out = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad_out) {
        bad_out = 1;
        e = errno;
    }
    if (bad_out) {
        fprintf(stderr, "dsv4moe: cannot write the standard output: %s\n", strerror(e));
        if (rc == EXIT_OK)
            rc = EXIT_BAD_INPUT;
    }
    if (fflush(stderr) != 0 || ferror(stderr)) {
        if (rc == EXIT_OK)
            rc = EXIT_BAD_INPUT;
    }
    return rc;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_BAD_INPUT;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help"))
        return help(argc - 1, argv + 1);
    if (!strcmp(name, "--version")) {
        printf("dsv4moe %s\n", DSV4_VERSION);
        return EXIT_OK;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv4moe: unknown command '%s'\n", name);
    usage(stderr);
    return EXIT_BAD_INPUT;
}

int main(int argc, char **argv)
{
    install_handlers();
    return finish(dispatch(argc, argv));
}
