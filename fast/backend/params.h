/*
 * A backend's parameter list (dsv4_backend_options.params: "key=value,key=value"), read item by
 * item. The backend names its keys and checks their values (docs/cpu.md, docs/cuda.md
 * "Parameters"); the form of the list and the refusals of a malformed item or an unknown key are
 * here, so every backend words them alike: "backend NAME params: ...".
 */
#ifndef DSV4_FAST_BACKEND_PARAMS_H
#define DSV4_FAST_BACKEND_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "dsv4moe/status.h"

/* One item: its key and value, pointers into the list (not terminated). */
typedef struct {
    const char *key, *val;
    size_t key_len, val_len;
} dsv4_param;

/*
 * The item at *cursor (a list or NULL) into *item, *cursor past it: 1 when an item was read, 0 at
 * the end, -1 (err set) when the item is not key=value. backend and keys name the refusal
 * ("backend cpu params: 'x' is not key=value (keys: kernels)").
 */
int dsv4_params_next(const char **cursor, dsv4_param *item, const char *backend, const char *keys, dsv4_error *err);

/* Whether the item's key, or value, is the text s. */
bool dsv4_param_key_is(const dsv4_param *p, const char *s);
bool dsv4_param_val_is(const dsv4_param *p, const char *s);

/* The refusals: the item's key is not one of keys; its value is not one of allowed (a text such
   as "auto|exact"). Both DSV4_ERR_INVALID_ARG. */
dsv4_status dsv4_param_unknown_key(const dsv4_param *p, const char *backend, const char *keys, dsv4_error *err);
dsv4_status dsv4_param_bad_value(const dsv4_param *p, const char *backend, const char *allowed, dsv4_error *err);

#endif
