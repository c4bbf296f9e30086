#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"

dsv4_status dsv4_write_file_atomic(const char *path, const char *data, size_t len, dsv4_error *err)
{
    static atomic_uint counter;
    size_t n = strlen(path) + 64;
    char *tmp = malloc(n);
    if (!tmp)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    snprintf(tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        dsv4_status st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    bool ok = fwrite(data, 1, len, f) == len;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    int saved = errno;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            saved = errno;
        unlink(tmp);
        free(tmp);
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot write: %s", strerror(saved));
    }
    free(tmp);
    return DSV4_OK;
}
