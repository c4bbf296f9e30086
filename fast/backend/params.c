/* A backend's parameter list, item by item (fast/backend/params.h). */
#include <stdio.h>
#include <string.h>

#include "fast/backend/params.h"
#include "core/err.h"

/* The refusals' place: "backend NAME params". */
static const char *where(const char *backend, char *buf, size_t n)
{
    snprintf(buf, n, "backend %s params", backend);
    return buf;
}

int dsv4_params_next(const char **cursor, dsv4_param *item, const char *backend, const char *keys, dsv4_error *err)
{
    const char *p = *cursor;
    if (!p || !*p)
        return 0;
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', n);
    if (!eq) {
        char w[64];
        dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where(backend, w, sizeof w), "'%.*s' is not key=value (keys: %s)",
                    (int)n, p, keys);
        return -1;
    }
    item->key = p;
    item->key_len = (size_t)(eq - p);
    item->val = eq + 1;
    item->val_len = n - item->key_len - 1;
    *cursor = end ? end + 1 : p + n;
    return 1;
}

static bool same(const char *a, size_t n, const char *s) { return n == strlen(s) && !strncmp(a, s, n); }

bool dsv4_param_key_is(const dsv4_param *p, const char *s) { return same(p->key, p->key_len, s); }

bool dsv4_param_val_is(const dsv4_param *p, const char *s) { return same(p->val, p->val_len, s); }

dsv4_status dsv4_param_unknown_key(const dsv4_param *p, const char *backend, const char *keys, dsv4_error *err)
{
    char w[64];
    return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where(backend, w, sizeof w), "unknown key '%.*s' (keys: %s)",
                       (int)p->key_len, p->key, keys);
}

dsv4_status dsv4_param_bad_value(const dsv4_param *p, const char *backend, const char *allowed, dsv4_error *err)
{
    char w[64];
    return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where(backend, w, sizeof w), "'%.*s' is not a value of %.*s (%s)",
                       (int)p->val_len, p->val, (int)p->key_len, p->key, allowed);
}
