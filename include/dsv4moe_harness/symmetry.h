/*
 * dsv4moe: collective traces of an engine's ranks, and the check that every rank issued the
 * same collectives in the same order (docs/engines.md, "Collective traces").
 *
 * Two input formats, detected from the file's content:
 *   - the JSONL trace that the project's communicators write (dsv4_trace_write_jsonl): a header
 *     line {"format": "dsv4moe-trace", "version": 1, "rank": R, "world": W}, then one line per
 *     collective {"seq", "group", "op", "dtype", "count", "counts_hash", "tag"};
 *   - PyTorch's flight-recorder dump in its JSON form (torch._C._distributed_c10d.
 *     _dump_nccl_trace_json(), or the file TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank> written with
 *     TORCH_NCCL_TRACE_BUFFER_SIZE > 0): {"version", "pg_config", "entries": [{"process_group":
 *     [name, desc], "collective_seq_id", "profiling_name", "input_sizes", "input_dtypes",
 *     "is_p2p", ...}]}. The dump does not name its rank: it comes from the digits that end the
 *     file name (nccl_trace_rank_3), else from the file's position in the call.
 */
#ifndef DSV4MOE_SYMMETRY_H
#define DSV4MOE_SYMMETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/comm.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_TRACE_FORMAT_VERSION 1

typedef enum dsv4_trace_format {
    DSV4_TRACE_JSONL = 0,          /* the project's communicators */
    DSV4_TRACE_FLIGHT_RECORDER = 1 /* torch.distributed's NCCL flight recorder, JSON */
} dsv4_trace_format;

typedef struct dsv4_trace dsv4_trace;

/*
 * Reads one rank's trace. `fallback_rank` is its rank when the file does not say (a flight-recorder
 * dump whose name does not end in digits). A malformed file is DSV4_ERR_FORMAT naming the file and
 * the line (JSONL) or entry; an unreadable one DSV4_ERR_IO.
 */
DSV4_API dsv4_status dsv4_trace_load(const char *path, int fallback_rank, dsv4_trace **out, dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_trace_free(dsv4_trace *trace);
DSV4_API dsv4_trace_format dsv4_trace_format_of(const dsv4_trace *trace);
DSV4_API int dsv4_trace_rank(const dsv4_trace *trace);
/* Collectives in the trace (point-to-point entries of a flight-recorder dump are not counted). */
DSV4_API size_t dsv4_trace_count(const dsv4_trace *trace);

typedef struct dsv4_symmetry_result {
    bool same;           /* every rank issued the same collectives */
    size_t compared;     /* collectives compared (over all pairs and groups) */
    int rank_a, rank_b;  /* the first divergence: the lower rank of the group and the other one */
    char detail[1600];   /* both ranks' entries at the divergence, or the summary when same */
} dsv4_symmetry_result;

/*
 * Compares the traces (one per rank, any order, one format): per group, each member rank's
 * sequence of collectives against the group's lowest rank, entry by entry: group, sequence
 * number, op, dtype and (for ops whose count must agree: not all_to_all(v), not a barrier)
 * the element count; JSONL traces also the tag. A rank that issued fewer collectives in a group
 * than another diverges where its sequence ends (the deadlock class). Of several divergences
 * the one earliest in the traces is reported. A flight-recorder ring that wrapped is aligned
 * on the group's sequence numbers first. Errors: fewer than 2 traces, mixed formats, two
 * traces of the same rank (DSV4_ERR_INVALID_ARG).
 */
DSV4_API dsv4_status dsv4_trace_symmetry(const dsv4_trace *const *traces, size_t n, dsv4_symmetry_result *out,
                                         dsv4_error *err);

/* Writes records as the JSONL trace of `rank` in a world of `world` ranks, atomically. */
DSV4_API dsv4_status dsv4_trace_write_jsonl(const dsv4_coll_record *records, size_t n, int rank, int world,
                                            const char *path, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
