/*
 * safetensors reader and writer (multi-file checkpoints: core/checkpoint.c).
 *
 * File format: an 8-byte little-endian header length N, N bytes of UTF-8
 * JSON (an object: tensor name -> {dtype, shape, data_offsets}, plus an
 * optional "__metadata__" string map), then the data section. The rules
 * checked here follow the reference Rust implementation (huggingface/
 * safetensors): offsets are relative to the data section, and the tensors,
 * sorted by offset, must tile it exactly: no overlap, no gap, nothing left.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4moe/safetensors.h"
#include "core/err.h"
#include "core/grow.h"
#include "core/hash.h"
#include "core/fileio.h"
#include "core/st_int.h"

/* ---------------- dtypes ---------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_table[DSV4_DTYPE_COUNT] = {
    [DSV4_DTYPE_BOOL] = {"BOOL", 1},       [DSV4_DTYPE_U8] = {"U8", 1},
    [DSV4_DTYPE_I8] = {"I8", 1},           [DSV4_DTYPE_U16] = {"U16", 2},
    [DSV4_DTYPE_I16] = {"I16", 2},         [DSV4_DTYPE_F16] = {"F16", 2},
    [DSV4_DTYPE_BF16] = {"BF16", 2},       [DSV4_DTYPE_U32] = {"U32", 4},
    [DSV4_DTYPE_I32] = {"I32", 4},         [DSV4_DTYPE_F32] = {"F32", 4},
    [DSV4_DTYPE_U64] = {"U64", 8},         [DSV4_DTYPE_I64] = {"I64", 8},
    [DSV4_DTYPE_F64] = {"F64", 8},         [DSV4_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DSV4_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [DSV4_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
};

const char *dsv4_dtype_name(dsv4_dtype dtype)
{
    return (unsigned)dtype < DSV4_DTYPE_COUNT ? dtype_table[dtype].name : "?";
}

size_t dsv4_dtype_size(dsv4_dtype dtype)
{
    return (unsigned)dtype < DSV4_DTYPE_COUNT ? dtype_table[dtype].size : 0;
}

dsv4_status dsv4_dtype_parse(const char *name, dsv4_dtype *out)
{
    if (!name || !out)
        return DSV4_ERR_INVALID_ARG;
    for (int i = 0; i < DSV4_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (dsv4_dtype)i;
            return DSV4_OK;
        }
    return DSV4_ERR_FORMAT;
}

const char *dsv4_layout_name(dsv4_layout layout)
{
    switch (layout) {
    case DSV4_LAYOUT_SPLIT: return "split";
    case DSV4_LAYOUT_STACKED: return "stacked";
    case DSV4_LAYOUT_UNKNOWN: break;
    }
    return "unknown";
}

/* ---------------- helpers ---------------- */

/* The XSI strerror_r (we build without _GNU_SOURCE): strerror is not thread-safe. */
const char *dsv4_sti_errstr(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0)
        snprintf(buf, n, "error %d", e);
    return buf;
}


const char *dsv4_sti_twhere(where_buf *w, const char *path, const char *key)
{
    snprintf(w->s, sizeof w->s, "%s: tensor '%s'", path, key);
    return w->s;
}

const char *dsv4_sti_jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value of unknown type";
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim)
{
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

/* numel and nbytes of a shape, false on 64-bit overflow (*which says of which). */
static bool shape_size(dsv4_dtype dt, const int64_t *shape, int ndim, uint64_t *numel, uint64_t *nbytes,
                       const char **which)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) {
            *which = "element count";
            return false;
        }
    *numel = n;
    if (__builtin_mul_overflow(n, (uint64_t)dsv4_dtype_size(dt), nbytes)) {
        *which = "size in bytes";
        return false;
    }
    return true;
}

bool dsv4_sti_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* dir + "/" + name, without doubling a trailing '/'. */
char *dsv4_sti_join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + slash + b + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    if (slash)
        p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

int dsv4_sti_cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ---------------- reader ---------------- */


