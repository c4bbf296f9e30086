/* Helpers shared by the Check suites. */
#ifndef DSV4MOE_TESTUTIL_H
#define DSV4MOE_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* A scratch folder for this test binary ($DSV4MOE_TMP, created on demand). */
static inline const char *tu_tmpdir(void)
{
    const char *d = getenv("DSV4MOE_TMP");
    if (!d || !d[0])
        d = "/tmp/dsv4moe-tests";
    mkdir(d, 0755);
    return d;
}

/* Writes `tmpdir/name` into buf and returns buf. */
static inline char *tu_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tu_tmpdir(), name);
    return buf;
}

static inline int tu_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

static inline int tu_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Reads at most n - 1 bytes of `path` into buf, NUL-terminated; returns the bytes read, -1 if unreadable. */
static inline long tu_read_file(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = '\0';
    fclose(f);
    return (long)got;
}

/* The whole of `path` in a new buffer (NUL-terminated; its length in *n when n is not NULL), or
   NULL when it cannot be read. */
static inline unsigned char *tu_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *b = NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1)) &&
        fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[len] = '\0';
        if (n)
            *n = (size_t)len;
    }
    return b;
}

/* The source tree ($DSV4MOE_SRC, set by make test; "." otherwise). */
static inline const char *tu_src_dir(void)
{
    const char *s = getenv("DSV4MOE_SRC");
    return s && s[0] ? s : ".";
}

/*
 * Runs `$DSV4MOE_CLI ARGS` with stdout and stderr captured into out[0, n) (NUL-terminated);
 * `log` names the capture file in the scratch folder. Returns the exit status, -1 when the
 * command did not exit normally, -2 when DSV4MOE_CLI is not set (run through make test).
 */
static inline int tu_run_cli(const char *args, const char *log, char *out, size_t n)
{
    const char *cli = getenv("DSV4MOE_CLI");
    if (!cli)
        return -2;
    char path[512], cmd[8192];
    tu_path(path, sizeof path, log);
    if ((size_t)snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", cli, args, path) >= sizeof cmd)
        return -1;
    int rc = system(cmd);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(out, 1, n - 1, f) : 0;
    out[got] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/*
 * A layer and its reference output through the CLI: `dsv4moe gen CFG GEN --out DIR`, then
 * `dsv4moe ref CFG --weights DIR/model.safetensors --input DIR/input.safetensors --out DIR/OUT`
 * (CFG: the config options both take, GEN: gen's others). out[0, n) holds the output of the
 * last command run; returns 0, or the exit status of the one that failed (tu_run_cli's).
 */
static inline int tu_cli_gen_ref(const char *cfg, const char *gen, const char *dir, const char *out_name,
                                 const char *log, char *out, size_t n)
{
    char args[8192];
    if ((size_t)snprintf(args, sizeof args, "gen %s %s --out %s", cfg, gen, dir) >= sizeof args)
        return -1;
    int rc = tu_run_cli(args, log, out, n);
    if (rc)
        return rc;
    if ((size_t)snprintf(args, sizeof args, "ref %s --weights %s/model.safetensors --input %s/input.safetensors --out %s/%s",
                         cfg, dir, dir, dir, out_name) >= sizeof args)
        return -1;
    return tu_run_cli(args, log, out, n);
}

#endif
