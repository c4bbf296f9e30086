/*
 * Internal to the safetensors code (core/safetensors.c: one file, reader and writer;
 * core/checkpoint.c: checkpoints of several files): the open file and the helpers both use.
 * Not an installed header.
 */
#ifndef DSV4MOE_CORE_ST_INT_H
#define DSV4MOE_CORE_ST_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "dsv4moe/safetensors.h"

struct dsv4_st_file {
    char *path;
    /* The data section lives in owned memory, never in a mapping of the file: a file
     * truncated or rewritten under the process must be an error, not SIGBUS. It is an
     * anonymous mapping (MAP_NORESERVE) so that a checkpoint's tensors cost memory only once
     * read; `map` is never of length 0. */
    void *map;
    size_t map_len;
    uint64_t data_start; /* file offset of the data section */
    int fd;              /* kept open while tensors remain to be read (checkpoints), else -1 */
    struct stat id;      /* size and mtime at open: a later read checks the file is the same */
    bool *loaded;        /* per tensor (by data offset) */
    pthread_mutex_t mu;
    bool mu_init;
    dsv4_tensor_info *tensors; /* by data offset */
    size_t n;
    const dsv4_tensor_info **by_name;
    char **meta; /* key, value, key, value, ... */
    size_t n_meta;
};

/* "path: tensor 'key'", the `where` of every per-tensor message. Sized like a
 * message so a long path does not cut the key out of the message itself. */
typedef struct {
    char s[DSV4_ERROR_MESSAGE_MAX];
} where_buf;

/* The XSI strerror_r (we build without _GNU_SOURCE): strerror is not thread-safe. */
const char *dsv4_sti_errstr(int e, char *buf, size_t n);
const char *dsv4_sti_twhere(where_buf *w, const char *path, const char *key);
/* The JSON type of v in words, for messages. */
const char *dsv4_sti_jtype(const json_t *v);
bool dsv4_sti_ends_with(const char *s, const char *suffix);
/* dir/name in a new string; NULL when out of memory. */
char *dsv4_sti_join_path(const char *dir, const char *name);
/* qsort comparators: strings through pointers; tensor infos by name. */
int dsv4_sti_cmp_str_ptr(const void *a, const void *b);
int dsv4_sti_cmp_info_name(const void *a, const void *b);
/* Binary search of v [n] sorted by name. */
const dsv4_tensor_info *dsv4_sti_find_sorted(const dsv4_tensor_info *const *v, size_t n, const char *name);
/* Reads tensor i of a lazily opened file (once; thread-safe). */
dsv4_status dsv4_sti_load_tensor(dsv4_st_file *f, size_t i, dsv4_error *err);
/* dsv4_st_open; lazy: tensors are read on first use (checkpoints). */
dsv4_status dsv4_sti_st_open(const char *path, bool lazy, dsv4_st_file **out, dsv4_error *err);

#endif
