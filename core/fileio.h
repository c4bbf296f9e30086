/* Internal: writing whole files atomically. Not installed. */
#ifndef DSV4MOE_CORE_FILEIO_H
#define DSV4MOE_CORE_FILEIO_H

#include <stddef.h>
#include "dsv4moe/status.h"

/*
 * Writes data[0, len) to `path` through "<path>.tmp.<pid>.<n>", fsynced and renamed into place:
 * either the whole file appears or nothing does (the temporary file is removed on error).
 */
dsv4_status dsv4_write_file_atomic(const char *path, const char *data, size_t len, dsv4_error *err);

#endif
