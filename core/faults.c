/* The defect catalogue's state (core/faults.h); only in the fault build (make faults). */
#include "faults.h"

#include <stdatomic.h>
#include <string.h>

#ifndef DSV4_FAULTS
#error "core/faults.c belongs to the fault build only (make faults defines DSV4_FAULTS)"
#endif

static _Atomic int active = DSV4_FAULT_NONE;

void dsv4_fault_set(dsv4_fault_id id) { atomic_store(&active, (int)id); }
dsv4_fault_id dsv4_fault_active(void) { return (dsv4_fault_id)atomic_load_explicit(&active, memory_order_relaxed); }

typedef struct {
    const char *name, *findings, *summary, *where;
} entry;

static const entry CATALOGUE[DSV4_FAULT_END] = {
    [DSV4_FAULT_F01] = {"f01", "1", "routed experts of the fp8 per-block family run without the SwiGLU clamp",
                        "fast/cpu/ffn.c dsv4_cpu_ffn()"},
    [DSV4_FAULT_F02] = {"f02", "2",
                        "one rank with dispatch all_gather is refused, the message naming the quantization, ep and "
                        "parallelism instead of the dispatch",
                        "fast/plan/plan.c check_topology()"},
    [DSV4_FAULT_F03] = {"f03", "3, 7", "the step's plan collective is issued on eager ranks only: graph-replaying "
                                       "ranks skip it (desync)",
                        "fast/dist/dist.c rank_main()"},
    [DSV4_FAULT_F04] = {"f04", "4", "cuda_graph on sm 10x falls back to masked, never validated under replay there",
                        "fast/plan/plan.c check_topology(), plan_graph()"},
    [DSV4_FAULT_F05] = {"f05", "5", "the layout flag is decided by the last file alone: a later file without the "
                                    "stacked keys flips it",
                        "core/safetensors.c detect_layout()"},
    [DSV4_FAULT_F06] = {"f06", "6", "non-e8m0 online quantization delivers the shared expert's 2D weights as [K, N]",
                        "core/weights.c matrix_stacked()"},
    [DSV4_FAULT_F08] = {"f08", "8", "long prefills run unchunked: the workspace grows with T beyond the plan's bound",
                        "fast/cpu/cpu.c dsv4_cpu_backend_create()"},
    [DSV4_FAULT_F09] = {"f09", "9", "the refusal of fp8 + ep > 1 + cuda_graph does not name cuda_graph",
                        "fast/plan/plan.c check_topology()"},
    [DSV4_FAULT_F10] = {"f10", "10", "a step where every rank is empty still runs a zero-size chunk",
                        "fast/dist/dist.c rank_main()"},
    [DSV4_FAULT_F11] = {"f11", "11", "the router builds its sanitised ids, weights and mask on every forward, before "
                                     "the branch that needs them (launches on an empty batch)",
                        "fast/cpu/cpu.c cpu_forward()"},
    [DSV4_FAULT_F12] = {"f12", "12", "the top-p sentinel id (= n_routed_experts) reaches an executor unsanitised",
                        "fast/dist/dist.c run_chunk()"},
    [DSV4_FAULT_F13] = {"f13", "13", "eager prefill of a graph-enabled single rank enters the masked layout with no "
                                     "token bound",
                        "fast/plan/plan.c dsv4_plan_create()"},
    [DSV4_FAULT_F14] = {"f14", "14", "low-latency dispatch is accepted on a non-decode role (fails at the first "
                                     "prefill request)",
                        "fast/plan/plan.c check_topology()"},
};

static const entry *lookup(dsv4_fault_id id)
{
    return (int)id > 0 && (int)id < DSV4_FAULT_END && CATALOGUE[id].name ? &CATALOGUE[id] : NULL;
}

const char *dsv4_fault_name(dsv4_fault_id id) { return lookup(id) ? lookup(id)->name : NULL; }
const char *dsv4_fault_findings(dsv4_fault_id id) { return lookup(id) ? lookup(id)->findings : ""; }
const char *dsv4_fault_describe(dsv4_fault_id id) { return lookup(id) ? lookup(id)->summary : ""; }
const char *dsv4_fault_where(dsv4_fault_id id) { return lookup(id) ? lookup(id)->where : ""; }

dsv4_fault_id dsv4_fault_parse(const char *name)
{
    if (!name)
        return DSV4_FAULT_NONE;
    if (!strcmp(name, "f07"))
        return DSV4_FAULT_F03;
    for (int i = 1; i < DSV4_FAULT_END; i++)
        if (CATALOGUE[i].name && !strcmp(CATALOGUE[i].name, name))
            return (dsv4_fault_id)i;
    return DSV4_FAULT_NONE;
}
