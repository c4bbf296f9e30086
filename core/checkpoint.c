/*
 * Multi-file checkpoints (dsv4moe/safetensors.h): a file, a folder of *.safetensors files or a
 * model.safetensors.index.json, merged into one name -> tensor view, with the layout (split or
 * stacked) detected from the keys. One file's reader is core/safetensors.c.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4moe/safetensors.h"
#include "core/err.h"
#include "core/grow.h"
#include "core/fileio.h"
#include "core/st_int.h"
#include "core/testctl.h"

/* ---------------- checkpoints ---------------- */

struct dsv4_checkpoint {
    dsv4_st_file **files;
    size_t n_files;
    const dsv4_tensor_info **tensors; /* by name */
    size_t n;
    dsv4_layout layout;
    const char *prefix;
    char **skipped; /* path, reason, path, reason, ... */
    size_t n_skipped;
};

void dsv4_checkpoint_close(dsv4_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_files; i++)
        dsv4_st_close(ck->files[i]);
    free(ck->files);
    free(ck->tensors);
    for (size_t i = 0; i < 2 * ck->n_skipped; i++)
        free(ck->skipped[i]);
    free(ck->skipped);
    free(ck);
}

size_t dsv4_checkpoint_file_count(const dsv4_checkpoint *ck) { return ck ? ck->n_files : 0; }

const char *dsv4_checkpoint_file_path(const dsv4_checkpoint *ck, size_t index)
{
    return ck && index < ck->n_files ? dsv4_st_path(ck->files[index]) : NULL;
}

size_t dsv4_checkpoint_tensor_count(const dsv4_checkpoint *ck) { return ck ? ck->n : 0; }

size_t dsv4_checkpoint_skipped_count(const dsv4_checkpoint *ck) { return ck ? ck->n_skipped : 0; }

const char *dsv4_checkpoint_skipped(const dsv4_checkpoint *ck, size_t index, const char **reason)
{
    if (!ck || index >= ck->n_skipped)
        return NULL;
    if (reason)
        *reason = ck->skipped[2 * index + 1];
    return ck->skipped[2 * index];
}

const dsv4_tensor_info *dsv4_checkpoint_tensor_meta(const dsv4_checkpoint *ck, size_t index)
{
    return ck && index < ck->n ? ck->tensors[index] : NULL;
}

/* Reads t's data on first use, from the file of ck that holds it. */
static dsv4_status ck_load(const dsv4_checkpoint *ck, const dsv4_tensor_info *t, dsv4_error *err)
{
    for (size_t i = 0; i < ck->n_files; i++) {
        dsv4_st_file *f = ck->files[i];
        if (t >= f->tensors && t < f->tensors + f->n)
            return dsv4_sti_load_tensor(f, (size_t)(t - f->tensors), err);
    }
    return dsv4_seterr(err, DSV4_ERR_INTERNAL, t->name, "tensor belongs to no file of the checkpoint");
}

dsv4_status dsv4_checkpoint_get(const dsv4_checkpoint *ck, const char *name, const dsv4_tensor_info **out,
                                dsv4_error *err)
{
    if (!ck || !name || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_checkpoint_get", "arguments must not be NULL");
    *out = NULL;
    const dsv4_tensor_info *t = dsv4_sti_find_sorted(ck->tensors, ck->n, name);
    if (!t) {
        /* Name the files searched, so a user sees which checkpoint was meant. */
        char files[700];
        size_t off = 0;
        files[0] = '\0';
        for (size_t i = 0; i < ck->n_files && off < sizeof files; i++) {
            if (i == 4 && ck->n_files > 5) {
                snprintf(files + off, sizeof files - off, " and %zu more", ck->n_files - 4);
                break;
            }
            off += (size_t)snprintf(files + off, sizeof files - off, "%s%s", i ? ", " : "", ck->files[i]->path);
        }
        where_buf wb;
        snprintf(wb.s, sizeof wb.s, "tensor '%s'", name);
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, wb.s, "is missing from the checkpoint (searched %zu file%s: %s)",
                           ck->n_files, ck->n_files == 1 ? "" : "s", files);
    }
    dsv4_status st = ck_load(ck, t, err);
    if (!st)
        *out = t;
    return st;
}

