/*
 * The one path by which the library writes a file (safetensors, reports, the cache).
 *
 * Why each step: the temporary is created with O_EXCL in the destination's folder, so a
 * name planted there (a symlink to /etc/passwd) is skipped, never written through, and the
 * rename stays within one file system; fsync before the rename, so a crash leaves the old
 * file or the whole new one; fsync of the folder after it, so the rename itself is durable.
 * Only an absent or regular destination is replaced (checked before the temporary exists
 * and again just before the rename): running as root, renaming over /dev/null would
 * replace the device node. Symbolic links are refused, not followed: following one would
 * write wherever the link points, replacing it would silently break it; the message tells
 * the user to name the target.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4moe/files.h"
#include "core/err.h"
#include "core/fileio.h"

/* ---------------- the registry of live temporaries ---------------- */

#define TEMP_SLOTS 64
enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_LIVE = 2 };

/* Fixed storage: a signal handler may read it at any moment, so nothing here is freed. */
static struct {
    atomic_int state;
    char path[PATH_MAX];
} temps[TEMP_SLOTS];

int dsv4_temp_register(const char *path)
{
    if (strlen(path) >= PATH_MAX)
        return -1;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expect = SLOT_FREE;
        if (atomic_compare_exchange_strong(&temps[i].state, &expect, SLOT_FILLING)) {
            strcpy(temps[i].path, path);
            atomic_store(&temps[i].state, SLOT_LIVE);
            return i;
        }
    }
    return -1;
}

void dsv4_temp_release(int slot)
{
    if (slot >= 0 && slot < TEMP_SLOTS)
        atomic_store(&temps[slot].state, SLOT_FREE);
}

void dsv4_files_remove_temporaries(void)
{
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (atomic_load(&temps[i].state) == SLOT_LIVE)
            unlink(temps[i].path); /* async-signal-safe */
}

/* Signals are blocked while a temporary comes into existence and is registered, and while it
 * is renamed away and released, so a handler never sees one without the other. */
static void block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

static void restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

/* ---------------- destination checks ---------------- */

static const char *errstr(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0)
        snprintf(buf, n, "error %d", e);
    return buf;
}

const char *dsv4_file_kind(mode_t m)
{
    return S_ISREG(m)    ? "a regular file"
           : S_ISLNK(m)  ? "a symbolic link"
           : S_ISDIR(m)  ? "a folder"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

dsv4_status dsv4_out_check_dest(const char *path, mode_t *mode, dsv4_error *err)
{
    char eb[128];
    struct stat sb;
    *mode = 0;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return DSV4_OK;
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot check the destination: %s", errstr(errno, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode))
        return dsv4_seterr(err, DSV4_ERR_IO, path,
                           "the destination is %s%s; only an absent path or a regular file is replaced",
                           dsv4_file_kind(sb.st_mode),
                           S_ISLNK(sb.st_mode) ? " (links are not followed: name the target itself)" : "");
    *mode = sb.st_mode & 07777;
    return DSV4_OK;
}

dsv4_status dsv4_fsync_dir(const char *dir, dsv4_error *err)
{
    char eb[128];
    int fd = open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot open the folder to sync it: %s",
                           errstr(errno, eb, sizeof eb));
    int e = fsync(fd) ? errno : 0;
    close(fd);
    /* Some file systems cannot sync a folder; the rename is done either way. */
    if (e && e != EINVAL && e != EROFS)
        return dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot sync the folder: %s", errstr(e, eb, sizeof eb));
    return DSV4_OK;
}

/* ---------------- the writer ---------------- */

dsv4_status dsv4_out_begin(dsv4_outfile *o, const char *path, dsv4_error *err)
{
    static atomic_uint counter;
    char eb[128];
    o->fd = -1;
    o->slot = -1;
    o->renamed = 1; /* nothing to remove until the temporary exists */
    o->path = o->tmp = NULL;
    if (!path || !path[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "file writer", "the destination path is empty");
    dsv4_status st = dsv4_out_check_dest(path, &o->mode, err);
    if (st)
        return st;
    size_t n = strlen(path) + 48;
    o->path = strdup(path);
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        dsv4_out_abort(o);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    sigset_t old;
    block_signals(&old);
    int e = EEXIST;
    for (unsigned tries = 0; o->fd < 0 && e == EEXIST && tries < 1000; tries++) {
        snprintf(o->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        e = o->fd < 0 ? errno : 0;
    }
    if (o->fd >= 0) {
        o->slot = dsv4_temp_register(o->tmp);
        o->renamed = 0;
    }
    restore_signals(&old);
    if (o->fd < 0) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot create a temporary file next to it (%s): %s", o->tmp,
                         errstr(e, eb, sizeof eb));
        dsv4_out_abort(o);
        return st;
    }
    return DSV4_OK;
}

/* Closes and removes the temporary unless it was renamed into place; frees the names. */
static void out_discard(dsv4_outfile *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp && !o->renamed) {
        sigset_t old;
        block_signals(&old);
        unlink(o->tmp);
        dsv4_temp_release(o->slot);
        restore_signals(&old);
    }
    o->fd = -1;
    o->slot = -1;
    o->renamed = 1;
    free(o->path);
    free(o->tmp);
    o->path = o->tmp = NULL;
}

void dsv4_out_abort(dsv4_outfile *o) { out_discard(o); }