void dsv4_st_close(dsv4_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free((char *)f->tensors[i].name);
    for (size_t i = 0; i < 2 * f->n_meta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->tensors);
    free(f->by_name);
    free(f->loaded);
    if (f->map)
        munmap(f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    if (f->mu_init)
        pthread_mutex_destroy(&f->mu);
    free(f->path);
    free(f);
}

const char *dsv4_st_path(const dsv4_st_file *f) { return f ? f->path : NULL; }
size_t dsv4_st_count(const dsv4_st_file *f) { return f ? f->n : 0; }

const dsv4_tensor_info *dsv4_st_tensor(const dsv4_st_file *f, size_t index)
{
    return f && index < f->n ? &f->tensors[index] : NULL;
}

int dsv4_sti_cmp_info_name(const void *a, const void *b)
{
    const dsv4_tensor_info *x = *(const dsv4_tensor_info *const *)a, *y = *(const dsv4_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

const dsv4_tensor_info *dsv4_sti_find_sorted(const dsv4_tensor_info *const *v, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v[mid]->name, name);
        if (c == 0)
            return v[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const dsv4_tensor_info *dsv4_st_find(const dsv4_st_file *f, const char *name)
{
    return f && name ? dsv4_sti_find_sorted(f->by_name, f->n, name) : NULL;
}

const char *dsv4_st_metadata(const dsv4_st_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}

/* A non-negative JSON integer, or a message in `why`. */
static bool json_uint(const json_t *v, uint64_t *out, char *why, size_t n)
{
    if (!json_is_integer(v)) {
        snprintf(why, n, "is %s, not an integer", dsv4_sti_jtype(v));
        return false;
    }
    json_int_t x = json_integer_value(v);
    if (x < 0) {
        snprintf(why, n, "is %lld, which is negative", (long long)x);
        return false;
    }
    *out = (uint64_t)x;
    return true;
}

static dsv4_status parse_metadata(dsv4_st_file *f, const json_t *m, dsv4_error *err)
{
    if (!json_is_object(m))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, f->path, "__metadata__ is %s, not an object of strings",
                           dsv4_sti_jtype(m));
    size_t n = json_object_size(m);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, f->path, "out of memory for %zu metadata entries", n);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, f->path,
                               "__metadata__ value of '%s' is %s, not a string (metadata is a string map)", k,
                               dsv4_sti_jtype(v));
        char *ks = strdup(k), *vs = strdup(json_string_value(v));
        f->meta[2 * f->n_meta] = ks;
        f->meta[2 * f->n_meta + 1] = vs;
        f->n_meta++; /* both are freed by dsv4_st_close, NULL or not */
        if (!ks || !vs)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, f->path, "out of memory");
    }
    return DSV4_OK;
}

/* Validates one header entry into t (name already set); data_size bounds it. */
static dsv4_status parse_entry(const char *path, const char *key, const json_t *e, uint64_t data_size,
                               dsv4_tensor_info *t, dsv4_error *err)
{
    where_buf wb;
    const char *w = dsv4_sti_twhere(&wb, path, key);
    char why[160], shp[256];
    if (!json_is_object(e))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "entry is %s, not an object with dtype, shape and data_offsets",
                           dsv4_sti_jtype(e));
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)e, k, v) {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, w,
                               "unknown key '%s' in the entry (allowed: dtype, shape, data_offsets)", k);
    }
    const json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
                 *of = json_object_get(e, "data_offsets");
    if (!dt || !sh || !of)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "entry lacks '%s' (dtype, shape and data_offsets are required)",
                           !dt ? "dtype" : !sh ? "shape" : "data_offsets");

    if (!json_is_string(dt))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "dtype is %s, not a string", dsv4_sti_jtype(dt));
    if (dsv4_dtype_parse(json_string_value(dt), &t->dtype))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "unknown dtype '%s'", json_string_value(dt));

    if (!json_is_array(sh))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "shape is %s, not an array of integers", dsv4_sti_jtype(sh));
    size_t nd = json_array_size(sh);
    if (nd > DSV4_MAX_DIMS)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "shape has %zu dimensions, more than the limit of %d", nd,
                           DSV4_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_uint(json_array_get(sh, i), &d, why, sizeof why))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "shape[%zu] %s (dimensions are integers >= 0)", i, why);
        t->shape[i] = (int64_t)d;
    }
    const char *which = "";
    if (!shape_size(t->dtype, t->shape, t->ndim, &t->numel, &t->nbytes, &which)) {
        shape_str(shp, sizeof shp, t->shape, t->ndim);
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "%s of %s %s overflows 64 bits", which,
                           dsv4_dtype_name(t->dtype), shp);
    }

    if (!json_is_array(of))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "data_offsets is %s, not an array [begin, end]", dsv4_sti_jtype(of));
    if (json_array_size(of) != 2)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "data_offsets has %zu entries, not 2 [begin, end]",
                           json_array_size(of));
    uint64_t be[2];
    for (size_t i = 0; i < 2; i++)
        if (!json_uint(json_array_get(of, i), &be[i], why, sizeof why))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "data_offsets[%zu] %s (offsets are integers >= 0)", i, why);
    if (be[0] > be[1])
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w, "data_offsets [%llu, %llu]: begin is after end",
                           (unsigned long long)be[0], (unsigned long long)be[1]);
    if (be[1] - be[0] != t->nbytes) {
        shape_str(shp, sizeof shp, t->shape, t->ndim);
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w,
                           "data_offsets [%llu, %llu] span %llu bytes, but %s %s needs %llu",
                           (unsigned long long)be[0], (unsigned long long)be[1], (unsigned long long)(be[1] - be[0]),
                           dsv4_dtype_name(t->dtype), shp, (unsigned long long)t->nbytes);
    }
    if (be[1] > data_size)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, w,
                           "data_offsets [%llu, %llu] run past the end of the %llu-byte data section "
                           "(file truncated?)",
                           (unsigned long long)be[0], (unsigned long long)be[1], (unsigned long long)data_size);
    t->offset = be[0];
    return DSV4_OK;
}

