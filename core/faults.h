/*
 * Internal: the defect catalogue of the review in shared/seed/ (test builds only).
 *
 * Compiled in only with -DDSV4_FAULTS (`make faults`, objects under build/faults/):
 * a process-wide "active fault" that the planner, the CPU backend, the distributed
 * driver and the checkpoint loader consult at one or two lines each, to behave as
 * the reviewed engine did. In the release build DSV4_FAULT(id) is the constant 0,
 * every hook folds away, and nothing of this file reaches the library
 * (`nm build/libdsv4moe.a | grep -i fault` is empty). The reference (ref/) has no
 * hook: it must never carry a fault.
 *
 * The review lists thirteen defects in fourteen entries, numbered here in its order
 * (scenarios/seed-review.yaml uses the same numbers): entries 3 and 7 are one desync
 * reported for two strategies, so there is no F07 and the case of finding 7 names f03.
 *
 *   F01 planner/backend  routed experts of the fp8 per-block family run without the SwiGLU clamp
 *   F02 planner          one rank with dispatch all_gather refused, the message naming the wrong settings
 *   F03 driver           the step's plan collective issued only on eager ranks (graph replays skip it)
 *   F04 planner          cuda_graph on sm 10x falls back to masked, never validated under replay there
 *   F05 loader           the layout flag decided by the last file only (a later file overwrites it)
 *   F06 loader           non-e8m0 online quantization delivers the shared expert's 2D weights as [K, N]
 *   F08 backend          long prefills not chunked: the workspace grows with T without the plan's bound
 *   F09 planner          the refusal of fp8 + ep > 1 + cuda_graph does not name cuda_graph
 *   F10 driver           a step where every rank is empty still runs a zero-size chunk
 *   F11 backend          the router builds its sanitised tensors on every forward, even an empty one
 *   F12 driver           the top-p sentinel id (= n_routed_experts) reaches an executor unsanitised
 *   F13 planner          eager prefill of a graph-enabled single rank in the masked layout, no token bound
 *   F14 planner          low-latency dispatch accepted on a non-decode role (fails at the first prefill)
 */
#ifndef DSV4MOE_CORE_FAULTS_H
#define DSV4MOE_CORE_FAULTS_H

typedef enum dsv4_fault_id {
    DSV4_FAULT_NONE = 0,
    DSV4_FAULT_F01 = 1,
    DSV4_FAULT_F02 = 2,
    DSV4_FAULT_F03 = 3, /* findings 3 and 7 */
    DSV4_FAULT_F04 = 4,
    DSV4_FAULT_F05 = 5,
    DSV4_FAULT_F06 = 6,
    DSV4_FAULT_F08 = 8,
    DSV4_FAULT_F09 = 9,
    DSV4_FAULT_F10 = 10,
    DSV4_FAULT_F11 = 11,
    DSV4_FAULT_F12 = 12,
    DSV4_FAULT_F13 = 13,
    DSV4_FAULT_F14 = 14,
    DSV4_FAULT_END = 15 /* one past the largest id; 7 is not a defect of its own */
} dsv4_fault_id;

/* The thirteen defects. */
#define DSV4_FAULT_DEFECTS 13

#ifdef DSV4_FAULTS

/* Sets the process-wide active fault (DSV4_FAULT_NONE clears it). Set it while no forward runs. */
void dsv4_fault_set(dsv4_fault_id id);
dsv4_fault_id dsv4_fault_active(void);
/* "f01".."f14" for a defect id, NULL for NONE, 7 and anything out of range. */
const char *dsv4_fault_name(dsv4_fault_id id);
/* The id of "f01".."f14" (f07 gives F03, the same defect), DSV4_FAULT_NONE for anything else. */
dsv4_fault_id dsv4_fault_parse(const char *name);
/* The findings of the review an id stands for ("3, 7" for F03), its defect in a line, and where it is
   injected; "" for non-defects. */
const char *dsv4_fault_findings(dsv4_fault_id id);
const char *dsv4_fault_describe(dsv4_fault_id id);
const char *dsv4_fault_where(dsv4_fault_id id);

#define DSV4_FAULT(id) (dsv4_fault_active() == (id))

#else

#define DSV4_FAULT(id) 0

#endif
#endif
