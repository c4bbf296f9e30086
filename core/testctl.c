/* Test control (core/testctl.h); only in the fault build (make faults). */
#include "core/testctl.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

#ifndef DSV4_FAULTS
#error "core/testctl.c belongs to the fault build only (make faults defines DSV4_FAULTS)"
#endif

static _Atomic uint64_t hooks[DSV4_HOOK_COUNT];

static const char *const NAMES[DSV4_HOOK_COUNT] = {
    [DSV4_HOOK_DROP_ROUTED_CLAMP] = "drop_routed_clamp",
    [DSV4_HOOK_REFUSE_SINGLE_RANK_ALL_GATHER] = "refuse_single_rank_all_gather",
    [DSV4_HOOK_SKIP_METADATA_COLLECTIVE] = "skip_metadata_collective",
    [DSV4_HOOK_MASKED_GRAPH_ON_SM10X] = "masked_graph_on_sm10x",
    [DSV4_HOOK_LAYOUT_FROM_LAST_FILE] = "layout_from_last_file",
    [DSV4_HOOK_TRANSPOSE_SHARED_2D] = "transpose_shared_2d",
    [DSV4_HOOK_UNCHUNKED_PREFILL] = "unchunked_prefill",
    [DSV4_HOOK_REFUSAL_OMITS_CUDA_GRAPH] = "refusal_omits_cuda_graph",
    [DSV4_HOOK_ZERO_SIZE_CHUNK] = "zero_size_chunk",
    [DSV4_HOOK_ROUTER_WORK_ON_EMPTY] = "router_work_on_empty",
    [DSV4_HOOK_KEEP_SENTINEL_IDS] = "keep_sentinel_ids",
    [DSV4_HOOK_UNBOUNDED_MASKED_PREFILL] = "unbounded_masked_prefill",
    [DSV4_HOOK_LOW_LATENCY_ANY_ROLE] = "low_latency_any_role",
};

uint64_t dsv4_test_hook_value(dsv4_test_hook h)
{
    return (int)h > 0 && (int)h < DSV4_HOOK_COUNT ? atomic_load_explicit(&hooks[h], memory_order_relaxed) : 0;
}

const char *dsv4_test_hook_name(dsv4_test_hook h) { return (int)h > 0 && (int)h < DSV4_HOOK_COUNT ? NAMES[h] : NULL; }

dsv4_test_hook dsv4_test_hook_parse(const char *name)
{
    for (int i = 1; name && i < DSV4_HOOK_COUNT; i++)
        if (!strcmp(NAMES[i], name))
            return (dsv4_test_hook)i;
    return DSV4_HOOK_NONE;
}

int dsv4_test_control(int op, ...)
{
    va_list ap;
    va_start(ap, op);
    int rc = 0;
    switch (op) {
    case DSV4_TESTCTRL_HOOK_SET: {
        int h = va_arg(ap, int);
        uint64_t v = va_arg(ap, uint64_t);
        if (h > 0 && h < DSV4_HOOK_COUNT)
            atomic_store(&hooks[h], v);
        else
            rc = -1;
        break;
    }
    case DSV4_TESTCTRL_RESET:
        for (int i = 0; i < DSV4_HOOK_COUNT; i++)
            atomic_store(&hooks[i], 0);
        break;
    default: rc = -1; break;
    }
    va_end(ap);
    return rc;
}
