/* Internal: the one path by which the library writes a file. Not installed. */
#ifndef DSV4MOE_CORE_FILEIO_H
#define DSV4MOE_CORE_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "dsv4moe/status.h"

/*
 * A file being written: a temporary "<path>.tmp.<pid>.<n>" created with O_EXCL in the
 * destination's folder (never through a name someone planted), registered so that
 * dsv4_files_remove_temporaries() can unlink it from a signal handler.
 *
 * The destination must be absent or a regular file. A symbolic link, a folder, a device,
 * a FIFO or a socket at `path` is refused (DSV4_ERR_IO naming it) before anything
 * is created: the writer never replaces /dev/null, and never turns a link into a file.
 * A regular destination keeps its permission bits; a new file gets 0666 & ~umask.
 */
typedef struct dsv4_outfile {
    int fd;
    int slot;     /* registry slot, -1 when the registry was full */
    mode_t mode;  /* applied before the rename; 0 = leave the umask's choice */
    int renamed;  /* set once the temporary is gone (renamed, or never created) */
    char *path;
    char *tmp;
} dsv4_outfile;

/* Checks the destination and creates the temporary; on error nothing exists and o->fd is -1. */
dsv4_status dsv4_out_begin(dsv4_outfile *o, const char *path, dsv4_error *err);
/* write(2) of all n bytes (chunks, EINTR retried); on error the file is aborted. */
dsv4_status dsv4_out_write(dsv4_outfile *o, const void *data, uint64_t n, dsv4_error *err);
/* fsync, mode, close, re-checks the destination, rename over it, fsync the folder; aborts on error. */
dsv4_status dsv4_out_commit(dsv4_outfile *o, dsv4_error *err);
/*
 * Commits n files as one unit: each is fsynced and closed first (a failure there, say a full
 * disk at the third, removes all n temporaries and changes nothing), then, holding an
 * exclusive flock on `lock_path` (created when absent; NULL: no lock), all n destinations
 * are checked and the n renames done. Concurrent callers with the same lock therefore never
 * leave files of two units side by side; a reader that takes LOCK_SH on it sees one unit.
 * Always consumes the n outfiles.
 */
dsv4_status dsv4_out_commit_all(dsv4_outfile *o, size_t n, const char *lock_path, dsv4_error *err);
/* Closes and removes the temporary. A no-op on an outfile already finished or never begun. */
void dsv4_out_abort(dsv4_outfile *o);

/* Writes data[0, len) to `path` through the steps above: all of it appears or nothing changes. */
dsv4_status dsv4_write_file_atomic(const char *path, const char *data, size_t len, dsv4_error *err);

/*
 * Checks that `path` may be replaced by a writer: absent or a regular file. Fills *mode with
 * the regular file's permission bits (0 when absent).
 */
dsv4_status dsv4_out_check_dest(const char *path, mode_t *mode, dsv4_error *err);

/* Reads the whole of a small regular file into a new NUL-terminated buffer (*out, freed by the
   caller; *len its bytes): anything but a regular file (a FIFO would block, /dev/zero never end;
   opened O_NONBLOCK, checked by fstat), a file over `max` bytes or one that grows while read is
   an error naming the path and `what` ("a config file", "a case.json"). The bounded reader of the
   library's small inputs: config files, case.json, collective traces. */
dsv4_status dsv4_read_small_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                                 dsv4_error *err);

/* "a folder", "a character device", "a FIFO", ... for messages. */
const char *dsv4_file_kind(mode_t mode);

/* mkdir -p: creates the folder and its parents (0755); an error names the one that failed, or a
   path that exists but is not a folder. */
dsv4_status dsv4_mkdir_p(const char *path, dsv4_error *err);

/* fsync of a folder (after a rename into it); errors other than EINVAL/EROFS are reported. */
dsv4_status dsv4_fsync_dir(const char *dir, dsv4_error *err);

/* Registers / releases a path for dsv4_files_remove_temporaries(); -1 when the registry is full. */
int dsv4_temp_register(const char *path);
void dsv4_temp_release(int slot);

#endif
