/*
 * Internal to the outside-engine surfaces: export (harness/export.c), check (compare/engines.c)
 * and the export's manifest (compare/manifest.c). Not installed.
 */
#ifndef DSV4MOE_HARNESS_ENGINES_INT_H
#define DSV4MOE_HARNESS_ENGINES_INT_H

#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/ref.h"
#include "dsv4moe/status.h"

/* case.json's "format". */
#define DSV4_H_CASE_FORMAT "dsv4moe-engine-case"
/* The manifest an export writes last in its folder (docs/engines.md). */
#define DSV4_H_MANIFEST "manifest.json"
#define DSV4_H_MANIFEST_FORMAT "dsv4moe-engine-export"
#define DSV4_H_MANIFEST_VERSION 1

/* The expected file of a rounding profile in a case folder ("expected.safetensors" for spec). */
const char *dsv4_h_expected_file(dsv4_rounding r);

/* CRC-32 (the IEEE polynomial of zlib and PNG) of data[0, n), continuing crc (0 to start). */
uint32_t dsv4_h_crc32(uint32_t crc, const void *data, size_t n);

/* The case folders of dir, sorted: not hidden, holding case.json as a regular file (not through a
   link). *out is allocated (its strings too) even when *n is 0. */
dsv4_status dsv4_h_case_folders(const char *dir, char ***out, size_t *n, dsv4_error *err);

/*
 * Writes dir/manifest.json (atomically) for every case folder in dir (a folder, not hidden,
 * holding case.json): per case each regular file's size and CRC-32 (the model's size only: the
 * engine reads it, check does not, and it can be gigabytes). A case folder holding anything but
 * regular files is an error.
 */
dsv4_status dsv4_h_manifest_write(const char *dir, dsv4_error *err);

/*
 * Holds the case folders names[0, n) of dir (sorted) to dir/manifest.json: the manifest must be
 * there and well-formed, list exactly these folders, and every file it lists must have its size
 * and CRC-32. DSV4_ERR_FORMAT (or DSV4_ERR_IO) naming what is missing, extra or different.
 */
dsv4_status dsv4_h_manifest_verify(const char *dir, char *const *names, size_t n, dsv4_error *err);

#endif
