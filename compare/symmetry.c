/*
 * Collective traces of real ranks (dsv4moe_harness/symmetry.h): the project's JSONL trace and PyTorch's
 * flight-recorder JSON dump, read into one form, and the per-group comparison across ranks.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/err.h"
#include "core/grow.h"
#include "core/fileio.h"
#include "dsv4moe_harness/symmetry.h"

#define TRACE_FORMAT "dsv4moe-trace"
/* A world of more ranks than any job runs is a malformed header, not a trace. */
#define TRACE_WORLD_MAX (1 << 20)
/* The largest trace read (a flight-recorder dump of a long job is tens of MB). */
#define TRACE_FILE_MAX ((size_t)512 << 20)

typedef struct {
    char group[64];
    uint64_t seq;
    char op[64];
    char dtype[96];
    uint64_t count;
    bool count_matters;
    bool has_tag;
    char tag[DSV4_COMM_TAG_MAX + 1];
    size_t pos; /* index in the file's collectives */
} tentry;

typedef struct {
    char name[64];
    int *ranks; /* NULL: membership unknown */
    size_t n;
} tgroup;

struct dsv4_trace {
    dsv4_trace_format fmt;
    int rank;
    int world; /* the JSONL header's world, -1 when not given (flight-recorder dumps) */
    char path[1024];
    tentry *e;
    size_t n, cap;
    tgroup *g;
    size_t ng;
};

void dsv4_trace_free(dsv4_trace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->ng; i++)
        free(t->g[i].ranks);
    free(t->g);
    free(t->e);
    free(t);
}

dsv4_trace_format dsv4_trace_format_of(const dsv4_trace *t) { return t ? t->fmt : DSV4_TRACE_JSONL; }
int dsv4_trace_rank(const dsv4_trace *t) { return t ? t->rank : -1; }
size_t dsv4_trace_count(const dsv4_trace *t) { return t ? t->n : 0; }

static tentry *push(dsv4_trace *t)
{
    tentry *ne = dsv4_grow(t->e, &t->cap, t->n + 1, sizeof *ne, 64);
    if (!ne)
        return NULL;
    t->e = ne;
    tentry *e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    e->pos = t->n++;
    return e;
}

static void copy_str(char *dst, size_t n, const char *s) { snprintf(dst, n, "%s", s ? s : ""); }

/* Whether the op's element count must agree across ranks. */
static bool count_must_agree(const char *op)
{
    return !strstr(op, "all_to_all") && !strstr(op, "alltoall") && !strstr(op, "barrier");
}

