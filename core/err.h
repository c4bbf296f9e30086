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

/*
 * Copies s into buf[0, n) with control characters (C0, DEL, and C1 encoded as UTF-8) written
 * as \xNN, so a name or value quoted in a message cannot drive a terminal; returns buf.
 * dsv4_seterr applies it to every message.
 */
#include <stddef.h>
const char *dsv4_escape_controls(const char *s, char *buf, size_t n);

#endif