const dsv4_tensor_info *dsv4_checkpoint_tensor(const dsv4_checkpoint *ck, size_t index)
{
    const dsv4_tensor_info *t = dsv4_checkpoint_tensor_meta(ck, index);
    return t && ck_load(ck, t, NULL) == DSV4_OK ? t : NULL;
}

const dsv4_tensor_info *dsv4_checkpoint_find_meta(const dsv4_checkpoint *ck, const char *name)
{
    return ck && name ? dsv4_sti_find_sorted(ck->tensors, ck->n, name) : NULL;
}

const dsv4_tensor_info *dsv4_checkpoint_find(const dsv4_checkpoint *ck, const char *name)
{
    const dsv4_tensor_info *t = NULL;
    return ck && name && dsv4_checkpoint_get(ck, name, &t, NULL) == DSV4_OK ? t : NULL;
}

dsv4_layout dsv4_checkpoint_layout(const dsv4_checkpoint *ck) { return ck ? ck->layout : DSV4_LAYOUT_UNKNOWN; }
const char *dsv4_checkpoint_prefix(const dsv4_checkpoint *ck) { return ck && ck->prefix ? ck->prefix : ""; }

/* Opens dir/names[i] for every name into ck->files (names sorted, distinct). */
static dsv4_status open_files(dsv4_checkpoint *ck, const char *dir, const char *const *names, size_t n,
                              dsv4_error *err)
{
    if (!(ck->files = calloc(n + 1, sizeof *ck->files)))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char *p = dir[0] ? dsv4_sti_join_path(dir, names[i]) : strdup(names[i]);
        if (!p)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
        dsv4_status st = dsv4_sti_st_open(p, true, &ck->files[i], err);
        free(p);
        if (st)
            return st;
        ck->n_files++;
    }
    return DSV4_OK;
}

/* Records a file of the folder that is not part of the checkpoint, and why. */
static bool add_skipped(dsv4_checkpoint *ck, const char *path, const char *reason)
{
    char **ns = realloc(ck->skipped, 2 * (ck->n_skipped + 1) * sizeof *ns);
    if (!ns)
        return false;
    ck->skipped = ns;
    char *p = strdup(path), *r = strdup(reason);
    if (!p || !r) {
        free(p);
        free(r);
        return false;
    }
    ns[2 * ck->n_skipped] = p;
    ns[2 * ck->n_skipped + 1] = r;
    ck->n_skipped++;
    return true;
}

static bool layer_key(const char *s, const char *part);

/* Whether a file holds a layer's tensors ("[model.]layers.<digits>."): the files of a
 * checkpoint do, the inputs and outputs written next to them (x, y, topk_ids) do not. */
static bool holds_layer_tensors(const dsv4_st_file *f)
{
    for (size_t i = 0; i < f->n; i++) {
        const char *k = f->tensors[i].name;
        if (layer_key(k, "") || (strncmp(k, "model.", 6) == 0 && layer_key(k + 6, "")))
            return true;
    }
    return false;
}

/* Why a directory entry that is not a regular file was left out. */
static const char *entry_kind(const char *p)
{
    struct stat lb, sb;
    if (lstat(p, &lb) != 0)
        return "it vanished while the folder was read";
    if (S_ISLNK(lb.st_mode) && stat(p, &sb) != 0)
        return "a dangling symbolic link";
    return dsv4_file_kind(S_ISLNK(lb.st_mode) ? sb.st_mode : lb.st_mode);
}