/* Data order: offset, then end (so empty tensors come before a non-empty one
 * at the same offset, as in the Rust sort by (begin, end)), then name. */
static int cmp_info_offset(const void *a, const void *b)
{
    const dsv4_tensor_info *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The sorted tensors must tile [0, data_size) exactly. */
static dsv4_status check_tiling(const dsv4_st_file *f, uint64_t data_size, dsv4_error *err)
{
    where_buf wb;
    uint64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        const dsv4_tensor_info *t = &f->tensors[i];
        uint64_t end = t->offset + t->nbytes;
        if (t->offset < pos) {
            const dsv4_tensor_info *p = &f->tensors[i - 1];
            return dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, f->path, t->name),
                               "data_offsets [%llu, %llu] overlap tensor '%s' at [%llu, %llu] "
                               "(tensors must not overlap)",
                               (unsigned long long)t->offset, (unsigned long long)end, p->name,
                               (unsigned long long)p->offset, (unsigned long long)(p->offset + p->nbytes));
        }
        if (t->offset > pos)
            return dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, f->path, t->name),
                               "data_offsets [%llu, %llu] leave a gap: bytes [%llu, %llu) of the data section "
                               "belong to no tensor (tensors must be contiguous)",
                               (unsigned long long)t->offset, (unsigned long long)end, (unsigned long long)pos,
                               (unsigned long long)t->offset);
        pos = end;
    }
    if (pos != data_size)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, f->path,
                           "bytes [%llu, %llu) at the end of the data section belong to no tensor "
                           "(the tensors must cover the whole data section)",
                           (unsigned long long)pos, (unsigned long long)data_size);
    return DSV4_OK;
}

/* Parses the header hdr[0, hlen) of a file whose data section holds data_size bytes. */
static dsv4_status parse_header(dsv4_st_file *f, const unsigned char *hdr, uint64_t hlen, uint64_t data_size,
                                dsv4_error *err)
{
    json_error_t je;
    json_t *root = json_loadb((const char *)hdr, (size_t)hlen, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, f->path,
                           "header is not valid JSON: %s at line %d, column %d (byte %d of the header)", je.text,
                           je.line, je.column, je.position);
    dsv4_status st = DSV4_OK;
    if (!json_is_object(root)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, f->path, "header is %s, not a JSON object", dsv4_sti_jtype(root));
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n + 1, sizeof *f->tensors);
    f->by_name = calloc(n + 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, f->path, "out of memory for %zu tensors", n);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = parse_metadata(f, v, err)))
                goto done;
            continue;
        }
        if (!key[0]) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, f->path, "a tensor has an empty name");
            goto done;
        }
        dsv4_tensor_info *t = &f->tensors[f->n];
        if (!(t->name = strdup(key))) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, f->path, "out of memory");
            goto done;
        }
        f->n++; /* from here on the name belongs to f */
        if ((st = parse_entry(f->path, key, v, data_size, t, err)))
            goto done;
        t->file = f->path;
    }
    qsort(f->tensors, f->n, sizeof *f->tensors, cmp_info_offset);
    if ((st = check_tiling(f, data_size, err)))
        goto done;
    const unsigned char *data = f->map;
    for (size_t i = 0; i < f->n; i++) {
        f->tensors[i].data = data + f->tensors[i].offset;
        f->by_name[i] = &f->tensors[i];
    }
    qsort(f->by_name, f->n, sizeof *f->by_name, dsv4_sti_cmp_info_name);
