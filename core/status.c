#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dsv4moe/status.h"
#include "core/err.h"

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

const char *dsv4_escape_controls(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && o + 1 < n; p++) {
        bool c1 = p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F;
        if (*p < 0x20 || *p == 0x7F || c1) {
            if (o + 5 > n)
                break;
            snprintf(buf + o, n - o, "\\x%02x", (unsigned)(c1 ? p[1] : *p));
            o += 4;
            p += c1;
        } else {
            buf[o++] = (char)*p;
        }
    }
    buf[o] = '\0';
    return buf;
}

/* In place, cut to n - 1 bytes. */
static void escape_controls(char *s, size_t n)
{
    char tmp[DSV4_ERROR_MESSAGE_MAX];
    dsv4_escape_controls(s, tmp, sizeof tmp);
    snprintf(s, n, "%s", tmp);
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
    escape_controls(err->where, sizeof err->where);
    escape_controls(err->message, sizeof err->message);
    return st;
}