/*
 * A folder without an index: the regular *.safetensors files in it that hold layer tensors,
 * sorted by name. The others are recorded as skipped, with the reason: entries that are not
 * regular files (dangling links, FIFOs, devices, folders) and files holding no layer tensor
 * (an input or output written next to the weights). A malformed file is an error.
 */
static dsv4_status open_folder(dsv4_checkpoint *ck, const char *dir, dsv4_error *err)
{
    char eb[128];
    DIR *d = opendir(dir);
    if (!d)
        return dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot open folder: %s", dsv4_sti_errstr(errno, eb, sizeof eb));
    char **names = NULL;
    size_t n = 0, cap = 0;
    dsv4_status st = DSV4_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!dsv4_sti_ends_with(de->d_name, ".safetensors"))
            continue;
        char **nn = dsv4_grow(names, &cap, n + 1, sizeof *nn, 16);
        if (!nn) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            goto done;
        }
        names = nn;
        if (!(names[n] = strdup(de->d_name))) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            goto done;
        }
        n++;
    }
    /* Sorted first, so the files and the skipped list come out in one order on any file system. */
    if (n)
        qsort(names, n, sizeof *names, dsv4_sti_cmp_str_ptr);
    if (!(ck->files = calloc(n + 1, sizeof *ck->files))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && !st; i++) {
        char *p = dsv4_sti_join_path(dir, names[i]);
        if (!p) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            break;
        }
        struct stat sb;
        dsv4_st_file *f = NULL;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            if (!add_skipped(ck, p, entry_kind(p)))
                st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
        } else if (!(st = dsv4_sti_st_open(p, true, &f, err))) {
            if (holds_layer_tensors(f)) {
                ck->files[ck->n_files++] = f;
                f = NULL;
            } else {
                char why[400];
                snprintf(why, sizeof why, "holds no layer tensor (%zu tensor%s%s%s%s: an input or output file?)",
                         f->n, f->n == 1 ? "" : "s", f->n ? ", first '" : "", f->n ? f->by_name[0]->name : "",
                         f->n ? "'" : "");
                if (!add_skipped(ck, p, why))
                    st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            }
            dsv4_st_close(f);
        }
        free(p);
    }
    if (!st && ck->n_files == 0)
        st = dsv4_seterr(err, DSV4_ERR_NOT_FOUND, dir,
                         "folder holds neither model.safetensors.index.json nor a *.safetensors file with layer "
                         "tensors (%zu *.safetensors entr%s skipped%s%s%s)",
                         ck->n_skipped, ck->n_skipped == 1 ? "y" : "ies", ck->n_skipped ? ": " : "",
                         ck->n_skipped ? ck->skipped[0] : "", ck->n_skipped > 1 ? ", ..." : "");
done:
    closedir(d);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return st;
}

static bool plain_name(const char *s) { return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, ".."); }

/* The file index of `name` in ck->files, which were opened from sorted `names`. */
static size_t name_index(const char *const *names, size_t n, const char *name)
{
    const char *const *p = bsearch(&name, names, n, sizeof *names, dsv4_sti_cmp_str_ptr);
    return p ? (size_t)(p - names) : n;
}

