/*
 * The manifest of an export (compare/engines_int.h, docs/engines.md): written last by a complete
 * export, required and verified by check, so that an export stopped part-way, or a case folder
 * missing, added or altered since, is refused instead of checked.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "compare/engines_int.h"
#include "core/err.h"
#include "core/fileio.h"

/* A manifest of tens of thousands of cases stays far below this. */
#define MANIFEST_MAX (64u << 20)

const char *dsv4_h_expected_file(dsv4_rounding r)
{
    static const char *const names[DSV4_ROUNDING_COUNT] = {"expected.safetensors", "expected.bf16_ops.safetensors",
                                                           "expected.fp32.safetensors"};
    return (unsigned)r < DSV4_ROUNDING_COUNT ? names[r] : NULL;
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dsv4_h_crc32(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init); /* built once, whichever thread comes first */
    const uint32_t *table = crc_table;
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* Size and CRC-32 of a regular file (not following a link); want_crc false: the size only. */
static dsv4_status file_sum(const char *path, bool want_crc, uint64_t *size, uint32_t *crc, dsv4_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open: %s", strerror(errno));
    struct stat sb;
    dsv4_status st = DSV4_OK;
    if (fstat(fd, &sb) != 0) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot stat: %s", strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "is %s, not a regular file", dsv4_file_kind(sb.st_mode));
        goto done;
    }
    *size = (uint64_t)sb.st_size;
    *crc = 0;
    if (!want_crc)
        goto done;
    unsigned char buf[1 << 14];
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = dsv4_seterr(err, DSV4_ERR_IO, path, "read error: %s", strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        *crc = dsv4_h_crc32(*crc, buf, (size_t)r);
        total += (uint64_t)r;
    }
    if (total != *size)
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "changed while being read");
done:
    close(fd);
    return st;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The sorted entries of a folder (not hidden, not "." or ".."); *n their count. */
static dsv4_status folder_entries(const char *dir, char ***out, size_t *n, dsv4_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot read the folder: %s", strerror(errno));
    char **v = NULL;
    size_t k = 0, cap = 0;
    struct dirent *de;
    dsv4_status st = DSV4_OK;
    while (!st && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
                break;
            }
            v = nv;
        }
        if (!(v[k] = strdup(de->d_name)))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
        else
            k++;
    }
    closedir(d);
    if (st) {
        for (size_t i = 0; i < k; i++)
            free(v[i]);
        free(v);
        return st;
    }
    if (k)
        qsort(v, k, sizeof *v, name_cmp);
    *out = v;
    *n = k;
    return DSV4_OK;
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* One case folder's files: {"name": {"bytes": N, "crc32": "hex"}} (the model: bytes only). */
static dsv4_status case_files(const char *dir, const char *id, json_t **out, dsv4_error *err)
{
    char folder[4200], path[4600];
    snprintf(folder, sizeof folder, "%s/%s", dir, id);
    char **names = NULL;
    size_t n = 0;
    dsv4_status st = folder_entries(folder, &names, &n, err);
    if (st)
        return st;
    json_t *o = json_object();
    for (size_t i = 0; o && i < n && !st; i++) {
        snprintf(path, sizeof path, "%s/%s", folder, names[i]);
        bool model = !strcmp(names[i], "model.safetensors");
        uint64_t size = 0;
        uint32_t crc = 0;
        if ((st = file_sum(path, !model, &size, &crc, err)))
            break;
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", crc);
        json_t *f = model ? json_pack("{s:I}", "bytes", (json_int_t)size)
                          : json_pack("{s:I, s:s}", "bytes", (json_int_t)size, "crc32", hex);
        if (!f || json_object_set_new(o, names[i], f))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, folder, "out of memory");
    }
    free_names(names, n);
    if (!o && !st)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, folder, "out of memory");
    if (st) {
        json_decref(o);
        return st;
    }
    *out = o;
    return DSV4_OK;
}

