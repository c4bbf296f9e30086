#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/strbuf.h"
#include "core/err.h"
#include "core/grow.h"
#include "core/fileio.h"

void dsv4_sb_put(dsv4_strbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    char *ns = dsv4_grow(b->s, &b->cap, b->n + n + 1, 1, 4096);
    if (!ns) {
        b->oom = true;
        return;
    }
    b->s = ns;
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void dsv4_sb_str(dsv4_strbuf *b, const char *s) { dsv4_sb_put(b, s, strlen(s)); }

void dsv4_join_names(char *buf, size_t size, const char *const *names)
{
    buf[0] = '\0';
    for (const char *const *p = names; *p; p++) {
        if (p != names)
            strncat(buf, ", ", size - strlen(buf) - 1);
        strncat(buf, *p, size - strlen(buf) - 1);
    }
}

void dsv4_sb_utf8(dsv4_strbuf *b, const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    unsigned char ch = *p;
    int len = ch >= 0xf0 && ch < 0xf5 ? 4 : ch >= 0xe0 && ch < 0xf0 ? 3 : ch >= 0xc2 && ch < 0xe0 ? 2 : 0;
    bool ok = len > 0 && p + len <= end;
    for (int k = 1; ok && k < len; k++)
        ok = (p[k] & 0xc0) == 0x80;
    if (ok) {
        dsv4_sb_put(b, (const char *)p, (size_t)len);
        *pp = p + len;
    } else {
        dsv4_sb_put(b, "?", 1);
        *pp = p + 1;
    }
}

void dsv4_sb_vprintf(dsv4_strbuf *b, const char *fmt, va_list ap)
{
    char small[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        dsv4_sb_put(b, small, (size_t)n);
        return;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        b->oom = true;
        return;
    }
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    dsv4_sb_put(b, s, (size_t)n);
    free(s);
}

void dsv4_sb_printf(dsv4_strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dsv4_sb_vprintf(b, fmt, ap);
    va_end(ap);
}

dsv4_status dsv4_sb_stage(dsv4_strbuf *b, const char *path, dsv4_outfile *o, dsv4_error *err)
{
    dsv4_status st = b->oom ? dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory") : dsv4_out_begin(o, path, err);
    if (!st)
        st = dsv4_out_write(o, b->s, b->n, err);
    free(b->s);
    b->s = NULL;
    b->n = b->cap = 0;
    return st;
}

dsv4_status dsv4_sb_write_file(dsv4_strbuf *b, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_sb_stage(b, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}