static dsv4_status open_index(dsv4_checkpoint *ck, const char *idx, dsv4_error *err)
{
    json_error_t je;
    json_t *root = json_load_file(idx, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_cannot_open_file)
            return dsv4_seterr(err, DSV4_ERR_IO, idx, "cannot open: %s", je.text);
        return dsv4_seterr(err, DSV4_ERR_FORMAT, idx, "not valid JSON: %s at line %d, column %d", je.text, je.line,
                           je.column);
    }
    dsv4_status st = DSV4_OK;
    const char **names = NULL; /* point into root */
    char *dir = NULL;
    where_buf wb;
    json_t *wm = json_object_get(root, "weight_map"), *meta = json_object_get(root, "metadata");
    if (!json_is_object(root) || !json_is_object(wm)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, idx, "an index is an object holding a \"weight_map\" object");
        goto done;
    }
    if (meta && !json_is_object(meta)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, idx, "\"metadata\" is %s, not an object", dsv4_sti_jtype(meta));
        goto done;
    }
    size_t nk = json_object_size(wm), n = 0;
    if (nk == 0) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, idx, "weight_map lists no tensors");
        goto done;
    }
    if (!(names = calloc(nk, sizeof *names))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, idx, "out of memory");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, idx, key), "weight_map value is %s, not a file name",
                             dsv4_sti_jtype(v));
            goto done;
        }
        if (!plain_name(json_string_value(v))) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, idx, key),
                             "file name '%s' is not a plain name in the index's folder (no '/', '.' or '..')",
                             json_string_value(v));
            goto done;
        }
        const char *base = strrchr(idx, '/');
        if (!strcmp(json_string_value(v), base ? base + 1 : idx)) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, idx, key),
                             "weight_map names the index itself ('%s') as the file holding the key",
                             json_string_value(v));
            goto done;
        }
        names[n++] = json_string_value(v);
    }
    qsort(names, n, sizeof *names, dsv4_sti_cmp_str_ptr);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]))
            names[u++] = names[i];
    const char *slash = strrchr(idx, '/');
    size_t dl = slash ? (size_t)(slash - idx) + 1 : 0;
    if (!(dir = malloc(dl + 1))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, idx, "out of memory");
        goto done;
    }
    memcpy(dir, idx, dl);
    dir[dl] = '\0';
    if ((st = open_files(ck, dir, names, u, err)))
        goto done;
    /* Every listed key is in its file... */
    json_object_foreach(wm, key, v) {
        const dsv4_st_file *f = ck->files[name_index(names, u, json_string_value(v))];
        if (!dsv4_st_find(f, key)) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, idx, key),
                             "listed in the index for file %s, which does not hold it", dsv4_st_path(f));
            goto done;
        }
    }
    /* ...and every tensor of the files is listed, for its own file. */
    for (size_t i = 0; i < ck->n_files; i++) {
        const dsv4_st_file *f = ck->files[i];
        for (size_t j = 0; j < f->n; j++) {
            const char *tn = f->tensors[j].name;
            json_t *lv = json_object_get(wm, tn);
            if (!lv) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, f->path, tn), "not listed in the index %s", idx);
                goto done;
            }
            size_t li = name_index(names, u, json_string_value(lv));
            if (li != i) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, idx, tn),
                                 "the key is in two files, %s and %s (a key must be in one file)",
                                 dsv4_st_path(ck->files[li]), f->path);
                goto done;
            }
        }
    }
done:
    free(dir);
    free(names);
    json_decref(root);
    return st;
}

/* Whether s starts with "layers.<digits>.<part>" (part like "ffn."). */
static bool layer_key(const char *s, const char *part)
{
    if (strncmp(s, "layers.", 7) != 0)
        return false;
    s += 7;
    if (*s < '0' || *s > '9')
        return false;
    while (*s >= '0' && *s <= '9')
        s++;
    return *s == '.' && strncmp(s + 1, part, strlen(part)) == 0;
}