done:
    json_decref(root);
    return st;
}

/* pread of n bytes at off: 0, an errno, or -1 when the file ended first. */
static int pread_all(int fd, void *buf, uint64_t n, uint64_t off)
{
    unsigned char *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno;
        if (r == 0)
            return -1;
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Whether the open file still has the size and modification time it had at open. */
static dsv4_status same_file(const dsv4_st_file *f, dsv4_error *err)
{
    char eb[128];
    struct stat sb;
    if (fstat(f->fd, &sb) != 0)
        return dsv4_seterr(err, DSV4_ERR_IO, f->path, "cannot stat: %s", dsv4_sti_errstr(errno, eb, sizeof eb));
    if (sb.st_size != f->id.st_size || sb.st_mtim.tv_sec != f->id.st_mtim.tv_sec ||
        sb.st_mtim.tv_nsec != f->id.st_mtim.tv_nsec)
        return dsv4_seterr(err, DSV4_ERR_IO, f->path,
                           "the file changed after it was opened (%lld bytes then, %lld now); "
                           "a checkpoint must not be rewritten while it is read",
                           (long long)f->id.st_size, (long long)sb.st_size);
    return DSV4_OK;
}

/* Reads bytes [off, off + n) of the data section into place (the caller holds f->mu or owns f). */
static dsv4_status read_data(dsv4_st_file *f, uint64_t off, uint64_t n, const char *key, dsv4_error *err)
{
    char eb[128];
    where_buf wb;
    const char *where = key ? dsv4_sti_twhere(&wb, f->path, key) : f->path;
    dsv4_status st = same_file(f, err);
    if (st)
        return st;
    int e = pread_all(f->fd, (unsigned char *)f->map + off, n, f->data_start + off);
    if (e < 0)
        return dsv4_seterr(err, DSV4_ERR_IO, where,
                           "the file ended before byte %llu (truncated while being read?)",
                           (unsigned long long)(f->data_start + off + n));
    if (e)
        return dsv4_seterr(err, DSV4_ERR_IO, where, "cannot read: %s", dsv4_sti_errstr(e, eb, sizeof eb));
    return same_file(f, err);
}

/* Makes the data of f->tensors[i] readable: read on first use, under the file's lock. */
dsv4_status dsv4_sti_load_tensor(dsv4_st_file *f, size_t i, dsv4_error *err)
{
    if (!f->loaded)
        return DSV4_OK; /* read whole at open */
    pthread_mutex_lock(&f->mu);
    dsv4_status st = DSV4_OK;
    if (!f->loaded[i]) {
        const dsv4_tensor_info *t = &f->tensors[i];
        st = read_data(f, t->offset, t->nbytes, t->name, err);
        f->loaded[i] = st == DSV4_OK;
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

/* Opens and validates; `lazy`: tensors are read on first use (checkpoints), else all now. */
dsv4_status dsv4_sti_st_open(const char *path, bool lazy, dsv4_st_file **out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_st_open", "out must not be NULL");
    *out = NULL;
    if (!path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_st_open", "path must not be NULL");
    char eb[128];
    dsv4_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    f->fd = -1;
    dsv4_status st = DSV4_OK;
    unsigned char *hdr = NULL;
    /* O_NONBLOCK: opening a FIFO must not hang before fstat can refuse it;
     * it changes nothing for a regular file. */
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open: %s", dsv4_sti_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot stat: %s", dsv4_sti_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "not a regular file");
        goto fail;
    }
    f->id = sb;
    if (sb.st_size < 8) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                         "file is %lld bytes, shorter than the 8-byte header length that starts a safetensors file",
                         (long long)sb.st_size);
        goto fail;
    }
    uint64_t fsize = (uint64_t)sb.st_size, hlen = 0;
    unsigned char h8[8];
    int e = pread_all(f->fd, h8, 8, 0);
    if (e) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot read the header length: %s",
                         e < 0 ? "the file ended" : dsv4_sti_errstr(e, eb, sizeof eb));
        goto fail;
    }
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | h8[i];
    if (hlen == 0) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "header length is 0 (the header must be a JSON object)");
        goto fail;
    }
    if (hlen > DSV4_ST_MAX_HEADER) {
        /* Text where the length should be (an index or config named as a weights file) makes an
           absurd length; say what the bytes look like rather than only the number. */
        bool text = true;
        for (int i = 0; i < 8; i++)
            text &= h8[i] >= 0x20 && h8[i] < 0x7F;
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "header length %llu exceeds the limit of %u bytes%s%.8s%s",
                         (unsigned long long)hlen, DSV4_ST_MAX_HEADER,
                         text ? " (the file starts with the text '" : "", text ? (const char *)h8 : "",
                         text ? "': not a safetensors file?)" : "");
        goto fail;
    }
    if (hlen > fsize - 8) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "header length %llu exceeds file size %llu (truncated?)",
                         (unsigned long long)hlen, (unsigned long long)fsize);
        goto fail;
    }
    uint64_t data_size = fsize - 8 - hlen;
    if (data_size > SIZE_MAX - 1) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "data section of %llu bytes cannot be held in memory",
                         (unsigned long long)data_size);
        goto fail;
    }
    if (!(hdr = malloc((size_t)hlen))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory for a header of %llu bytes",
                         (unsigned long long)hlen);
        goto fail;
    }
    if ((e = pread_all(f->fd, hdr, hlen, 8))) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot read the header: %s",
                         e < 0 ? "the file ended" : dsv4_sti_errstr(e, eb, sizeof eb));
        goto fail;
    }
    f->data_start = 8 + hlen;
    f->map_len = data_size ? (size_t)data_size : 1;
    void *map = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        f->map_len = 0;
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot reserve %llu bytes for the data: %s",
                         (unsigned long long)data_size, dsv4_sti_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    f->map = map;
