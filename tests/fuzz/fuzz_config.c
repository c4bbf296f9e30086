/*
 * Fuzz target: the `--set key=value` config parser (core/config.c). Each
 * input line is one dsv4_config_set_kv; a line holding a tab is split there
 * into dsv4_config_set(key, value). Failed sets must leave the config
 * unchanged; after the lines the config is validated and every key read back.
 */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    if (!text)
        return 0;
    dsv4_config cfg, before;
    dsv4_config_init(&cfg);
    dsv4_error err;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        before = cfg;
        char *tab = strchr(line, '\t');
        dsv4_status st;
        if (tab) {
            *tab = '\0';
            st = dsv4_config_set(&cfg, line, tab + 1, &err);
        } else {
            st = dsv4_config_set_kv(&cfg, line, &err);
        }
        if (st != DSV4_OK && (memcmp(&before, &cfg, sizeof cfg) != 0 || err.message[0] == '\0'))
            abort();
    }
    (void)dsv4_config_validate(&cfg, &err);
    char buf[256];
    for (const char *const *k = dsv4_config_keys(); *k; k++) {
        if (dsv4_config_get(&cfg, *k, buf, sizeof buf, &err) != DSV4_OK)
            abort();
        /* What get writes, set must take back. */
        dsv4_config copy = cfg;
        if (dsv4_config_set(&copy, *k, buf, &err) != DSV4_OK)
            abort();
    }
    free(text);
    return 0;
}
