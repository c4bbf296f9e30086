/*
 * dsv4moe: status codes and the error-detail record.
 *
 * Every fallible function returns a dsv4_status and, when given a non-NULL
 * dsv4_error *, fills it with a message that names the place (file:line:col,
 * tensor key or config field), the bad value and the rule that was broken.
 * The library never prints; callers decide what to do with the message.
 */
#ifndef DSV4MOE_STATUS_H
#define DSV4MOE_STATUS_H

#include "dsv4moe/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_status {
    DSV4_OK = 0,
    DSV4_ERR_INVALID_ARG = 1, /* a caller passed NULL or an impossible argument */
    DSV4_ERR_CONFIG = 2,      /* a configuration value is outside its allowed range */
    DSV4_ERR_IO = 3,          /* open, read, write or rename failed */
    DSV4_ERR_FORMAT = 4,      /* a file is malformed (safetensors, JSON, YAML) */
    DSV4_ERR_SHAPE = 5,       /* a tensor's dtype or shape breaks the contract */
    DSV4_ERR_RANGE = 6,       /* an id or index is outside its range */
    DSV4_ERR_NOMEM = 7,       /* an allocation failed */
    DSV4_ERR_NOT_FOUND = 8,   /* a tensor, key or file does not exist */
    DSV4_ERR_UNSUPPORTED = 9, /* valid but not implemented by this build */
    DSV4_ERR_REFUSED = 10,    /* the planner refuses the topology */
    DSV4_ERR_NUMERIC = 11,    /* NaN or Inf where a finite value is required */
    DSV4_ERR_DEVICE = 12,     /* the accelerator runtime reported an error */
    DSV4_ERR_COMM = 13,       /* a collective failed or timed out */
    DSV4_ERR_INTERNAL = 14    /* an invariant of the library itself broke */
} dsv4_status;

/* Short fixed text for a status ("ok", "bad configuration", ...). Never NULL. */
DSV4_API const char *dsv4_status_str(dsv4_status status);

#define DSV4_ERROR_WHERE_MAX 256
#define DSV4_ERROR_MESSAGE_MAX 1024

/*
 * Error detail. `where` names the place: "file.safetensors: tensor 'k'",
 * "config field 'n_activated'", "x.yaml:3:7". `message` is the whole sentence,
 * starting with `where`, and includes the bad value and the rule.
 */
typedef struct dsv4_error {
    dsv4_status status;
    char where[DSV4_ERROR_WHERE_MAX];
    char message[DSV4_ERROR_MESSAGE_MAX];
} dsv4_error;

/* Resets to DSV4_OK with empty strings. NULL is a no-op. */
DSV4_API void dsv4_error_clear(dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
