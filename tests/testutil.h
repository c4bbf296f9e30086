/* Helpers shared by the Check suites. */
#ifndef DSV4MOE_TESTUTIL_H
#define DSV4MOE_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

#endif
