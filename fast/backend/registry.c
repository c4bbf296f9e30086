/*
 * The backend registry (fast/backend/backend_reg.h, dsv4moe/backend.h): the list of the
 * backends' registration functions, each in its backend's folder, and the backends registered
 * from outside the library. What a backend is, can do and costs comes from its registration;
 * this file only lists and looks up.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "fast/backend/backend_reg.h"
#include "core/err.h"

/* In dsv4_backend_kind order. */
static const dsv4_backend_reg_fn LIST[] = {dsv4_ref_backend_reg, dsv4_cpu_backend_reg, dsv4_cuda_backend_reg};
#define N_LIST (int)(sizeof LIST / sizeof LIST[0])

/* Registered with dsv4_backend_register: kinds N_LIST, N_LIST + 1, ... */
#define MAX_ADDED 4
static const dsv4_backend_reg *ADDED[MAX_ADDED];
static int n_added;

int dsv4_backend_count(void) { return N_LIST + n_added; }

const dsv4_backend_reg *dsv4_backend_registry_at(int index)
{
    if (index < 0 || index >= dsv4_backend_count())
        return NULL;
    return index < N_LIST ? LIST[index]() : ADDED[index - N_LIST];
}

const dsv4_backend_reg *dsv4_backend_registry_find(dsv4_backend_kind kind)
{
    return dsv4_backend_registry_at((int)kind);
}

static void fill_built(void);
static pthread_once_t built_once = PTHREAD_ONCE_INIT;

dsv4_status dsv4_backend_register(const dsv4_backend_reg *reg, dsv4_error *err)
{
    if (!reg || !reg->name || !reg->name[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend register", "the registration and its name must be set");
    if (n_added == MAX_ADDED)
        return dsv4_seterr(err, DSV4_ERR_RANGE, "backend register", "%d backends are registered already (at most %d "
                           "besides the library's)", n_added, MAX_ADDED);
    if ((int)reg->kind != dsv4_backend_count())
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend register",
                           "backend %s has kind %d; the next kind is %d", reg->name, (int)reg->kind,
                           dsv4_backend_count());
    for (int i = 0; i < dsv4_backend_count(); i++)
        if (!strcmp(dsv4_backend_registry_at(i)->name, reg->name))
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend register", "the name %s is taken", reg->name);
    ADDED[n_added++] = reg;
    pthread_once(&built_once, fill_built);
    fill_built();
    return DSV4_OK;
}

dsv4_status dsv4_backend_unregister(const dsv4_backend_reg *reg, dsv4_error *err)
{
    if (!n_added || ADDED[n_added - 1] != reg)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend unregister",
                           "%s is not the last backend registered", reg && reg->name ? reg->name : "(null)");
    ADDED[--n_added] = NULL;
    pthread_once(&built_once, fill_built);
    fill_built();
    return DSV4_OK;
}

const char *dsv4_backend_kind_name(dsv4_backend_kind b)
{
    const dsv4_backend_reg *r = dsv4_backend_registry_find(b);
    return r ? r->name : "unknown";
}

void dsv4_backend_names_with(bool (*want)(const dsv4_backend_reg *), const char *last_sep, char *buf, size_t n)
{
    const dsv4_backend_reg *pick[N_LIST + MAX_ADDED];
    int k = 0;
    for (int i = 0; i < dsv4_backend_count(); i++)
        if (!want || want(dsv4_backend_registry_at(i)))
            pick[k++] = dsv4_backend_registry_at(i);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && len < n; i++) {
        int w = snprintf(buf + len, n - len, "%s%s", !i ? "" : i == k - 1 ? last_sep : ", ", pick[i]->name);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

static bool built(const dsv4_backend_reg *r) { return r->create != NULL; }

/* The built backends' names and every registered one's, filled once (and again by
   dsv4_backend_register, which runs before anything else). */
static char built_names[128], all_names[128];
static void fill_built(void)
{
    dsv4_backend_names_with(built, ", ", built_names, sizeof built_names);
    dsv4_backend_names_with(NULL, " or ", all_names, sizeof all_names);
}

const char *dsv4_backends_available(void)
{
    pthread_once(&built_once, fill_built);
    return built_names;
}

const char *dsv4_backends_registered(void)
{
    pthread_once(&built_once, fill_built);
    return all_names;
}

static bool has_stages(const dsv4_backend_reg *e)
{
    return e->stages && e->stages->route && e->stages->experts && e->stages->combine;
}

static void fill_info(const dsv4_backend_reg *e, dsv4_backend_info *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = (uint32_t)sizeof *o;
    o->name = e->name;
    o->kind = e->kind;
    o->built = e->create != NULL;
    o->sharded = e->caps.sharding && has_stages(e);
    if (!o->built) {
        snprintf(o->why, sizeof o->why, "backend %s is not available in this build (available: %s)", e->name,
                 dsv4_backends_available());
        return;
    }
    o->available = !e->available || e->available(o->why, sizeof o->why);
    if (o->available)
        o->why[0] = '\0';
    else if (!o->why[0])
        snprintf(o->why, sizeof o->why, "backend %s cannot run on this machine", e->name);
}

dsv4_status dsv4_backend_info_at(int index, dsv4_backend_info *out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend registry", "out must not be NULL");
    if (index < 0 || index >= dsv4_backend_count())
        return dsv4_seterr(err, DSV4_ERR_RANGE, "backend registry", "index %d is outside [0, %d)", index,
                           dsv4_backend_count());
    fill_info(dsv4_backend_registry_at(index), out);
    return DSV4_OK;
}

dsv4_status dsv4_backend_info_of(dsv4_backend_kind kind, dsv4_backend_info *out, dsv4_error *err)
{
    const dsv4_backend_reg *e = dsv4_backend_registry_find(kind);
    if (!out || !e)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend registry", "%s", out ? "unknown backend kind" :
                           "out must not be NULL");
    fill_info(e, out);
    return DSV4_OK;
}

dsv4_status dsv4_backend_plan_supported(const dsv4_plan *plan, dsv4_error *err)
{
    if (!plan)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "plan must not be NULL");
    const dsv4_config *cfg = dsv4_plan_config(plan);
    const dsv4_shard *sh = dsv4_plan_shard(plan);
    const dsv4_backend_reg *e = dsv4_backend_registry_find(dsv4_plan_topology(plan)->backend);
    if (!e)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "backend kind %d is unknown",
                           (int)dsv4_plan_topology(plan)->backend);
    dsv4_backend_info info;
    fill_info(e, &info);
    if (!info.available)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "%s", info.why);
    if (sh->sharded && !info.sharded)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend " "plan",
                           "backend %s runs one unsharded rank (router local) and has no stages for router %s "
                           "(experts %lld of %lld, inter %lld of %lld)",
                           e->name, dsv4_router_kind_name(sh->router), (long long)sh->e_count,
                           (long long)cfg->n_routed_experts, (long long)sh->i_count, (long long)cfg->moe_inter_dim);
    char why[160] = "";
    if (e->supports && !e->supports(cfg, sh, why, sizeof why))
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "backend %s: %s", e->name, why);
    return DSV4_OK;
}
