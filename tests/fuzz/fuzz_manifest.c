/*
 * Fuzz target: the export manifest's reader (compare/manifest.c, dsv4_h_manifest_verify) against a
 * fixed folder holding one case folder "c0" (case.json "{}", expected.safetensors "x"); the input
 * is the manifest.json. It must verify or fail with a message, never crash or run past its cap.
 */
#include "tests/fuzz/fuzz_common.h"

#include "compare/engines_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char dir[512], p[700];
    snprintf(dir, sizeof dir, "%s/manifest", fuzz_dir());
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/c0", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/c0/case.json", dir);
    if (fuzz_write(p, (const uint8_t *)"{}", 2) != 0)
        return 0;
    snprintf(p, sizeof p, "%s/c0/expected.safetensors", dir);
    if (fuzz_write(p, (const uint8_t *)"x", 1) != 0)
        return 0;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    if (fuzz_write(p, data, size) != 0)
        return 0;
    char *names[1] = {"c0"};
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_h_manifest_verify(dir, names, 1, &err) != DSV4_OK && err.message[0] == '\0')
        abort();
    return 0;
}
