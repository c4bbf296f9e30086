#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dsv4moe/status.h"
#include "err.h"

const char *dsv4_status_str(dsv4_status status)
{
    switch (status) {
    case DSV4_OK: return "ok";
    case DSV4_ERR_INVALID_ARG: return "invalid argument";
    case DSV4_ERR_CONFIG: return "bad configuration";
    case DSV4_ERR_IO: return "i/o error";
    case DSV4_ERR_FORMAT: return "malformed input";
    case DSV4_ERR_SHAPE: return "shape or dtype mismatch";
    case DSV4_ERR_RANGE: return "value out of range";
    case DSV4_ERR_NOMEM: return "out of memory";
    case DSV4_ERR_NOT_FOUND: return "not found";
    case DSV4_ERR_UNSUPPORTED: return "unsupported";
    case DSV4_ERR_REFUSED: return "refused by the planner";
    case DSV4_ERR_NUMERIC: return "non-finite value";
    case DSV4_ERR_DEVICE: return "device error";
    case DSV4_ERR_COMM: return "communication error";
    case DSV4_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void dsv4_error_clear(dsv4_error *err)
{
    if (!err)
        return;
    err->status = DSV4_OK;
    err->where[0] = '\0';
    err->message[0] = '\0';
}

dsv4_status dsv4_seterr(dsv4_error *err, dsv4_status st, const char *where, const char *fmt, ...)
{
    if (!err)
        return st;
    err->status = st;
    snprintf(err->where, sizeof err->where, "%s", where ? where : "");
    size_t n = 0;
    if (where && where[0]) {
        int w = snprintf(err->message, sizeof err->message, "%s: ", where);
        n = w < 0 ? 0 : (size_t)w;
        if (n >= sizeof err->message)
            n = sizeof err->message - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message + n, sizeof err->message - n, fmt, ap);
    va_end(ap);
    return st;
}
