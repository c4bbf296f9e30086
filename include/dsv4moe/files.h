/*
 * dsv4moe: what the library's file writers leave behind when a process is interrupted.
 *
 * Every file the library writes (safetensors, reports, the scenario cache) is written
 * into a temporary "<dest>.tmp.<pid>.<n>" in the destination's folder, fsynced and
 * renamed over the destination. While one is being written its name is kept in a
 * fixed table (64 entries; a writer that finds it full still works, but its temporary
 * is not removed by the call below).
 */
#ifndef DSV4MOE_FILES_H
#define DSV4MOE_FILES_H

#include "dsv4moe/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Unlinks every temporary file being written right now. Async-signal-safe: call it from
 * a SIGINT/SIGTERM handler before re-raising the signal, so an interrupted run leaves the
 * destinations as they were and no temporary. The library installs no handler itself.
 */
DSV4_API void dsv4_files_remove_temporaries(void);

#ifdef __cplusplus
}
#endif
#endif
