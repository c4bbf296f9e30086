/* Internal: a growing NUL-terminated string (not installed): the planner's explanation, the
   scenario parser's case names, the harness's reports; and the joined name lists of the error
   messages. */
#ifndef DSV4MOE_CORE_STRBUF_H
#define DSV4MOE_CORE_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "dsv4moe/status.h"
#include "core/fileio.h"

/* Zero-initialise; s is NULL until the first append. After a failed allocation `oom` is set and
   later appends do nothing, so writers check once at the end. The owner frees s. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} dsv4_strbuf;

void dsv4_sb_put(dsv4_strbuf *b, const char *s, size_t n);
void dsv4_sb_str(dsv4_strbuf *b, const char *s);
/* The UTF-8 sequence at *p (a byte >= 0x80, before end): copied when well formed, else '?' for its
   first byte; *p moves past what was consumed. */
void dsv4_sb_utf8(dsv4_strbuf *b, const unsigned char **p, const unsigned char *end);
void dsv4_sb_printf(dsv4_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsv4_sb_vprintf(dsv4_strbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* The NULL-terminated `names` as "a, b, c" in buf (size bytes, cut to fit): the lists of allowed
   values in error messages. */
void dsv4_join_names(char *buf, size_t size, const char *const *names);
/* Writes the buffer to `path` atomically, or nothing when an append ran out of memory
   (DSV4_ERR_NOMEM naming path); frees the text either way. */
dsv4_status dsv4_sb_write_file(dsv4_strbuf *b, const char *path, dsv4_error *err);
/* Like dsv4_sb_write_file, but leaves the written temporary uncommitted in *o (see
   dsv4_out_commit_all); on error nothing exists. */
dsv4_status dsv4_sb_stage(dsv4_strbuf *b, const char *path, dsv4_outfile *o, dsv4_error *err);

#endif
