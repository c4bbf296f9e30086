/*
 * The NCCL communicator's ids and environment (include/dsv4moe/comm_nccl.h): the unique id, its hex
 * form and id file, and the launcher's environment. The communicator itself is nccl_comm.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dsv4moe/comm_nccl.h"
#include "fast/comm/comm_impl.h"
#include "core/err.h"
#include "core/fileio.h"
#include "fast/comm/nccl/nccl_internal.h"

/* ---------------- ids, environment ---------------- */

void dsv4_nccl_options_init(dsv4_nccl_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->timeout_ms = 60000;
    opt->init_timeout_ms = 120000;
    opt->device = -1;
    opt->fingerprint = false;
    opt->native_reduce = false;
    opt->wait = true;
}

dsv4_status dsv4_nccl_unique_id(dsv4_nccl_id *id, dsv4_error *err)
{
    if (!id)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_unique_id", "id is NULL");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return dsv4_seterr(err, DSV4_ERR_COMM, "dsv4_nccl_unique_id", "ncclGetUniqueId failed: %s (%s)",
                           ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id->bytes, u.internal, DSV4_NCCL_ID_BYTES);
    return DSV4_OK;
}

dsv4_status dsv4_nccl_id_to_hex(const dsv4_nccl_id *id, char *buf, size_t n, dsv4_error *err)
{
    if (!id || !buf)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_id_to_hex", "%s is NULL", !id ? "id" : "buf");
    if (n < DSV4_NCCL_ID_HEX_LEN + 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_id_to_hex", "buffer of %zu bytes, need %d", n,
                           DSV4_NCCL_ID_HEX_LEN + 1);
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < DSV4_NCCL_ID_BYTES; i++) {
        buf[2 * i] = hx[id->bytes[i] >> 4];
        buf[2 * i + 1] = hx[id->bytes[i] & 15];
    }
    buf[DSV4_NCCL_ID_HEX_LEN] = '\0';
    return DSV4_OK;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

dsv4_status dsv4_nccl_id_from_hex(const char *hex, dsv4_nccl_id *id, dsv4_error *err)
{
    static const char fn[] = "nccl unique id (hex)";
    if (!hex || !id)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_id_from_hex", "%s is NULL", !hex ? "hex" : "id");
    const char *p = hex;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    dsv4_nccl_id tmp;
    for (int i = 0; i < DSV4_NCCL_ID_HEX_LEN; i++) {
        int v = hexval(p[i]);
        if (v < 0)
            return dsv4_seterr(err, DSV4_ERR_FORMAT, fn, "offset %ld: %s where hex digit %d of %d was expected",
                               (long)(p - hex) + i, p[i] ? "a non-hex character" : "end of text", i + 1,
                               DSV4_NCCL_ID_HEX_LEN);
        if (i % 2 == 0)
            tmp.bytes[i / 2] = (unsigned char)(v << 4);
        else
            tmp.bytes[i / 2] |= (unsigned char)v;
    }
    const char *q = p + DSV4_NCCL_ID_HEX_LEN;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
        q++;
    if (*q)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, fn, "offset %ld: text after the %d hex digits", (long)(q - hex),
                           DSV4_NCCL_ID_HEX_LEN);
    *id = tmp;
    return DSV4_OK;
}

dsv4_status dsv4_nccl_id_write_file(const char *path, const dsv4_nccl_id *id, dsv4_error *err)
{
    if (!path || !id)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_id_write_file", "%s is NULL", !path ? "path" : "id");
    char hex[DSV4_NCCL_ID_HEX_LEN + 2];
    dsv4_nccl_id_to_hex(id, hex, sizeof hex, NULL);
    hex[DSV4_NCCL_ID_HEX_LEN] = '\n';
    /* The library's one file-writing path: O_EXCL temporary, fsync, rename (core/fileio.c). */
    return dsv4_write_file_atomic(path, hex, DSV4_NCCL_ID_HEX_LEN + 1, err);
}

dsv4_status dsv4_nccl_id_read_file(const char *path, int timeout_ms, dsv4_nccl_id *id, dsv4_error *err)
{
    if (!path || !id)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_id_read_file", "%s is NULL", !path ? "path" : "id");
    double deadline = dsv4_nccl_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    FILE *f;
    while (!(f = fopen(path, "r"))) {
        if (errno != ENOENT)
            return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open the id file: %s", strerror(errno));
        if (dsv4_nccl_now_ms() > deadline)
            return dsv4_seterr(err, DSV4_ERR_COMM, path,
                               "the id file did not appear within %d ms (rank 0 never wrote it: is it running, "
                               "with the same DSV4_NCCL_ID_FILE?)",
                               timeout_ms);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char buf[DSV4_NCCL_ID_HEX_LEN + 64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    dsv4_status st = dsv4_nccl_id_from_hex(buf, id, err);
    if (st != DSV4_OK && err)
        snprintf(err->where, sizeof err->where, "%s", path);
    return st;
}

static int env_int(const char *const *names, int count, const char **used, long *val, dsv4_error *err,
                   dsv4_status *st)
{
    for (int i = 0; i < count; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v)
            continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || x < 0 || x > 1000000) {
            char where[64];
            snprintf(where, sizeof where, "environment variable %s", names[i]);
            *st = dsv4_seterr(err, DSV4_ERR_CONFIG, where, "'%s' is not a non-negative integer", v);
            return -1;
        }
        *used = names[i];
        *val = x;
        return 1;
    }
    return 0;
}

dsv4_status dsv4_nccl_env_read(dsv4_nccl_env *env, dsv4_error *err)
{
    static const char *const rank_v[] = {"DSV4_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    static const char *const world_v[] = {"DSV4_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                          "SLURM_NTASKS"};
    static const char *const local_v[] = {"DSV4_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID"};
    if (!env)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_nccl_env_read", "env is NULL");
    memset(env, 0, sizeof *env);
    env->local_rank = -1;
    dsv4_status st = DSV4_OK;
    const char *ru = NULL, *wu = NULL, *lu = NULL;
    long r = 0, w = 0, l = -1;
    int hr = env_int(rank_v, 5, &ru, &r, err, &st);
    if (hr < 0)
        return st;
    int hw = env_int(world_v, 5, &wu, &w, err, &st);
    if (hw < 0)
        return st;
    if (env_int(local_v, 5, &lu, &l, err, &st) < 0)
        return st;
    if (!hr)
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "environment variable DSV4_RANK",
                           "no rank: set DSV4_RANK (or start under torchrun, mpirun or srun, which set RANK, "
                           "OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)");
    if (!hw)
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "environment variable DSV4_WORLD_SIZE",
                           "no world size: set DSV4_WORLD_SIZE (or WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, "
                           "SLURM_NTASKS)");
    if (w < 1 || w > DSV4_COMM_MAX_RANKS) {
        char where[64];
        snprintf(where, sizeof where, "environment variable %s", wu);
        return dsv4_seterr(err, DSV4_ERR_CONFIG, where, "world size %ld is outside [1, %d]", w, DSV4_COMM_MAX_RANKS);
    }
    if (r >= w) {
        char where[64];
        snprintf(where, sizeof where, "environment variable %s", ru);
        return dsv4_seterr(err, DSV4_ERR_CONFIG, where, "rank %ld is not below the world size %ld (%s)", r, w, wu);
    }
    env->rank = (int)r;
    env->world = (int)w;
    env->local_rank = lu ? (int)l : -1;
    snprintf(env->rank_var, sizeof env->rank_var, "%s", ru);
    snprintf(env->world_var, sizeof env->world_var, "%s", wu);
    return DSV4_OK;
}