dsv4_status dsv4_h_case_folders(const char *dir, char ***out, size_t *n, dsv4_error *err)
{
    char **all = NULL;
    size_t na = 0, k = 0;
    dsv4_status st = folder_entries(dir, &all, &na, err);
    if (st)
        return st;
    for (size_t i = 0; i < na; i++) {
        char p[4600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/case.json", dir, all[i]);
        if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(all[i]);
            continue;
        }
        all[k++] = all[i];
    }
    *out = all;
    *n = k;
    return DSV4_OK;
}

dsv4_status dsv4_h_manifest_write(const char *dir, dsv4_error *err)
{
    char **ids = NULL;
    size_t n = 0;
    dsv4_status st = dsv4_h_case_folders(dir, &ids, &n, err);
    if (st)
        return st;
    json_t *cases = json_object();
    for (size_t i = 0; cases && i < n && !st; i++) {
        json_t *files = NULL;
        if (!(st = case_files(dir, ids[i], &files, err)) && json_object_set_new(cases, ids[i], files))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    }
    free_names(ids, n);
    json_t *root = cases && !st ? json_pack("{s:s, s:i, s:o}", "format", DSV4_H_MANIFEST_FORMAT, "version",
                                            DSV4_H_MANIFEST_VERSION, "cases", cases)
                                : NULL;
    if (!root) {
        if (!st)
            json_decref(cases);
        return st ? st : dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, DSV4_H_MANIFEST);
    st = dsv4_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return st;
}

dsv4_status dsv4_h_manifest_verify(const char *dir, char *const *names, size_t n, dsv4_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, DSV4_H_MANIFEST);
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                           "no manifest: not a complete export (an export writes it last, and one that stopped "
                           "part-way leaves none); export the cases again");
    char *text = NULL;
    size_t len = 0;
    dsv4_status st = dsv4_read_small_file(path, MANIFEST_MAX, "a manifest", &text, &len, err);
    if (st)
        return st;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "line %d: %s", je.line, je.text);
    json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version"),
           *cases = json_object_get(root, "cases");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), DSV4_H_MANIFEST_FORMAT) || !json_is_integer(ver) ||
        json_integer_value(ver) != DSV4_H_MANIFEST_VERSION || !json_is_object(cases)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "not a %s manifest of version %d with an object \"cases\"",
                         DSV4_H_MANIFEST_FORMAT, DSV4_H_MANIFEST_VERSION);
        goto done;
    }
    for (size_t i = 0; i < n && !st; i++)
        if (!json_object_get(cases, names[i]))
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                             "case folder '%s' is not in the manifest (added after the export?)", names[i]);
    const char *id;
    json_t *files;
    json_object_foreach(cases, id, files)
    {
        if (st)
            break;
        bool present = false;
        for (size_t i = 0; i < n && !present; i++)
            present = !strcmp(names[i], id);
        if (!present) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "case '%s' of the manifest is missing from %s", id, dir);
            break;
        }
        if (!json_is_object(files)) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "case '%s': not an object of files", id);
            break;
        }
        const char *fname;
        json_t *f;
        json_object_foreach(files, fname, f)
        {
            json_t *bytes = json_object_get(f, "bytes"), *crc = json_object_get(f, "crc32");
            if (!fname[0] || fname[0] == '.' || strchr(fname, '/') || !json_is_integer(bytes) ||
                json_integer_value(bytes) < 0 || (crc && !json_is_string(crc))) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "case '%s': entry '%s' is not a file name with bytes",
                                 id, fname);
                break;
            }
            char fp[4600];
            snprintf(fp, sizeof fp, "%s/%s/%s", dir, id, fname);
            uint64_t size = 0;
            uint32_t got = 0;
            if ((st = file_sum(fp, crc != NULL, &size, &got, err)))
                break;
            char hex[16];
            snprintf(hex, sizeof hex, "%08x", got);
            if (size != (uint64_t)json_integer_value(bytes) || (crc && strcmp(hex, json_string_value(crc)))) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, fp,
                                 "differs from the export's manifest (%llu bytes%s%s, the manifest says %lld%s%s): "
                                 "altered since the export",
                                 (unsigned long long)size, crc ? ", crc32 " : "", crc ? hex : "",
                                 (long long)json_integer_value(bytes), crc ? ", crc32 " : "",
                                 crc ? json_string_value(crc) : "");
                break;
            }
        }
    }
done:
    json_decref(root);
    return st;
}