#ifdef MADV_HUGEPAGE
    /* Large pages where the kernel has them: reading GBs of weights into 4 KiB pages spends
     * most of the load time faulting them in. Advice only; failure changes nothing. */
    if (f->map_len >= ((size_t)2 << 20))
        madvise(map, f->map_len, MADV_HUGEPAGE);
#endif
    if ((st = parse_header(f, hdr, hlen, data_size, err)))
        goto fail;
    free(hdr);
    hdr = NULL;
    if (!lazy || f->n == 0) {
        if ((st = read_data(f, 0, data_size, NULL, err)))
            goto fail;
        close(f->fd);
        f->fd = -1;
    } else {
        if (!(f->loaded = calloc(f->n, sizeof *f->loaded))) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
            goto fail;
        }
        if (pthread_mutex_init(&f->mu, NULL) != 0) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot create a lock");
            goto fail;
        }
        f->mu_init = true;
    }
    *out = f;
    return DSV4_OK;
fail:
    free(hdr);
    dsv4_st_close(f);
    return st;
}

dsv4_status dsv4_st_open(const char *path, dsv4_st_file **out, dsv4_error *err)
{
    return dsv4_sti_st_open(path, false, out, err);
}

/* ---------------- writer ---------------- */

typedef struct {
    char *name;
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[DSV4_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
} wtensor;

struct dsv4_st_writer {
    wtensor *t;
    size_t n, cap;
    /* Open-addressing set of names for the duplicate check: index + 1, 0 = empty. */
    size_t *slots;
    size_t nslots;
    char **meta; /* key, value, ... */
    size_t n_meta, cap_meta;
    uint64_t total; /* data section size so far */
};

static uint64_t hash_name(const char *s) { return dsv4_fnv1a_str(DSV4_FNV_OFFSET, s); }

/* The slot holding `name`, or the empty slot where it would go. */
static size_t *slot_for(const dsv4_st_writer *w, const char *name)
{
    size_t mask = w->nslots - 1, i = (size_t)hash_name(name) & mask;
    while (w->slots[i] && strcmp(w->t[w->slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return &w->slots[i];
}

/* Keeps the set at most half full. */
static bool grow_slots(dsv4_st_writer *w)
{
    if (2 * (w->n + 1) <= w->nslots)
        return true;
    size_t ns = w->nslots ? 2 * w->nslots : 64;
    size_t *old = w->slots, on = w->nslots;
    if (!(w->slots = calloc(ns, sizeof *w->slots))) {
        w->slots = old;
        return false;
    }
    w->nslots = ns;
    for (size_t i = 0; i < on; i++)
        if (old[i])
            *slot_for(w, w->t[old[i] - 1].name) = old[i];
    free(old);
    return true;
}

dsv4_status dsv4_st_writer_create(dsv4_st_writer **out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "safetensors writer", "out must not be NULL");
    if (!(*out = calloc(1, sizeof **out)))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "safetensors writer", "out of memory");
    return DSV4_OK;
}

void dsv4_st_writer_free(dsv4_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->n_meta; i++)
        free(w->meta[i]);
    free(w->t);
    free(w->slots);
    free(w->meta);
    free(w);
}

/* jansson refuses strings that are not UTF-8; the header must be UTF-8. */
static bool valid_utf8(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

dsv4_status dsv4_st_writer_add(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, dsv4_error *err)
{
    const char *ww = "safetensors writer";
    if (!w || !name)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, ww, "writer and name must not be NULL");
    where_buf wb;
    snprintf(wb.s, sizeof wb.s, "%s: tensor '%s'", ww, name);
    if (!name[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, ww, "a tensor name must not be empty");
    if (strcmp(name, "__metadata__") == 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "the name is reserved for the metadata map");
    if (!valid_utf8(name))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "the name is not valid UTF-8");
    if ((unsigned)dtype >= DSV4_DTYPE_COUNT)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "dtype %d is not a dsv4_dtype", (int)dtype);
    if (ndim < 0 || ndim > DSV4_MAX_DIMS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "ndim %d is outside [0, %d]", ndim, DSV4_MAX_DIMS);
    if (ndim > 0 && !shape)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "shape must not be NULL when ndim is %d", ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "shape[%d] = %lld is negative", i,
                               (long long)shape[i]);
    uint64_t numel, nbytes, total;
    const char *which = "";
    char shp[256];
    shape_str(shp, sizeof shp, shape, ndim);
    if (!shape_size(dtype, shape, ndim, &numel, &nbytes, &which))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "%s of %s %s overflows 64 bits", which,
                           dsv4_dtype_name(dtype), shp);
    /* Offsets are JSON integers, which jansson (and most readers) hold signed. */
    if (__builtin_add_overflow(w->total, nbytes, &total) || total > (uint64_t)INT64_MAX)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "the data section would exceed 2^63 - 1 bytes");
    if (!grow_slots(w))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, wb.s, "out of memory");
    size_t *slot = slot_for(w, name);
    if (*slot)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, wb.s, "a tensor of this name was already added");
    wtensor *nt = dsv4_grow(w->t, &w->cap, w->n + 1, sizeof *nt, 64);
    if (!nt)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, wb.s, "out of memory");
    w->t = nt;
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, wb.s, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim > 0)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = nbytes;
    t->data = data;
    w->total = total;
    *slot = ++w->n;
    return DSV4_OK;
}

