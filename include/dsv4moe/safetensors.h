/*
 * dsv4moe: safetensors files and multi-file checkpoints.
 *
 * The reader validates everything before it hands out a pointer: header
 * length, JSON syntax (duplicate keys rejected), dtype names, shape products
 * (64-bit overflow), data offsets (inside the data section, no overlap, no
 * gap, the whole data section covered), and truncation. Every failure names
 * the file and, where there is one, the tensor key.
 *
 * The writer never leaves partial output: it writes to a temporary file in
 * the destination's folder and renames it into place only when complete.
 */
#ifndef DSV4MOE_SAFETENSORS_H
#define DSV4MOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/dtype.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_MAX_DIMS 8
/* Largest header accepted, as in the reference safetensors implementation. */
#define DSV4_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct dsv4_tensor_info {
    const char *name;
    const char *file;  /* path of the file that holds it */
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[DSV4_MAX_DIMS];
    uint64_t numel;
    uint64_t nbytes;
    uint64_t offset;   /* from the start of the data section */
    const void *data;  /* owned copy of the bytes, valid until the file or checkpoint is closed */
} dsv4_tensor_info;

/* ---------------- one file ---------------- */

typedef struct dsv4_st_file dsv4_st_file;

/* Opens and validates a file and reads its data into owned memory (never a mapping of the
 * file: a file truncated or rewritten later cannot crash the process with SIGBUS). A file that changes
 * while it is being read is DSV4_ERR_IO. */
