/* Internal: filling a dsv4_error. Not installed. */
#ifndef DSV4MOE_CORE_ERR_H
#define DSV4MOE_CORE_ERR_H

#include "dsv4moe/status.h"

/*
 * Sets err (when non-NULL) to status st with where = `where` (may be NULL or
 * "") and message = "<where>: <formatted text>". Returns st, so callers can
 * write `return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "...", ...);`.
 */
dsv4_status dsv4_seterr(dsv4_error *err, dsv4_status st, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