static dsv4_status load_jsonl(dsv4_trace *t, const char *text, dsv4_error *err)
{
    int line = 0;
    bool header = false;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        bool blank = true;
        for (size_t k = 0; k < len; k++)
            blank &= isspace((unsigned char)p[k]) != 0;
        if (!blank) {
            json_error_t je;
            json_t *o = json_loadb(p, len, 0, &je);
            if (!json_is_object(o)) {
                json_decref(o);
                return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path, "line %d: not a JSON object (%s)", line,
                                   o ? "another JSON value" : je.text);
            }
            if (!header) {
                json_t *f = json_object_get(o, "format"), *v = json_object_get(o, "version"),
                       *r = json_object_get(o, "rank"), *w = json_object_get(o, "world");
                bool ok = json_is_string(f) && !strcmp(json_string_value(f), TRACE_FORMAT) && json_is_integer(v) &&
                          json_integer_value(v) >= 1 && json_integer_value(v) <= DSV4_TRACE_FORMAT_VERSION &&
                          json_is_integer(r) && json_integer_value(r) >= 0 && json_integer_value(r) < TRACE_WORLD_MAX &&
                          (!w || (json_is_integer(w) && json_integer_value(w) >= 1 &&
                                  json_integer_value(w) <= TRACE_WORLD_MAX && json_integer_value(r) < json_integer_value(w)));
                if (ok) {
                    t->rank = (int)json_integer_value(r);
                    t->world = w ? (int)json_integer_value(w) : -1;
                } else {
                    json_decref(o);
                }
                if (!ok)
                    return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path,
                                       "line %d: the header must be {\"format\": \"%s\", \"version\": 1..%d, \"rank\": "
                                       "0 <= rank < world, \"world\": 1..%d, ...}",
                                       line, TRACE_FORMAT, DSV4_TRACE_FORMAT_VERSION, TRACE_WORLD_MAX);
                header = true;
            } else {
                json_t *seq = json_object_get(o, "seq"), *g = json_object_get(o, "group"), *op = json_object_get(o, "op"),
                       *dt = json_object_get(o, "dtype"), *cnt = json_object_get(o, "count"),
                       *tag = json_object_get(o, "tag");
                if (!json_is_integer(seq) || json_integer_value(seq) < 0 || !json_is_string(g) || !json_is_string(op) ||
                    !json_is_string(dt) || !json_is_integer(cnt) || json_integer_value(cnt) < 0 ||
                    (tag && !json_is_string(tag))) {
                    json_decref(o);
                    return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path,
                                       "line %d: a collective needs seq (>= 0), group, op, dtype (strings), count (>= 0) "
                                       "and an optional string tag",
                                       line);
                }
                tentry *e = push(t);
                if (!e) {
                    json_decref(o);
                    return dsv4_seterr(err, DSV4_ERR_NOMEM, t->path, "out of memory");
                }
                copy_str(e->group, sizeof e->group, json_string_value(g));
                e->seq = (uint64_t)json_integer_value(seq);
                copy_str(e->op, sizeof e->op, json_string_value(op));
                copy_str(e->dtype, sizeof e->dtype, json_string_value(dt));
                e->count = (uint64_t)json_integer_value(cnt);
                e->count_matters = count_must_agree(e->op);
                e->has_tag = true;
                copy_str(e->tag, sizeof e->tag, tag ? json_string_value(tag) : "");
            }
            json_decref(o);
        }
        p += len + (nl ? 1 : 0);
    }
    if (!header)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path, "empty trace: no header line");
    return DSV4_OK;
}

/* "[0, 1, 3]" into a rank list. */
static int *parse_ranks(const char *s, size_t *n)
{
    size_t cap = 8, k = 0;
    int *v = malloc(cap * sizeof *v);
    if (!v)
        return NULL;
    for (const char *p = s; *p;) {
        if (isdigit((unsigned char)*p)) {
            char *end;
            long r = strtol(p, &end, 10);
            int *nv = dsv4_grow(v, &cap, k + 1, sizeof *nv, 8);
            if (!nv) {
                free(v);
                return NULL;
            }
            v = nv;
            v[k++] = (int)r;
            p = end;
        } else {
            p++;
        }
    }
    *n = k;
    return v;
}