DSV4_API dsv4_status dsv4_st_open(const char *path, dsv4_st_file **out, dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_st_close(dsv4_st_file *file);
DSV4_API const char *dsv4_st_path(const dsv4_st_file *file);
/* Tensors in order of their data offsets; at one offset the empty tensors
 * come first, then by name (the Rust order: (begin, end), then name). */
DSV4_API size_t dsv4_st_count(const dsv4_st_file *file);
DSV4_API const dsv4_tensor_info *dsv4_st_tensor(const dsv4_st_file *file, size_t index);
/* NULL when absent. */
DSV4_API const dsv4_tensor_info *dsv4_st_find(const dsv4_st_file *file, const char *name);
/* A value of the "__metadata__" map, or NULL. */
DSV4_API const char *dsv4_st_metadata(const dsv4_st_file *file, const char *key);

/* ---------------- writer ---------------- */

typedef struct dsv4_st_writer dsv4_st_writer;

/*
 * Produces the bytes of tensor `index` (in order of dsv4_st_writer_add calls)
 * into buf[0, nbytes). Called only for tensors declared with data == NULL,
 * in declaration order, once each, with a zeroed buffer (non-NULL even when
 * nbytes is 0) that the writer frees. Return DSV4_OK, or an error (filling
 * err) to abandon the whole file; the writer's own message then names the
 * file and the tensor and quotes err's message.
 */
typedef dsv4_status (*dsv4_st_fill_fn)(void *user, size_t index, const char *name, void *buf, uint64_t nbytes,
                                       dsv4_error *err);

DSV4_API dsv4_status dsv4_st_writer_create(dsv4_st_writer **out, dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_st_writer_free(dsv4_st_writer *writer);
/*
 * Declares a tensor. `data` (nbytes as implied by dtype and shape) is copied
 * at write time, not now, so it must stay valid until dsv4_st_writer_write;
 * pass NULL to have the fill callback produce it. Duplicate names, empty
 * names, ndim outside [0, 8], negative dims and overflowing sizes are errors.
 */
DSV4_API dsv4_status dsv4_st_writer_add(dsv4_st_writer *writer, const char *name, dsv4_dtype dtype, int ndim,
                                        const int64_t *shape, const void *data, dsv4_error *err);
/* Adds a "__metadata__" entry (string to string, UTF-8); a key set twice is an error. */
DSV4_API dsv4_status dsv4_st_writer_set_metadata(dsv4_st_writer *writer, const char *key, const char *value,
                                                 dsv4_error *err);
/*
 * Writes the file atomically: "<path>.tmp.<pid>.<n>" next to it, renamed
 * into place when complete, removed on any error. Header keys and data in
 * declaration order, "__metadata__" first; the header is padded with spaces
 * to a multiple of 8 bytes. `fill` may be NULL when every tensor has data.
 */
DSV4_API dsv4_status dsv4_st_writer_write(dsv4_st_writer *writer, const char *path, dsv4_st_fill_fn fill, void *user,
                                          dsv4_error *err);

/* ---------------- checkpoints ---------------- */

typedef enum dsv4_layout {
    DSV4_LAYOUT_UNKNOWN = 0, /* neither layout's keys were found */
    DSV4_LAYOUT_SPLIT = 1,   /* official release: layers.{i}.ffn.experts.{e}.w1.weight ... */
    DSV4_LAYOUT_STACKED = 2  /* HF transformers export: [model.]layers.{i}.mlp.experts.gate_up_proj ... */
} dsv4_layout;

DSV4_API const char *dsv4_layout_name(dsv4_layout layout);

typedef struct dsv4_checkpoint dsv4_checkpoint;

/*
 * Opens a checkpoint: one .safetensors file, a folder holding
 * model.safetensors.index.json (its weight_map names the files; every listed
 * key must be in its file and every tensor of those files must be listed),
 * a folder of .safetensors files without an index (the regular files whose
 * keys include a layer tensor "[model.]layers.<digits>.", sorted by name; the other
 * entries are skipped, see dsv4_checkpoint_skipped), or the path of an index
 * file itself (any path ending in ".json").
 * A key present in two files is an error; a folder with neither an index
 * nor a .safetensors file is DSV4_ERR_NOT_FOUND. The layout is detected
 * from the keys of all files together (split: a key starting
 * "layers.<digits>.ffn."; stacked: one starting "[model.]layers.<digits>.mlp.";
 * neither: DSV4_LAYOUT_UNKNOWN); a checkpoint mixing split and stacked
 * keys, or stacked keys with and without the "model." prefix, is an error
 * naming one key of each kind.
 */
DSV4_API dsv4_status dsv4_checkpoint_open(const char *path, dsv4_checkpoint **out, dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_checkpoint_close(dsv4_checkpoint *ckpt);
DSV4_API size_t dsv4_checkpoint_file_count(const dsv4_checkpoint *ckpt);
DSV4_API const char *dsv4_checkpoint_file_path(const dsv4_checkpoint *ckpt, size_t index);
/*
 * All tensors, sorted by name. A checkpoint reads only the headers at open; a tensor's data
 * is read (pread into owned memory, once, thread-safe) when it is first returned by
 * dsv4_checkpoint_get, dsv4_checkpoint_find or dsv4_checkpoint_tensor. Before each read the
 * file's size and mtime are compared with those at open: a file rewritten or truncated
 * meanwhile is DSV4_ERR_IO, never a signal. dsv4_checkpoint_tensor_meta reads nothing:
 * its `data` must not be read (use it for names, dtypes, shapes and sizes).
 */
DSV4_API size_t dsv4_checkpoint_tensor_count(const dsv4_checkpoint *ckpt);
DSV4_API const dsv4_tensor_info *dsv4_checkpoint_tensor_meta(const dsv4_checkpoint *ckpt, size_t index);
/* NULL when the index is out of range or the data cannot be read. */
DSV4_API const dsv4_tensor_info *dsv4_checkpoint_tensor(const dsv4_checkpoint *ckpt, size_t index);
/* The tensor with its data read; DSV4_ERR_NOT_FOUND naming the files searched, or DSV4_ERR_IO. */
DSV4_API dsv4_status dsv4_checkpoint_get(const dsv4_checkpoint *ckpt, const char *name, const dsv4_tensor_info **out,
                                         dsv4_error *err);
/* NULL when absent or unreadable (dsv4_checkpoint_get says which). */
DSV4_API const dsv4_tensor_info *dsv4_checkpoint_find(const dsv4_checkpoint *ckpt, const char *name);
/* NULL when absent; reads nothing (like dsv4_checkpoint_tensor_meta). */
DSV4_API const dsv4_tensor_info *dsv4_checkpoint_find_meta(const dsv4_checkpoint *ckpt, const char *name);
DSV4_API dsv4_layout dsv4_checkpoint_layout(const dsv4_checkpoint *ckpt);
/*
 * Entries of a folder (without an index) left out of the checkpoint, in name order: the path
 * and the reason ("a dangling symbolic link", "a FIFO, not a regular file", "holds no layer
 * tensor (...)"). Callers should show them; the library never prints.
 */
DSV4_API size_t dsv4_checkpoint_skipped_count(const dsv4_checkpoint *ckpt);
DSV4_API const char *dsv4_checkpoint_skipped(const dsv4_checkpoint *ckpt, size_t index, const char **reason);
/* Key prefix of the stacked layout: "model." or "" (always "" for split). */
DSV4_API const char *dsv4_checkpoint_prefix(const dsv4_checkpoint *ckpt);

#ifdef __cplusplus
}
#endif
#endif