dsv4_status dsv4_st_writer_set_metadata(dsv4_st_writer *w, const char *key, const char *value, dsv4_error *err)
{
    const char *ww = "safetensors writer";
    if (!w || !key || !value)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, ww, "writer, key and value must not be NULL");
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[2 * i], key) == 0)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, ww, "metadata key '%s' was already set", key);
    if (!valid_utf8(key) || !valid_utf8(value))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, ww, "metadata key '%s' or its value is not valid UTF-8", key);
    char **nm = dsv4_grow(w->meta, &w->cap_meta, w->n_meta + 1, 2 * sizeof *nm, 8); /* key, value pairs */
    if (!nm)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, ww, "out of memory");
    w->meta = nm;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, ww, "out of memory");
    }
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return DSV4_OK;
}

/* The header JSON, in declaration order, "__metadata__" first; NULL when out of memory. */
static char *build_header(const dsv4_st_writer *w)
{
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && w->n_meta) {
        json_t *m = json_object();
        ok = m && json_object_set_new(root, "__metadata__", m) == 0;
        for (size_t i = 0; ok && i < w->n_meta; i++)
            ok = json_object_set_new(m, w->meta[2 * i], json_string(w->meta[2 * i + 1])) == 0;
    }
    uint64_t off = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const wtensor *t = &w->t[i];
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        ok = e && sh && of;
        for (int d = 0; ok && d < t->ndim; d++)
            ok = json_array_append_new(sh, json_integer((json_int_t)t->shape[d])) == 0;
        ok = ok && json_array_append_new(of, json_integer((json_int_t)off)) == 0 &&
             json_array_append_new(of, json_integer((json_int_t)(off + t->nbytes))) == 0;
        /* Key order as the Rust implementation writes it. */
        ok = ok && json_object_set_new(e, "dtype", json_string(dsv4_dtype_name(t->dtype))) == 0;
        ok = ok && json_object_set(e, "shape", sh) == 0 && json_object_set(e, "data_offsets", of) == 0;
        json_decref(sh);
        json_decref(of);
        ok = ok && json_object_set(root, t->name, e) == 0;
        json_decref(e);
        off += t->nbytes;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return s;
}