static dsv4_status load_flight(dsv4_trace *t, json_t *root, dsv4_error *err)
{
    json_t *entries = json_object_get(root, "entries"), *cfg = json_object_get(root, "pg_config");
    if (entries && !json_is_array(entries))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path, "flight recorder: \"entries\" is not an array");
    if (json_is_object(cfg)) {
        size_t ng = json_object_size(cfg);
        t->g = calloc(ng + 1, sizeof *t->g);
        if (!t->g)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, t->path, "out of memory");
        const char *key;
        json_t *v;
        json_object_foreach(cfg, key, v)
        {
            tgroup *g = &t->g[t->ng++];
            copy_str(g->name, sizeof g->name, key);
            json_t *r = json_object_get(v, "ranks");
            if (json_is_string(r) && !(g->ranks = parse_ranks(json_string_value(r), &g->n)))
                return dsv4_seterr(err, DSV4_ERR_NOMEM, t->path, "out of memory");
        }
    }
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        json_t *pg = json_object_get(e, "process_group"), *seq = json_object_get(e, "collective_seq_id"),
               *name = json_object_get(e, "profiling_name"), *sizes = json_object_get(e, "input_sizes"),
               *dts = json_object_get(e, "input_dtypes"), *p2p = json_object_get(e, "is_p2p");
        const char *pgname = json_is_array(pg) ? json_string_value(json_array_get(pg, 0)) : json_string_value(pg);
        if (!json_is_object(e) || !pgname || !json_is_integer(seq) || !json_is_string(name) ||
            !json_is_array(sizes) || !json_is_array(dts))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path,
                               "flight recorder entry %zu: needs process_group, collective_seq_id, profiling_name, "
                               "input_sizes and input_dtypes",
                               i);
        if (json_is_true(p2p))
            continue; /* send/recv pairs differ by design */
        tentry *te = push(t);
        if (!te)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, t->path, "out of memory");
        copy_str(te->group, sizeof te->group, pgname);
        te->seq = (uint64_t)json_integer_value(seq);
        copy_str(te->op, sizeof te->op, json_string_value(name));
        size_t k, len = 0;
        json_t *d;
        json_array_foreach(dts, k, d)
        {
            if (len < sizeof te->dtype)
                len += (size_t)snprintf(te->dtype + len, sizeof te->dtype - len, "%s%s", k ? "," : "",
                                        json_is_string(d) ? json_string_value(d) : "?");
        }
        json_t *sz;
        uint64_t total = 0;
        bool sizes_ok = true;
        json_array_foreach(sizes, k, sz)
        {
            uint64_t prod = 1;
            size_t q;
            json_t *dim;
            sizes_ok = sizes_ok && json_is_array(sz);
            json_array_foreach(sz, q, dim)
            {
                /* integers >= 0, and no product or sum past 64 bits: a wrap would equal another rank's 0 */
                json_int_t dv = json_is_integer(dim) ? json_integer_value(dim) : -1;
                if (dv < 0 || (dv && prod > UINT64_MAX / (uint64_t)dv)) {
                    sizes_ok = false;
                    break;
                }
                prod *= (uint64_t)dv;
            }
            if (!sizes_ok || total > UINT64_MAX - prod) {
                sizes_ok = false;
                break;
            }
            total += prod;
        }
        if (!sizes_ok)
            return dsv4_seterr(err, DSV4_ERR_FORMAT, t->path,
                               "entry %zu: input_sizes must be lists of integers >= 0 whose products and sum fit 64 "
                               "bits",
                               i);
        te->count = total;
        te->count_matters = count_must_agree(te->op);
    }
    return DSV4_OK;
}

/* The digits that end a file name (before an extension), or -1. */
static int rank_from_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    const char *end = dot && dot > base ? dot : base + strlen(base);
    const char *p = end;
    while (p > base && isdigit((unsigned char)p[-1]))
        p--;
    if (p == end || end - p > 6)
        return -1;
    return atoi(p);
}

dsv4_status dsv4_trace_load(const char *path, int fallback_rank, dsv4_trace **out, dsv4_error *err)
{
    if (!path || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "trace", "path and out must not be NULL");
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    /* a regular file of bounded size: /dev/zero or a FIFO named as a trace is refused, not read */
    dsv4_status rst = dsv4_read_small_file(path, TRACE_FILE_MAX, "a collective trace", &text, &len, err);
    if (rst)
        return rst;
    dsv4_trace *t = calloc(1, sizeof *t);
    if (!t) {
        free(text);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    copy_str(t->path, sizeof t->path, path);
    t->rank = -1;
    t->world = -1;
    dsv4_status st;
    /* A whole-file JSON object with "entries" or "pg_config" is a flight-recorder dump; else JSONL. */
    json_error_t je;
    json_t *root = memchr(text, '\0', len) ? NULL : json_loadb(text, len, 0, &je);
    if (json_is_object(root) && (json_object_get(root, "entries") || json_object_get(root, "pg_config"))) {
        t->fmt = DSV4_TRACE_FLIGHT_RECORDER;
        st = load_flight(t, root, err);
        int r = rank_from_name(path);
        t->rank = r >= 0 ? r : fallback_rank;
        if (!st && t->rank < 0)
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, path, "the flight-recorder dump's rank is unknown");
    } else {
        t->fmt = DSV4_TRACE_JSONL;
        st = len && !memchr(text, '\0', len) ? load_jsonl(t, text, err)
                                             : dsv4_seterr(err, DSV4_ERR_FORMAT, path, "empty or binary file: not a "
                                                                                       "trace");
    }
    json_decref(root);
    free(text);
    if (st) {
        dsv4_trace_free(t);
        return st;
    }
    *out = t;
    return DSV4_OK;
}

/* ---------------- comparison ---------------- */

/* A rank is in a group when its trace has entries there, or when its dump's pg_config lists it
   (a member that issued nothing in the group is the deadlock class, not a stranger). */