/* Over the name-sorted union of all keys, so no file order can change the result. */
static dsv4_status detect_layout(dsv4_checkpoint *ck, const char *where, dsv4_error *err)
{
    const dsv4_tensor_info *split = NULL, *stk = NULL, *stk_model = NULL;
    for (size_t i = 0; i < ck->n; i++) {
        const dsv4_tensor_info *t = ck->tensors[i];
        if (!split && layer_key(t->name, "ffn."))
            split = t;
        if (!stk && layer_key(t->name, "mlp."))
            stk = t;
        if (!stk_model && strncmp(t->name, "model.", 6) == 0 && layer_key(t->name + 6, "mlp."))
            stk_model = t;
    }
    if (split && (stk || stk_model)) {
        const dsv4_tensor_info *s = stk ? stk : stk_model;
        return dsv4_seterr(err, DSV4_ERR_FORMAT, where,
                           "mixes the split layout (key '%s' in %s) with the stacked layout (key '%s' in %s)",
                           split->name, split->file, s->name, s->file);
    }
    if (stk && stk_model)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, where,
                           "mixes stacked keys with and without the 'model.' prefix ('%s' in %s, '%s' in %s)",
                           stk_model->name, stk_model->file, stk->name, stk->file);
    ck->layout = split ? DSV4_LAYOUT_SPLIT : (stk || stk_model) ? DSV4_LAYOUT_STACKED : DSV4_LAYOUT_UNKNOWN;
    ck->prefix = stk_model ? "model." : "";
    if (DSV4_TESTHOOK(LAYOUT_FROM_LAST_FILE) && ck->n_files > 1) { /* test hook: the flag from the last file's keys alone */
        const dsv4_st_file *last = ck->files[ck->n_files - 1];
        bool has = false;
        for (size_t i = 0; i < last->n; i++)
            has |= strstr(last->tensors[i].name, ".mlp.experts.gate_up_proj") != NULL;
        ck->layout = has ? DSV4_LAYOUT_STACKED : DSV4_LAYOUT_SPLIT;
    }
    return DSV4_OK;
}

/* All tensors of all files, by name; a key in two files is an error. */
static dsv4_status merge_tensors(dsv4_checkpoint *ck, const char *where, dsv4_error *err)
{
    size_t n = 0;
    for (size_t i = 0; i < ck->n_files; i++)
        n += ck->files[i]->n;
    if (!(ck->tensors = calloc(n + 1, sizeof *ck->tensors)))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, where, "out of memory for %zu tensors", n);
    for (size_t i = 0; i < ck->n_files; i++)
        for (size_t j = 0; j < ck->files[i]->n; j++)
            ck->tensors[ck->n++] = &ck->files[i]->tensors[j];
    qsort(ck->tensors, ck->n, sizeof *ck->tensors, dsv4_sti_cmp_info_name);
    where_buf wb;
    for (size_t i = 1; i < ck->n; i++)
        if (strcmp(ck->tensors[i - 1]->name, ck->tensors[i]->name) == 0)
            return dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_sti_twhere(&wb, where, ck->tensors[i]->name),
                               "the key is in two files, %s and %s (a key must be in one file)",
                               ck->tensors[i - 1]->file, ck->tensors[i]->file);
    return DSV4_OK;
}

dsv4_status dsv4_checkpoint_open(const char *path, dsv4_checkpoint **out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_checkpoint_open", "out must not be NULL");
    *out = NULL;
    if (!path || !path[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_checkpoint_open", "path must not be NULL or empty");
    char eb[128];
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open: %s", dsv4_sti_errstr(errno, eb, sizeof eb));
    dsv4_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    dsv4_status st;
    if (S_ISDIR(sb.st_mode)) {
        char *idx = dsv4_sti_join_path(path, "model.safetensors.index.json");
        if (!idx)
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
        else if (stat(idx, &sb) != 0)
            st = open_folder(ck, path, err);
        else if (!S_ISREG(sb.st_mode))
            st = dsv4_seterr(err, DSV4_ERR_IO, idx, "not a regular file");
        else
            st = open_index(ck, idx, err);
        free(idx);
    } else if (!S_ISREG(sb.st_mode)) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "neither a regular file nor a folder");
    } else if (dsv4_sti_ends_with(path, ".json")) {
        st = open_index(ck, path, err);
    } else {
        const char *one = path;
        st = open_files(ck, "", &one, 1, err);
    }
    if (!st)
        st = merge_tensors(ck, path, err);
    if (!st)
        st = detect_layout(ck, path, err);
    if (st) {
        dsv4_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return DSV4_OK;
}
