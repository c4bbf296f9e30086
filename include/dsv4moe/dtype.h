/* dsv4moe: element types shared by files, communicators and backends. */
#ifndef DSV4MOE_DTYPE_H
#define DSV4MOE_DTYPE_H

#include <stddef.h>
#include "dsv4moe/api.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_dtype {
    DSV4_DTYPE_BOOL = 0,
    DSV4_DTYPE_U8,
    DSV4_DTYPE_I8,
    DSV4_DTYPE_U16,
    DSV4_DTYPE_I16,
    DSV4_DTYPE_F16,
    DSV4_DTYPE_BF16,
    DSV4_DTYPE_U32,
    DSV4_DTYPE_I32,
    DSV4_DTYPE_F32,
    DSV4_DTYPE_U64,
    DSV4_DTYPE_I64,
    DSV4_DTYPE_F64,
    DSV4_DTYPE_F8_E4M3,
    DSV4_DTYPE_F8_E5M2,
    DSV4_DTYPE_F8_E8M0,
    DSV4_DTYPE_COUNT
} dsv4_dtype;

/* The safetensors name ("BF16", "F8_E4M3", ...); "?" for an invalid value. */
DSV4_API const char *dsv4_dtype_name(dsv4_dtype dtype);
/* Bytes per element; 0 for an invalid value. */
DSV4_API size_t dsv4_dtype_size(dsv4_dtype dtype);
/* Parses a safetensors dtype name; DSV4_ERR_FORMAT for an unknown one. */
DSV4_API dsv4_status dsv4_dtype_parse(const char *name, dsv4_dtype *out);

#ifdef __cplusplus
}
#endif
#endif
