/* Fuzz target: the YAML scenario parser (scenarios/parse.c) from a memory buffer. */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe_harness/scenario.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    if (!text)
        return 0;
    dsv4_scenario *scn = NULL;
    dsv4_error err;
    dsv4_status st = dsv4_scenario_load_string(text, "fuzz.yaml", &scn, &err);
    if (st == DSV4_OK) {
        /* Walk what was built, so a dangling pointer in a case shows up under ASan. */
        size_t n = dsv4_scenario_count(scn), acc = 0;
        for (size_t i = 0; i < n; i++) {
            const dsv4_scenario_case *c = dsv4_scenario_get(scn, i);
            if (!c)
                abort();
            acc += strlen(c->name);
        }
        if (dsv4_scenario_get(scn, n) != NULL)
            abort();
        acc += strlen(dsv4_scenario_name(scn));
        (void)acc;
    } else if (scn != NULL || err.message[0] == '\0') {
        abort(); /* the contract: *out NULL and a message on error */
    }
    dsv4_scenario_free(scn);
    free(text);
    return 0;
}
