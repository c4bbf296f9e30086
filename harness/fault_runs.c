/* The defect catalogue's runs (harness/fault_runs.h); only in the fault build (make faults). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "core/err.h"
#include "harness/fault_runs.h"
#include "compare/results.h"
#include "core/testctl.h"

typedef struct {
    dsv4_fault_entry *e;
    size_t n;
} catalogue;

static void catalogue_free(catalogue *cat)
{
    for (size_t i = 0; i < cat->n; i++) {
        dsv4_fault_entry *f = &cat->e[i];
        free(f->id), free(f->hook), free(f->findings), free(f->defect), free(f->where);
    }
    free(cat->e);
    cat->e = NULL;
    cat->n = 0;
}

static const dsv4_fault_entry *find(const dsv4_fault_entry *e, size_t n, const char *id)
{
    for (size_t i = 0; id && i < n; i++)
        if (!strcmp(e[i].id, id))
            return &e[i];
    return NULL;
}

static const char *scalar(yaml_node_t *n) { return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL; }

/* The value of `key` in mapping m, as a scalar; NULL when absent or not a scalar. */
static const char *field(yaml_document_t *d, yaml_node_t *m, const char *key)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(d, p->key));
        if (k && !strcmp(k, key))
            return scalar(yaml_document_get_node(d, p->value));
    }
    return NULL;
}

static dsv4_status read_entries(const char *path, yaml_document_t *d, catalogue *cat, dsv4_error *err)
{
    yaml_node_t *root = yaml_document_get_root_node(d);
    yaml_node_t *faults = NULL;
    for (yaml_node_pair_t *p = root && root->type == YAML_MAPPING_NODE ? root->data.mapping.pairs.start : NULL;
         p && p < root->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(d, p->key));
        if (k && !strcmp(k, "faults"))
            faults = yaml_document_get_node(d, p->value);
    }
    if (!faults)
        return DSV4_OK;
    size_t n = (size_t)(faults->data.mapping.pairs.top - faults->data.mapping.pairs.start);
    if (faults->type != YAML_MAPPING_NODE || !(cat->e = calloc(n + 1, sizeof *cat->e)))
        return dsv4_seterr(err, faults->type != YAML_MAPPING_NODE ? DSV4_ERR_FORMAT : DSV4_ERR_NOMEM, path,
                           "faults: a mapping of defect ids to their hooks");
    for (yaml_node_pair_t *p = faults->data.mapping.pairs.start; p < faults->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key), *v = yaml_document_get_node(d, p->value);
        const char *id = scalar(k), *hook = v && v->type == YAML_MAPPING_NODE ? field(d, v, "hook") : NULL;
        size_t line = (k ? k->start_mark.line : 0) + 1, col = (k ? k->start_mark.column : 0) + 1;
        if (!id || !hook)
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                               "%zu:%zu: faults.%s: expected a mapping with a `hook` (and findings, defect, injected_at)",
                               line, col, id ? id : "?");
        if (dsv4_test_hook_parse(hook) == DSV4_HOOK_NONE) {
            char list[512] = "";
            for (int h = 1; h < DSV4_HOOK_COUNT; h++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", h > 1 ? ", " : "",
                         dsv4_test_hook_name((dsv4_test_hook)h));
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "%zu:%zu: faults.%s: unknown hook '%s' (one of: %s)", line,
                               col, id, hook, list);
        }
        const char *findings = field(d, v, "findings"), *defect = field(d, v, "defect"),
                   *where = field(d, v, "injected_at");
        dsv4_fault_entry *f = &cat->e[cat->n++];
        f->id = dsv4_h_strdup(id);
        f->hook = dsv4_h_strdup(hook);
        f->findings = dsv4_h_strdup(findings ? findings : "");
        f->defect = dsv4_h_strdup(defect ? defect : "");
        f->where = dsv4_h_strdup(where ? where : "");
        if (!f->id || !f->hook || !f->findings || !f->defect || !f->where)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    return DSV4_OK;
}

/* The `faults` mapping of the scenario file at path (none: an empty catalogue). */
static dsv4_status read_catalogue(const char *path, catalogue *cat, dsv4_error *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open the scenario file for its faults mapping: %s",
                           strerror(errno));
    yaml_parser_t p;
    yaml_document_t d;
    dsv4_status st = DSV4_OK;
    if (!yaml_parser_initialize(&p)) {
        fclose(fp);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    yaml_parser_set_input_file(&p, fp);
    if (!yaml_parser_load(&p, &d)) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "%zu:%zu: %s", p.problem_mark.line + 1,
                         p.problem_mark.column + 1, p.problem ? p.problem : "YAML error");
    } else {
        st = read_entries(path, &d, cat, err);
        yaml_document_delete(&d);
    }
    yaml_parser_delete(&p);
    fclose(fp);
    if (st)
        catalogue_free(cat);
    return st;
}