dsv4_status dsv4_st_writer_write(dsv4_st_writer *w, const char *path, dsv4_st_fill_fn fill, void *user,
                                 dsv4_error *err)
{
    if (!w || !path || !path[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "safetensors writer", "writer and path must not be NULL");
    where_buf wb;
    for (size_t i = 0; !fill && i < w->n; i++)
        if (!w->t[i].data)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, dsv4_sti_twhere(&wb, path, w->t[i].name),
                               "no data was given and there is no fill callback");
    char *json = build_header(w);
    if (!json)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory for the header");
    /* Padded with spaces to a multiple of 8, as the Rust writer does, so the
     * data section starts 8-byte aligned in the file. */
    size_t jl = strlen(json), hl = jl + (8 - jl % 8) % 8;
    if (hl > DSV4_ST_MAX_HEADER) {
        free(json);
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, path, "header of %zu bytes exceeds the limit of %u", hl,
                           DSV4_ST_MAX_HEADER);
    }
    unsigned char *head = malloc(8 + hl);
    if (!head) {
        free(json);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory for the header");
    }
    for (int i = 0; i < 8; i++)
        head[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(head + 8, json, jl);
    memset(head + 8 + jl, ' ', hl - jl);
    free(json);

    /* The one file-writing path (core/fileio.c): checked destination, O_EXCL
     * temporary next to it, fsync, rename, folder fsync. */
    dsv4_outfile o;
    dsv4_status st = dsv4_out_begin(&o, path, err);
    if (!st)
        st = dsv4_out_write(&o, head, 8 + hl, err);
    free(head);
    for (size_t i = 0; !st && i < w->n; i++) {
        const wtensor *t = &w->t[i];
        if (t->data) {
            st = dsv4_out_write(&o, t->data, t->nbytes, err);
            continue;
        }
        void *buf = t->nbytes <= SIZE_MAX - 1 ? calloc(1, (size_t)t->nbytes + 1) : NULL;
        if (!buf) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dsv4_sti_twhere(&wb, path, t->name), "out of memory for %llu bytes",
                             (unsigned long long)t->nbytes);
            break;
        }
        /* The callback reports into a record of our own, so its message
         * can be put after the file and key, and a failure it returned
         * without a message still gets one. */
        dsv4_error ce;
        dsv4_error_clear(&ce);
        st = fill(user, i, t->name, buf, t->nbytes, &ce);
        if (st) {
            if (ce.message[0])
                dsv4_seterr(err, st, dsv4_sti_twhere(&wb, path, t->name), "the fill callback failed: %s", ce.message);
            else
                dsv4_seterr(err, st, dsv4_sti_twhere(&wb, path, t->name), "the fill callback failed (%s)",
                            dsv4_status_str(st));
        } else {
            st = dsv4_out_write(&o, buf, t->nbytes, err);
        }
        free(buf);
    }
    if (!st)
        return dsv4_out_commit(&o, err);
    dsv4_out_abort(&o);
    return st;
}