static bool member(const dsv4_trace *t, const char *group)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].group, group))
            return true;
    for (size_t i = 0; i < t->ng; i++)
        if (!strcmp(t->g[i].name, group))
            for (size_t k = 0; t->g[i].ranks && k < t->g[i].n; k++)
                if (t->g[i].ranks[k] == t->rank)
                    return true;
    return false;
}

/* The trace's entries of one group, in order (pointers into t->e). */
static size_t of_group(const dsv4_trace *t, const char *group, const tentry **v)
{
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].group, group))
            v[k++] = &t->e[i];
    return k;
}

static bool same_entry(const tentry *a, const tentry *b)
{
    if (a->seq != b->seq || strcmp(a->op, b->op) || strcmp(a->dtype, b->dtype))
        return false;
    if (a->count_matters && a->count != b->count)
        return false;
    return !(a->has_tag && b->has_tag && strcmp(a->tag, b->tag));
}

static void entry_words(const tentry *e, char *buf, size_t n)
{
    if (!e) {
        snprintf(buf, n, "(none: the rank issued no more collectives in this group)");
        return;
    }
    snprintf(buf, n, "%s seq %llu %s %s count %llu%s%s%s", e->group, (unsigned long long)e->seq, e->op, e->dtype,
             (unsigned long long)e->count, e->has_tag ? " '" : "", e->has_tag ? e->tag : "", e->has_tag ? "'" : "");
}

static int by_rank(const void *a, const void *b)
{
    int ra = (*(const dsv4_trace *const *)a)->rank, rb = (*(const dsv4_trace *const *)b)->rank;
    return (ra > rb) - (ra < rb);
}

dsv4_status dsv4_trace_symmetry(const dsv4_trace *const *traces, size_t n, dsv4_symmetry_result *out,
                                dsv4_error *err)
{
    if (!traces || !out || n < 2)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "symmetry", "at least two traces (ranks) are needed");
    memset(out, 0, sizeof *out);
    out->same = true;
    out->rank_a = out->rank_b = -1;
    const dsv4_trace **t = malloc(n * sizeof *t);
    size_t maxn = 0;
    if (!t)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "symmetry", "out of memory");
    for (size_t i = 0; i < n; i++) {
        t[i] = traces[i];
        if (!t[i] || t[i]->fmt != traces[0]->fmt) {
            free(t);
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "symmetry",
                               "trace %zu is missing or of another format than the first (JSONL and flight-recorder "
                               "dumps do not mix)",
                               i);
        }
        maxn = t[i]->n > maxn ? t[i]->n : maxn;
    }
    qsort(t, n, sizeof *t, by_rank);
    for (size_t i = 0; i < n; i++) /* one world for the comparison, every rank inside it */
        if (t[i]->world >= 0 && (t[i]->world != t[0]->world || (size_t)t[i]->world < n)) {
            dsv4_status st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "symmetry",
                                         "%s says world %d, %s world %d, for %zu traces: the traces of one step share "
                                         "one world at least as large as their number",
                                         t[0]->path, t[0]->world, t[i]->path, t[i]->world, n);
            free(t);
            return st;
        }
    for (size_t i = 1; i < n; i++)
        if (t[i]->rank == t[i - 1]->rank) {
            dsv4_status st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "symmetry", "%s and %s are both rank %d",
                                         t[i - 1]->path, t[i]->path, t[i]->rank);
            free(t);
            return st;
        }
    const tentry **va = malloc((maxn + 1) * sizeof *va), **vb = malloc((maxn + 1) * sizeof *vb);
    if (!va || !vb) {
        free(t), free(va), free(vb);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "symmetry", "out of memory");
    }
    size_t best_pos = SIZE_MAX, groups = 0;
    /* every group any trace names, in the order traces name them */
    const char **gn = malloc((n * maxn + 1) * sizeof *gn);
    if (!gn) {
        free(t), free(va), free(vb);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "symmetry", "out of memory");
    }
    for (size_t ti = 0; ti < n; ti++)
        for (size_t ei = 0; ei < t[ti]->n; ei++) {
            const char *g = t[ti]->e[ei].group;
            size_t q = 0;
            while (q < groups && strcmp(gn[q], g))
                q++;
            if (q == groups)
                gn[groups++] = g;
        }
    for (size_t gi = 0; gi < groups; gi++) {
        const char *g = gn[gi];
        {
            const dsv4_trace *ref = NULL;
            for (size_t r = 0; r < n; r++) {
                if (!member(t[r], g))
                    continue;
                if (!ref) {
                    ref = t[r];
                    continue;
                }
                size_t na = of_group(ref, g, va), nb = of_group(t[r], g, vb), ia = 0, ib = 0;
                if (ref->fmt == DSV4_TRACE_FLIGHT_RECORDER && na && nb) {
                    /* a ring buffer that wrapped: start both at the later first sequence number */
                    while (ia < na && va[ia]->seq < vb[0]->seq)
                        ia++;
                    while (ib < nb && vb[ib]->seq < va[0]->seq)
                        ib++;
                }
                size_t k = 0;
                while (ia + k < na && ib + k < nb && same_entry(va[ia + k], vb[ib + k]))
                    k++;
                out->compared += k;
                if (ia + k == na && ib + k == nb)
                    continue;
                const tentry *ea = ia + k < na ? va[ia + k] : NULL, *eb = ib + k < nb ? vb[ib + k] : NULL;
                size_t pos = ea && eb ? (ea->pos < eb->pos ? ea->pos : eb->pos) : ea ? ea->pos : eb->pos;
                if (pos >= best_pos)
                    continue;
                best_pos = pos;
                out->same = false;
                out->rank_a = ref->rank;
                out->rank_b = t[r]->rank;
                char wa[400], wb[400];
                entry_words(ea, wa, sizeof wa);
                entry_words(eb, wb, sizeof wb);
                snprintf(out->detail, sizeof out->detail,
                         "group '%s', collective #%zu of the group: rank %d [%.300s] vs rank %d [%.300s] (rank %d issued %zu in "
                         "the group, rank %d %zu; files %.200s, %.200s)",
                         g, k, ref->rank, wa, t[r]->rank, wb, ref->rank, na - ia, t[r]->rank, nb - ib, ref->path,
                         t[r]->path);
            }
        }
    }
    if (out->same)
        snprintf(out->detail, sizeof out->detail, "%zu ranks issued the same collectives: %zu compared in %zu groups",
                 n, out->compared, groups);
    free(gn);
    free(t), free(va), free(vb);
    return DSV4_OK;
}