static const char *case_defect(void *user, const dsv4_scenario *scn, size_t i)
{
    (void)user;
    return dsv4_scenario_case_fault(scn, i);
}

static void inject(void *user, const char *defect, bool on)
{
    const catalogue *cat = user;
    const dsv4_fault_entry *f = find(cat->e, cat->n, defect);
    if (f)
        dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)dsv4_test_hook_parse(f->hook), on ? UINT64_MAX : (uint64_t)0);
}

const char *dsv4_case_defect(const dsv4_case_result *c) { return c ? c->defect : NULL; }
bool dsv4_case_injected(const dsv4_case_result *c) { return c && c->injected; }

dsv4_status dsv4_run_scenario_faults(const dsv4_scenario *scn, const dsv4_run_options *opts,
                                     dsv4_run_results **results, dsv4_error *err)
{
    if (!scn || !results)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "scenario and results must not be NULL");
    catalogue cat = {NULL, 0};
    const char *path = dsv4_scenario_path(scn);
    dsv4_status st = read_catalogue(path, &cat, err);
    if (st)
        return st;
    for (size_t i = 0; i < dsv4_scenario_count(scn); i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        const char *defect = dsv4_scenario_case_fault(scn, i);
        if (defect && (!opts || !opts->filter || strstr(sc->name, opts->filter)) && !find(cat.e, cat.n, defect)) {
            catalogue_free(&cat);
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                               "%d:%d: case '%s' names defect %s, which the file's `faults` mapping does not map to "
                               "a test hook",
                               sc->line, sc->col, sc->name, defect);
        }
    }
    dsv4_h_injector inj = {case_defect, inject, &cat};
    st = dsv4_h_run_scenario(scn, opts, &inj, results, err);
    dsv4_test_control(DSV4_TESTCTRL_RESET);
    dsv4_run_results *R = *results;
    /* The results keep the entries (the detection table's strings); a defect mapped twice keeps its first. */
    for (size_t i = 0; !st && R && i < cat.n; i++) {
        if (find(R->faults, R->nfaults, cat.e[i].id))
            continue;
        dsv4_fault_entry *nf = realloc(R->faults, (R->nfaults + 1) * sizeof *nf);
        if (!nf) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "run", "out of memory");
            break;
        }
        R->faults = nf;
        R->faults[R->nfaults++] = cat.e[i];
        memset(&cat.e[i], 0, sizeof cat.e[i]); /* moved into the results */
    }
    catalogue_free(&cat);
    return st;
}

size_t dsv4_run_fault_rows(const dsv4_run_results *R, dsv4_fault_row *rows, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; R && i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (c->injected || !c->defect || c->twin >= R->n)
            continue;
        const dsv4_case_result *f = R->cases[c->twin];
        const dsv4_fault_entry *e = find(R->faults, R->nfaults, c->defect);
        if (rows && k < max) {
            dsv4_fault_row *w = &rows[k];
            w->fault = c->defect;
            w->hook = e ? e->hook : "";
            w->findings = e ? e->findings : "";
            w->summary = e ? e->defect : "";
            w->where = e ? e->where : "";
            w->case_name = c->name;
            w->clean = c->status;
            w->injected = f->status;
            w->caught = c->status == DSV4_RESULT_PASS &&
                        (f->status == DSV4_RESULT_FAIL || f->status == DSV4_RESULT_ERROR);
            w->caught_by = f->caught_by ? f->caught_by : "";
        }
        k++;
    }
    return k;
}

dsv4_fault_summary dsv4_run_fault_summary(const dsv4_run_results *R)
{
    dsv4_fault_summary s;
    memset(&s, 0, sizeof s);
    size_t n = R ? R->nfaults : 0;
    bool *named = calloc(n + 1, sizeof *named), *missed = calloc(n + 1, sizeof *missed);
    for (size_t i = 0; R && named && missed && i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (c->injected)
            continue;
        s.clean_runs++;
        s.false_failures += c->status == DSV4_RESULT_FAIL || c->status == DSV4_RESULT_ERROR;
        const dsv4_fault_entry *e = find(R->faults, R->nfaults, c->defect);
        if (!e || c->twin >= R->n)
            continue;
        const dsv4_case_result *f = R->cases[c->twin];
        size_t id = (size_t)(e - R->faults);
        named[id] = true;
        missed[id] |= !(c->status == DSV4_RESULT_PASS &&
                        (f->status == DSV4_RESULT_FAIL || f->status == DSV4_RESULT_ERROR));
    }
    for (size_t id = 0; named && missed && id < n; id++) {
        s.defects += named[id];
        s.caught += named[id] && !missed[id];
    }
    s.mapped = n;
    free(named);
    free(missed);
    return s;
}