dsv4_status dsv4_out_write(dsv4_outfile *o, const void *data, uint64_t n, dsv4_error *err)
{
    const char *p = data;
    char eb[128];
    while (n > 0) {
        /* Linux writes at most ~2 GiB at once. */
        size_t chunk = n > (1u << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t r = write(o->fd, p, chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : ENOSPC;
            dsv4_status st = dsv4_seterr(err, DSV4_ERR_IO, o->path, "cannot write %s: %s", o->tmp,
                                         errstr(e, eb, sizeof eb));
            dsv4_out_abort(o);
            return st;
        }
        p += r;
        n -= (uint64_t)r;
    }
    return DSV4_OK;
}

/* fsync, mode, close: the temporary is complete on disk. Aborts on error. */
static dsv4_status out_finish(dsv4_outfile *o, dsv4_error *err)
{
    char eb[128];
    int e = fsync(o->fd) ? errno : 0;
    if (!e && o->mode && fchmod(o->fd, o->mode) != 0)
        e = errno;
    int c = close(o->fd) ? errno : 0; /* close can report a deferred write error */
    o->fd = -1;
    if (!e)
        e = c;
    if (e) {
        dsv4_status st =
            dsv4_seterr(err, DSV4_ERR_IO, o->path, "cannot write %s: %s", o->tmp, errstr(e, eb, sizeof eb));
        out_discard(o);
        return st;
    }
    return DSV4_OK;
}

dsv4_status dsv4_out_commit_all(dsv4_outfile *o, size_t n, const char *lock_path, dsv4_error *err)
{
    char eb[128];
    dsv4_status st = DSV4_OK;
    for (size_t i = 0; i < n && !st; i++)
        st = out_finish(&o[i], err);
    int lk = -1;
    if (!st && lock_path) {
        lk = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);
        int e = lk < 0 ? errno : 0;
        struct stat lb;
        if (!e && fstat(lk, &lb) != 0)
            e = errno;
        if (!e && !S_ISREG(lb.st_mode)) {
            st = dsv4_seterr(err, DSV4_ERR_IO, lock_path, "the lock file is %s, not a regular file",
                             dsv4_file_kind(lb.st_mode));
            e = -1;
        }
        while (!e && flock(lk, LOCK_EX) != 0)
            if (errno != EINTR)
                e = errno;
        if (e > 0)
            st = dsv4_seterr(err, DSV4_ERR_IO, lock_path, "cannot lock: %s", errstr(e, eb, sizeof eb));
    }
    /* Something may have been put at a destination while we wrote: check all before renaming any. */
    mode_t mode;
    for (size_t i = 0; i < n && !st; i++)
        st = dsv4_out_check_dest(o[i].path, &mode, err);
    for (size_t i = 0; i < n && !st; i++) {
        sigset_t old;
        block_signals(&old);
        int e = rename(o[i].tmp, o[i].path) ? errno : 0;
        if (!e) {
            dsv4_temp_release(o[i].slot);
            o[i].slot = -1;
            o[i].renamed = 1;
        }
        restore_signals(&old);
        if (e)
            st = dsv4_seterr(err, DSV4_ERR_IO, o[i].path, "cannot rename %s into place: %s", o[i].tmp,
                             errstr(e, eb, sizeof eb));
    }
    if (lk >= 0)
        close(lk); /* releases the lock */
    if (!st) {
        const char *slash = strrchr(o[0].path, '/');
        if (slash)
            o[0].path[slash == o[0].path ? 1 : slash - o[0].path] = '\0';
        st = dsv4_fsync_dir(slash ? o[0].path : ".", err);
    }
    for (size_t i = 0; i < n; i++)
        out_discard(&o[i]);
    return st;
}

dsv4_status dsv4_out_commit(dsv4_outfile *o, dsv4_error *err) { return dsv4_out_commit_all(o, 1, NULL, err); }

dsv4_status dsv4_write_file_atomic(const char *path, const char *data, size_t len, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_out_begin(&o, path, err);
    if (!st)
        st = dsv4_out_write(&o, data, len, err);
    if (!st)
        st = dsv4_out_commit(&o, err);
    return st;
}

dsv4_status dsv4_read_small_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                                 dsv4_error *err)
{
    /* O_NONBLOCK: a FIFO must not hang the open before fstat refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open: %s", strerror(errno));
    struct stat sb;
    dsv4_status st = DSV4_OK;
    char *buf = NULL;
    size_t n = 0;
    if (fstat(fd, &sb) != 0) {
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "cannot stat: %s", strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        /* /dev/zero would be read forever, a FIFO would block. */
        st = dsv4_seterr(err, DSV4_ERR_IO, path, "is %s; %s must be a regular file", dsv4_file_kind(sb.st_mode),
                         what);
        goto done;
    }
    if ((uint64_t)sb.st_size > (uint64_t)max) {
        st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "is %lld bytes; %s is at most %zu bytes", (long long)sb.st_size,
                         what, max);
        goto done;
    }
    size_t cap = (size_t)sb.st_size + 1; /* one more than expected, to see a file that grew */
    if (!(buf = malloc(cap + 1))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
        goto done;
    }
    for (;;) {
        if (n == cap) { /* it grew since fstat */
            st = dsv4_seterr(err, DSV4_ERR_IO, path, "changed while being read (%lld bytes at open)",
                             (long long)sb.st_size);
            goto done;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = dsv4_seterr(err, DSV4_ERR_IO, path, "read error: %s", strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
done:
    close(fd);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return DSV4_OK;
}

dsv4_status dsv4_mkdir_p(const char *path, dsv4_error *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "folder",
                           "'%s' is not a folder path (empty, or 4096 bytes or more)", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char save = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return dsv4_seterr(err, DSV4_ERR_IO, buf, "cannot create folder: %s", strerror(errno));
            buf[i] = save;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return dsv4_seterr(err, DSV4_ERR_IO, path, "not a folder");
    return DSV4_OK;
}