dsv4_status dsv4_trace_write_jsonl(const dsv4_coll_record *records, size_t n, int rank, int world, const char *path,
                                   dsv4_error *err)
{
    if ((!records && n) || !path || rank < 0 || world < 1 || rank >= world)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "trace", "records, a path and 0 <= rank < world are needed");
    json_t *h = json_pack("{s:s, s:i, s:i, s:i}", "format", TRACE_FORMAT, "version", DSV4_TRACE_FORMAT_VERSION, "rank",
                          rank, "world", world);
    char *text = h ? json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(h);
    size_t len = text ? strlen(text) : 0, cap = len + 2;
    char *buf = text ? malloc(cap) : NULL;
    if (buf) {
        memcpy(buf, text, len);
        buf[len++] = '\n';
    }
    free(text);
    for (size_t i = 0; buf && i < n; i++) {
        const dsv4_coll_record *r = &records[i];
        char hash[24], tag[DSV4_COMM_TAG_MAX + 1];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->counts_hash);
        snprintf(tag, sizeof tag, "%.*s", DSV4_COMM_TAG_MAX, r->tag);
        json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:I, s:s, s:s}", "seq", (json_int_t)r->seq, "group",
                              dsv4_group_name(r->group), "op", dsv4_coll_op_name(r->op), "dtype",
                              dsv4_dtype_name(r->dtype), "count", (json_int_t)r->count, "counts_hash", hash, "tag", tag);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        size_t ll = line ? strlen(line) : 0;
        char *nb = line ? realloc(buf, len + ll + 2) : NULL;
        if (!nb) {
            free(line);
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        memcpy(buf + len, line, ll);
        len += ll;
        buf[len++] = '\n';
        free(line);
    }
    if (!buf)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory while building the trace");
    dsv4_status st = dsv4_write_file_atomic(path, buf, len, err);
    free(buf);
    return st;
}
