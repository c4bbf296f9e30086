#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4moe/safetensors.h"
#include "tests/testutil.h"

Suite *safetensors_suite(void);

/* ---------------- helpers ---------------- */

/* A folder under the scratch folder, emptied of files from earlier runs. */
static char *fresh_dir(char *buf, size_t n, const char *name)
{
    tu_path(buf, n, name);
    mkdir(buf, 0755);
    DIR *d = opendir(buf);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", buf, de->d_name);
        unlink(p);
    }
    closedir(d);
    return buf;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Writes [hlen (8 bytes LE)][json][dlen bytes]; hlen = strlen(json) unless hlen_override. */
static void write_raw(const char *path, uint64_t hlen_override, const char *json, size_t dlen)
{
    size_t jl = strlen(json);
    uint64_t hl = hlen_override ? hlen_override : jl;
    unsigned char *b = malloc(8 + jl + dlen + 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + 8, json, jl);
    for (size_t i = 0; i < dlen; i++)
        b[8 + jl + i] = (unsigned char)i;
    ck_assert_int_eq(tu_write_file(path, b, 8 + jl + dlen), 0);
    free(b);
}

/* Opening `path` fails with `st`; the message holds the path and each of up to two substrings. */
static void expect_open_fails(const char *path, dsv4_status st, const char *s1, const char *s2)
{
    dsv4_st_file *f = (dsv4_st_file *)&f; /* must come back NULL */
    dsv4_error e;
    dsv4_error_clear(&e);
    dsv4_status got = dsv4_st_open(path, &f, &e);
    ck_assert_msg(got == st, "%s: status %d, want %d: %s", path, got, st, e.message);
    ck_assert_ptr_null(f);
    ck_assert_int_eq(e.status, st);
    ck_assert_msg(strstr(e.message, path), "message lacks the path: %s", e.message);
    ck_assert_msg(!s1 || strstr(e.message, s1), "message lacks '%s': %s", s1, e.message);
    ck_assert_msg(!s2 || strstr(e.message, s2), "message lacks '%s': %s", s2, e.message);
}

/* A file of F32 [1] tensors named names[0..n). */
static void write_names(const char *path, const char *const *names, size_t n)
{
    dsv4_st_writer *w;
    dsv4_error e;
    float v = 1.0f;
    int64_t one = 1;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(dsv4_st_writer_add(w, names[i], DSV4_DTYPE_F32, 1, &one, &v, &e) == DSV4_OK, "%s",
                      e.message);
    ck_assert_msg(dsv4_st_writer_write(w, path, NULL, NULL, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);
}

static void write_in(const char *dir, const char *file, const char *const *names, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    write_names(p, names, n);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    ck_assert_int_eq(tu_write_file(p, text, strlen(text)), 0);
}

/* Opening the checkpoint fails with st and a message holding each non-NULL substring. */
static void expect_ckpt_fails(const char *path, dsv4_status st, const char *s1, const char *s2, const char *s3,
                              const char *s4)
{
    dsv4_checkpoint *ck = (dsv4_checkpoint *)&ck;
    dsv4_error e;
    dsv4_error_clear(&e);
    dsv4_status got = dsv4_checkpoint_open(path, &ck, &e);
    ck_assert_msg(got == st, "%s: status %d, want %d: %s", path, got, st, e.message);
    ck_assert_ptr_null(ck);
    const char *subs[4] = {s1, s2, s3, s4};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(!subs[i] || strstr(e.message, subs[i]), "message lacks '%s': %s", subs[i], e.message);
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------- dtypes ---------------- */

START_TEST(dtype_table)
{
    static const struct {
        dsv4_dtype dt;
        const char *name;
        size_t size;
    } want[] = {
        {DSV4_DTYPE_BOOL, "BOOL", 1},   {DSV4_DTYPE_U8, "U8", 1},
        {DSV4_DTYPE_I8, "I8", 1},       {DSV4_DTYPE_U16, "U16", 2},
        {DSV4_DTYPE_I16, "I16", 2},     {DSV4_DTYPE_F16, "F16", 2},
        {DSV4_DTYPE_BF16, "BF16", 2},   {DSV4_DTYPE_U32, "U32", 4},
        {DSV4_DTYPE_I32, "I32", 4},     {DSV4_DTYPE_F32, "F32", 4},
        {DSV4_DTYPE_U64, "U64", 8},     {DSV4_DTYPE_I64, "I64", 8},
        {DSV4_DTYPE_F64, "F64", 8},     {DSV4_DTYPE_F8_E4M3, "F8_E4M3", 1},
        {DSV4_DTYPE_F8_E5M2, "F8_E5M2", 1}, {DSV4_DTYPE_F8_E8M0, "F8_E8M0", 1},
    };
    ck_assert_int_eq(N_OF(want), DSV4_DTYPE_COUNT);
    for (size_t i = 0; i < N_OF(want); i++) {
        ck_assert_str_eq(dsv4_dtype_name(want[i].dt), want[i].name);
        ck_assert_uint_eq(dsv4_dtype_size(want[i].dt), want[i].size);
        dsv4_dtype d = DSV4_DTYPE_COUNT;
        ck_assert_int_eq(dsv4_dtype_parse(want[i].name, &d), DSV4_OK);
        ck_assert_int_eq(d, want[i].dt);
    }
    dsv4_dtype d;
    ck_assert_int_eq(dsv4_dtype_parse("bf16", &d), DSV4_ERR_FORMAT); /* names are case-sensitive */
    ck_assert_int_eq(dsv4_dtype_parse("F4", &d), DSV4_ERR_FORMAT);
    ck_assert_str_eq(dsv4_dtype_name(DSV4_DTYPE_COUNT), "?");
    ck_assert_uint_eq(dsv4_dtype_size((dsv4_dtype)-1), 0);
    ck_assert_str_eq(dsv4_layout_name(DSV4_LAYOUT_SPLIT), "split");
    ck_assert_str_eq(dsv4_layout_name(DSV4_LAYOUT_STACKED), "stacked");
    ck_assert_str_eq(dsv4_layout_name(DSV4_LAYOUT_UNKNOWN), "unknown");
}
END_TEST

/* ---------------- writer -> reader ---------------- */

START_TEST(round_trip_dtypes_metadata_padding)
{
    char path[512];
    tu_path(path, sizeof path, "st_roundtrip.safetensors");
    uint16_t bf[6] = {0x3f80, 0xbf80, 0x4000, 0x0000, 0x7fc0, 0x8000};
    float f32[4] = {1.5f, -2.25f, 3.0e-8f, 65504.0f};
    int32_t i32[4] = {-1, 0, 2147483647, -2147483647 - 1};
    int8_t i8[5] = {-128, -1, 0, 1, 127};
    uint8_t e4m3[3] = {0x38, 0x7e, 0xfe}, e8m0[2] = {127, 130};
    float scalar = 42.0f;
    struct {
        const char *name;
        dsv4_dtype dt;
        int ndim;
        int64_t shape[3];
        const void *data;
        uint64_t nbytes;
    } t[] = {
        {"a.bf16", DSV4_DTYPE_BF16, 2, {2, 3}, bf, sizeof bf},
        {"b.f32", DSV4_DTYPE_F32, 1, {4}, f32, sizeof f32},
        {"c.empty", DSV4_DTYPE_BF16, 2, {0, 4}, NULL, 0},
        {"d.i32", DSV4_DTYPE_I32, 2, {2, 2}, i32, sizeof i32},
        {"e.i8", DSV4_DTYPE_I8, 1, {5}, i8, sizeof i8},
        {"f.scalar", DSV4_DTYPE_F32, 0, {0}, &scalar, sizeof scalar},
        {"g.e4m3", DSV4_DTYPE_F8_E4M3, 3, {3, 1, 1}, e4m3, sizeof e4m3},
        {"h.e8m0", DSV4_DTYPE_F8_E8M0, 1, {2}, e8m0, sizeof e8m0},
        {"i.empty_last", DSV4_DTYPE_F8_E8M0, 1, {0}, NULL, 0},
    };
    dsv4_st_writer *w;
    dsv4_error e;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_set_metadata(w, "format", "pt", &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_set_metadata(w, "note", "quote \" and \xc3\xa9", &e), DSV4_OK);
    const char dummy = 0;
    for (size_t i = 0; i < N_OF(t); i++)
        ck_assert_msg(dsv4_st_writer_add(w, t[i].name, t[i].dt, t[i].ndim, t[i].shape, t[i].data ? t[i].data : &dummy,
                                         &e) == DSV4_OK,
                      "%s", e.message);
    ck_assert_msg(dsv4_st_writer_write(w, path, NULL, NULL, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);

    /* Raw bytes: header length a multiple of 8, padding spaces, metadata first, data in declaration order. */
    size_t n;
    unsigned char *raw = tu_slurp(path, &n);
    ck_assert_ptr_nonnull(raw);
    uint64_t hl = le64(raw);
    ck_assert_uint_eq(hl % 8, 0);
    uint64_t total = 0;
    for (size_t i = 0; i < N_OF(t); i++)
        total += t[i].nbytes;
    ck_assert_uint_eq(n, 8 + hl + total);
    ck_assert_mem_eq(raw + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30);
    size_t jl = hl;
    while (jl > 0 && raw[8 + jl - 1] == ' ')
        jl--;
    ck_assert_int_eq(raw[8 + jl - 1], '}');
    ck_assert_uint_lt(hl - jl, 8);
    uint64_t off = 8 + hl;
    for (size_t i = 0; i < N_OF(t); i++) {
        if (t[i].nbytes)
            ck_assert_mem_eq(raw + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    free(raw);

    dsv4_st_file *f;
    ck_assert_msg(dsv4_st_open(path, &f, &e) == DSV4_OK, "%s", e.message);
    ck_assert_str_eq(dsv4_st_path(f), path);
    ck_assert_uint_eq(dsv4_st_count(f), N_OF(t));
    ck_assert_str_eq(dsv4_st_metadata(f, "format"), "pt");
    ck_assert_str_eq(dsv4_st_metadata(f, "note"), "quote \" and \xc3\xa9");
    ck_assert_ptr_null(dsv4_st_metadata(f, "absent"));
    uint64_t expect_off = 0;
    for (size_t i = 0; i < N_OF(t); i++) {
        const dsv4_tensor_info *ti = dsv4_st_find(f, t[i].name);
        ck_assert_ptr_nonnull(ti);
        ck_assert_str_eq(ti->name, t[i].name);
        ck_assert_str_eq(ti->file, path);
        ck_assert_int_eq(ti->dtype, t[i].dt);
        ck_assert_int_eq(ti->ndim, t[i].ndim);
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            ck_assert_int_eq(ti->shape[d], t[i].shape[d]);
            numel *= (uint64_t)t[i].shape[d];
        }
        ck_assert_uint_eq(ti->numel, numel);
        ck_assert_uint_eq(ti->nbytes, t[i].nbytes);
        ck_assert_uint_eq(ti->offset, expect_off);
        ck_assert_ptr_nonnull(ti->data);
        if (t[i].nbytes)
            ck_assert_mem_eq(ti->data, t[i].data, t[i].nbytes);
        expect_off += t[i].nbytes;
    }
    ck_assert_uint_eq(dsv4_st_find(f, "f.scalar")->numel, 1);
    ck_assert_uint_eq(dsv4_st_find(f, "c.empty")->numel, 0);
    /* Data order: the empty tensor at offset 24 comes before d.i32 at the same offset. */
    static const char *const order[] = {"a.bf16", "b.f32", "c.empty", "d.i32", "e.i8",
                                        "f.scalar", "g.e4m3", "h.e8m0", "i.empty_last"};
    for (size_t i = 0; i < N_OF(order); i++)
        ck_assert_str_eq(dsv4_st_tensor(f, i)->name, order[i]);
    ck_assert_ptr_null(dsv4_st_tensor(f, N_OF(t)));
    ck_assert_ptr_null(dsv4_st_find(f, "a"));
    ck_assert_ptr_null(dsv4_st_find(f, "__metadata__"));
    dsv4_st_close(f);
    dsv4_st_close(NULL);
}
END_TEST

START_TEST(empty_data_section)
{
    char path[512];
    dsv4_error e;
    dsv4_st_writer *w;
    dsv4_st_file *f;
    /* No tensors at all: the header is "{}" padded to 8, the data section empty. */
    tu_path(path, sizeof path, "st_empty.safetensors");
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, path, NULL, NULL, &e), DSV4_OK);
    size_t n;
    unsigned char *raw = tu_slurp(path, &n);
    ck_assert_ptr_nonnull(raw);
    ck_assert_uint_eq(n, 16);
    ck_assert_uint_eq(le64(raw), 8);
    ck_assert_mem_eq(raw + 8, "{}      ", 8);
    free(raw);
    ck_assert_msg(dsv4_st_open(path, &f, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_st_count(f), 0);
    dsv4_st_close(f);
    /* Only empty tensors, given through the fill callback path (data NULL). */
    int64_t z[2] = {3, 0};
    ck_assert_int_eq(dsv4_st_writer_add(w, "z1", DSV4_DTYPE_F32, 2, z, NULL, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "z0", DSV4_DTYPE_I8, 1, z + 1, NULL, &e), DSV4_OK);
    dsv4_st_writer_free(w);
    write_raw(path, 0,
              "{\"z1\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
              "\"z0\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
              0);
    ck_assert_msg(dsv4_st_open(path, &f, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_st_count(f), 2);
    ck_assert_str_eq(dsv4_st_tensor(f, 0)->name, "z0"); /* ties by name */
    ck_assert_str_eq(dsv4_st_tensor(f, 1)->name, "z1");
    ck_assert_uint_eq(dsv4_st_find(f, "z1")->nbytes, 0);
    ck_assert_int_eq(dsv4_st_find(f, "z1")->shape[0], 3);
    dsv4_st_close(f);
}
END_TEST

typedef struct {
    int calls;
    size_t seen[8];
    int fail_at; /* -1: never */
    int set_message;
} fill_ctx;

static dsv4_status fill_pattern(void *user, size_t index, const char *name, void *buf, uint64_t nbytes,
                                dsv4_error *err)
{
    fill_ctx *c = user;
    c->seen[c->calls++] = index;
    if ((int)index == c->fail_at) {
        if (c->set_message) {
            snprintf(err->message, sizeof err->message, "synthetic failure in %s", name);
            err->status = DSV4_ERR_NUMERIC;
        }
        return DSV4_ERR_NUMERIC;
    }
    unsigned char *b = buf;
    for (uint64_t i = 0; i < nbytes; i++)
        b[i] = (unsigned char)(index * 16 + i);
    return DSV4_OK;
}

START_TEST(fill_callback_path)
{
    char path[512];
    tu_path(path, sizeof path, "st_fill.safetensors");
    dsv4_st_writer *w;
    dsv4_error e;
    int64_t s4[1] = {4}, s23[2] = {2, 3}, s0[1] = {0};
    uint8_t given[4] = {9, 8, 7, 6};
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "t0", DSV4_DTYPE_U8, 1, s4, NULL, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "t1", DSV4_DTYPE_U8, 1, s4, given, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "t2", DSV4_DTYPE_I16, 2, s23, NULL, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "t3", DSV4_DTYPE_F32, 1, s0, NULL, &e), DSV4_OK);
    fill_ctx c = {.fail_at = -1};
    ck_assert_msg(dsv4_st_writer_write(w, path, fill_pattern, &c, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);
    /* Called for the tensors without data only, in declaration order, with their indices. */
    ck_assert_int_eq(c.calls, 3);
    ck_assert_uint_eq(c.seen[0], 0);
    ck_assert_uint_eq(c.seen[1], 2);
    ck_assert_uint_eq(c.seen[2], 3);
    dsv4_st_file *f;
    ck_assert_msg(dsv4_st_open(path, &f, &e) == DSV4_OK, "%s", e.message);
    const uint8_t *d0 = dsv4_st_find(f, "t0")->data, *d1 = dsv4_st_find(f, "t1")->data,
                  *d2 = dsv4_st_find(f, "t2")->data;
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_eq(d0[i], (unsigned)i);
        ck_assert_uint_eq(d1[i], given[i]);
    }
    ck_assert_uint_eq(dsv4_st_find(f, "t2")->nbytes, 12);
    for (int i = 0; i < 12; i++)
        ck_assert_uint_eq(d2[i], (unsigned)(32 + i));
    ck_assert_uint_eq(dsv4_st_find(f, "t3")->nbytes, 0);
    dsv4_st_close(f);
}
END_TEST

START_TEST(fill_error_leaves_no_file)
{
    char dir[512], path[1024];
    fresh_dir(dir, sizeof dir, "st_fillerr");
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    int64_t s[1] = {1000};
    for (int set_message = 0; set_message < 2; set_message++) {
        dsv4_st_writer *w;
        dsv4_error e;
        ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
        ck_assert_int_eq(dsv4_st_writer_add(w, "first", DSV4_DTYPE_F32, 1, s, NULL, &e), DSV4_OK);
        ck_assert_int_eq(dsv4_st_writer_add(w, "second", DSV4_DTYPE_F32, 1, s, NULL, &e), DSV4_OK);
        ck_assert_int_eq(dsv4_st_writer_add(w, "third", DSV4_DTYPE_F32, 1, s, NULL, &e), DSV4_OK);
        fill_ctx c = {.fail_at = 1, .set_message = set_message};
        ck_assert_int_eq(dsv4_st_writer_write(w, path, fill_pattern, &c, &e), DSV4_ERR_NUMERIC);
        ck_assert_int_eq(e.status, DSV4_ERR_NUMERIC);
        ck_assert_int_eq(c.calls, 2); /* stopped at the failing tensor */
        if (set_message)
            ck_assert_msg(strstr(e.message, "synthetic failure in second"), "%s", e.message);
        else
            ck_assert_msg(strstr(e.message, "fill callback failed (non-finite value)"), "%s", e.message);
        ck_assert_msg(strstr(e.message, path) && strstr(e.message, "tensor 'second'"), "%s", e.message);
        dsv4_st_writer_free(w);
        ck_assert(!tu_file_exists(path));
        ck_assert_int_eq(count_entries(dir), 0); /* the temporary file is gone too */
    }
    /* No fill callback for a tensor without data: refused before anything is created. */
    dsv4_st_writer *w;
    dsv4_error e;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "nodata", DSV4_DTYPE_F32, 1, s, NULL, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, path, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "'nodata'"));
    ck_assert_int_eq(count_entries(dir), 0);
    /* A folder that does not exist: an i/o error, nothing left behind. */
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
    float v[1000] = {0};
    dsv4_st_writer_free(w);
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "x", DSV4_DTYPE_F32, 1, s, v, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, bad, NULL, NULL, &e), DSV4_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.message, bad));
    dsv4_st_writer_free(w);
    ck_assert_int_eq(count_entries(dir), 0);
}
END_TEST

START_TEST(writer_rejects_bad_declarations)
{
    dsv4_st_writer *w;
    dsv4_error e;
    int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[2] = {2, -1};
    int64_t big[3] = {4294967296LL, 4294967296LL, 2}, huge[1] = {INT64_MAX / 2};
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "x", DSV4_DTYPE_F32, 1, s, NULL, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "x", DSV4_DTYPE_I8, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_msg(strstr(e.message, "'x'") && strstr(e.message, "already"), "%s", e.message);
    ck_assert_int_eq(dsv4_st_writer_add(w, "", DSV4_DTYPE_I8, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "__metadata__", DSV4_DTYPE_I8, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "bad\xff", DSV4_DTYPE_I8, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "nine", DSV4_DTYPE_I8, 9, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "minus", DSV4_DTYPE_I8, -1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "neg", DSV4_DTYPE_I8, 2, neg, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "-1"));
    ck_assert_int_eq(dsv4_st_writer_add(w, "ovf", DSV4_DTYPE_I8, 3, big, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "overflows"));
    ck_assert_int_eq(dsv4_st_writer_add(w, "dt", DSV4_DTYPE_COUNT, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_add(w, "h1", DSV4_DTYPE_I8, 1, huge, NULL, &e), DSV4_OK);
    /* Two of them no longer fit in signed 64-bit offsets. */
    ck_assert_int_eq(dsv4_st_writer_add(w, "h2", DSV4_DTYPE_I16, 1, huge, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_st_writer_set_metadata(w, "k", "v", &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_set_metadata(w, "k", "w", &e), DSV4_ERR_INVALID_ARG);
    dsv4_st_writer_free(w);
    dsv4_st_writer_free(NULL);
    /* Many names: the duplicate check holds as its table grows. */
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "t%d", i);
        ck_assert_int_eq(dsv4_st_writer_add(w, name, DSV4_DTYPE_U8, 1, s, NULL, &e), DSV4_OK);
    }
    for (int i = 0; i < 1000; i += 37) {
        snprintf(name, sizeof name, "t%d", i);
        ck_assert_int_eq(dsv4_st_writer_add(w, name, DSV4_DTYPE_U8, 1, s, NULL, &e), DSV4_ERR_INVALID_ARG);
    }
    dsv4_st_writer_free(w);
}
END_TEST

/* ---------------- corrupt files ---------------- */

#define F32_2(name, b, e) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" #b "," #e "]}"

static const struct {
    const char *label;
    const char *json;
    size_t data;
    const char *s1, *s2; /* the message holds them (besides the path) */
} corrupt[] = {
    {"invalid JSON", "{\"a\": ", 0, "not valid JSON", "line 1, column"},
    {"invalid JSON line 2", "{\n  \"a\": x}", 0, "not valid JSON", "line 2, column"},
    {"not an object", "[1, 2]", 0, "an array, not a JSON object", NULL},
    {"a string", "\"hello\"", 0, "a string, not a JSON object", NULL},
    {"duplicate keys", "{" F32_2("a", 0, 8) "," F32_2("a", 8, 16) "}", 16, "duplicate", NULL},
    {"entry not object", "{\"w\":5}", 0, "tensor 'w'", "not an object"},
    {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "empty name", NULL},
    {"unknown dtype", "{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'w'",
     "unknown dtype 'F7'"},
    {"dtype not string", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'w'",
     "dtype is an integer"},
    {"missing key", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "tensor 'w'", "lacks 'data_offsets'"},
    {"extra key", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}", 1, "tensor 'w'",
     "unknown key 'foo'"},
    {"shape not array", "{\"w\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 3, "tensor 'w'",
     "shape is an integer"},
    {"shape negative", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,0]}}", 0, "tensor 'w'",
     "shape[1] is -1, which is negative"},
    {"shape float", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, "tensor 'w'",
     "shape[0] is a real number"},
    {"shape string", "{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, "tensor 'w'",
     "shape[0] is a string"},
    {"too many dims", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
     "tensor 'w'", "9 dimensions"},
    {"numel overflow",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,0]}}", 0, "tensor 'w'",
     "element count of U8 [4294967296, 4294967296, 2] overflows"},
    {"nbytes overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
     "tensor 'w'", "size in bytes of F32 [4611686018427387904] overflows"},
    {"offsets not array", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":0}}", 1, "tensor 'w'",
     "data_offsets is an integer"},
    {"offsets one entry", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 1, "tensor 'w'",
     "data_offsets has 1 entries, not 2"},
    {"offsets three entries", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, "tensor 'w'",
     "data_offsets has 3 entries"},
    {"offsets reversed", "{" F32_2("w", 8, 0) "}", 8, "tensor 'w'", "[8, 0]: begin is after end"},
    {"offset negative", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, "tensor 'w'",
     "data_offsets[0] is -1"},
    {"offset float", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, "tensor 'w'",
     "data_offsets[1] is a real number"},
    {"nbytes mismatch", "{" F32_2("w", 0, 4) "}", 4, "tensor 'w'", "span 4 bytes, but F32 [2] needs 8"},
    {"past end", "{" F32_2("a", 0, 8) "," F32_2("w", 8, 16) "}", 12, "tensor 'w'", "past the end"},
    {"overlap", "{" F32_2("a", 0, 8) "," F32_2("b", 4, 12) "}", 12, "tensor 'b'", "overlap tensor 'a'"},
    {"gap", "{" F32_2("a", 0, 8) "," F32_2("b", 12, 20) "}", 20, "tensor 'b'", "gap: bytes [8, 12)"},
    {"gap at start", "{" F32_2("a", 4, 12) "}", 12, "tensor 'a'", "gap: bytes [0, 4)"},
    {"trailing bytes", "{" F32_2("a", 0, 8) "}", 11, "bytes [8, 11)", "belong to no tensor"},
    {"no tensors, data", "{}", 3, "bytes [0, 3)", NULL},
    {"empty inside another", "{" F32_2("a", 0, 8) ",\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}",
     8, "overlap", NULL},
    {"metadata not string", "{\"__metadata__\":{\"ok\":\"x\",\"k\":1}}", 0, "__metadata__", "'k' is an integer"},
    {"metadata not object", "{\"__metadata__\":[\"k\"]}", 0, "__metadata__ is an array", NULL},
    {"integer too big", "{\"w\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1,
     "not valid JSON", "too big"},
    {"invalid UTF-8", "{\"w\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "not valid JSON",
     NULL},
};

START_TEST(corrupt_header)
{
    char path[512], name[64];
    snprintf(name, sizeof name, "st_corrupt_%d.safetensors", _i);
    tu_path(path, sizeof path, name);
    write_raw(path, 0, corrupt[_i].json, corrupt[_i].data);
    dsv4_st_file *f = (dsv4_st_file *)&f;
    dsv4_error e;
    dsv4_status st = dsv4_st_open(path, &f, &e);
    ck_assert_msg(st == DSV4_ERR_FORMAT, "%s: status %d: %s", corrupt[_i].label, st, e.message);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(e.message, path), "%s: no path: %s", corrupt[_i].label, e.message);
    ck_assert_msg(!corrupt[_i].s1 || strstr(e.message, corrupt[_i].s1), "%s: lacks '%s': %s", corrupt[_i].label,
                  corrupt[_i].s1, e.message);
    ck_assert_msg(!corrupt[_i].s2 || strstr(e.message, corrupt[_i].s2), "%s: lacks '%s': %s", corrupt[_i].label,
                  corrupt[_i].s2, e.message);
    unlink(path);
}
END_TEST

START_TEST(corrupt_framing)
{
    char path[512];
    tu_path(path, sizeof path, "st_frame.safetensors");
    ck_assert_int_eq(tu_write_file(path, "", 0), 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "file is 0 bytes", "shorter than the 8-byte");
    ck_assert_int_eq(tu_write_file(path, "\x02\0\0\0\0", 5), 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "file is 5 bytes", NULL);
    write_raw(path, 100, "{\"a\":1}   ", 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "header length 100 exceeds file size 18", NULL);
    write_raw(path, 200u * 1024u * 1024u, "{}", 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "header length 209715200 exceeds the limit of 104857600", NULL);
    write_raw(path, UINT64_MAX, "{}", 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "header length 18446744073709551615", NULL);
    ck_assert_int_eq(tu_write_file(path, "\0\0\0\0\0\0\0\0{}", 10), 0);
    expect_open_fails(path, DSV4_ERR_FORMAT, "header length is 0", NULL);
    /* Open errors are i/o errors. */
    tu_path(path, sizeof path, "st_does_not_exist.safetensors");
    expect_open_fails(path, DSV4_ERR_IO, "cannot open", NULL);
    expect_open_fails(tu_tmpdir(), DSV4_ERR_IO, "not a regular file", NULL);
    /* A FIFO is refused at once rather than blocking the open. */
    tu_path(path, sizeof path, "st_fifo.safetensors");
    unlink(path);
    ck_assert_int_eq(mkfifo(path, 0644), 0);
    expect_open_fails(path, DSV4_ERR_IO, "not a regular file", NULL);
    expect_ckpt_fails(path, DSV4_ERR_IO, "neither a regular file nor a folder", NULL, NULL, NULL);
    unlink(path);
    dsv4_st_file *f;
    ck_assert_int_eq(dsv4_st_open(NULL, &f, NULL), DSV4_ERR_INVALID_ARG);
}
END_TEST

START_TEST(every_truncation_fails)
{
    char path[512], cut[512];
    tu_path(path, sizeof path, "st_full.safetensors");
    tu_path(cut, sizeof cut, "st_cut.safetensors");
    dsv4_st_writer *w;
    dsv4_error e;
    int64_t s2[2] = {3, 5}, s0[1] = {0}, s1[1] = {7};
    uint8_t data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_set_metadata(w, "m", "v", &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "a", DSV4_DTYPE_BF16, 2, s2, data, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "b", DSV4_DTYPE_U8, 1, s1, data, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_add(w, "z", DSV4_DTYPE_F32, 1, s0, data, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_writer_write(w, path, NULL, NULL, &e), DSV4_OK);
    dsv4_st_writer_free(w);
    size_t n;
    unsigned char *raw = tu_slurp(path, &n);
    ck_assert_ptr_nonnull(raw);
    dsv4_st_file *f;
    ck_assert_int_eq(dsv4_st_open(path, &f, &e), DSV4_OK);
    dsv4_st_close(f);
    for (size_t len = 0; len < n; len++) {
        ck_assert_int_eq(tu_write_file(cut, raw, len), 0);
        f = (dsv4_st_file *)&f;
        dsv4_error_clear(&e);
        dsv4_status st = dsv4_st_open(cut, &f, &e);
        ck_assert_msg(st == DSV4_ERR_FORMAT, "length %zu of %zu: status %d: %s", len, n, st, e.message);
        ck_assert_ptr_null(f);
        ck_assert_msg(strstr(e.message, cut), "length %zu: %s", len, e.message);
    }
    /* A truncation inside the data section says so. */
    ck_assert_int_eq(tu_write_file(cut, raw, n - 1), 0);
    expect_open_fails(cut, DSV4_ERR_FORMAT, "tensor 'b'", "truncated");
    free(raw);
}
END_TEST

/* ---------------- checkpoints ---------------- */

static const char *const split_a[] = {"layers.3.ffn.gate.weight", "layers.3.ffn.experts.0.w1.weight"};
static const char *const split_b[] = {"layers.3.ffn.experts.0.w2.weight", "layers.3.ffn.experts.0.w3.weight"};

START_TEST(checkpoint_single_file)
{
    char path[512];
    tu_path(path, sizeof path, "st_ck_single.safetensors");
    const char *names[] = {"layers.3.ffn.gate.weight", "layers.3.ffn.experts.0.w1.weight", "embed.weight"};
    write_names(path, names, 3);
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_msg(dsv4_checkpoint_open(path, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_checkpoint_file_count(ck), 1);
    ck_assert_str_eq(dsv4_checkpoint_file_path(ck, 0), path);
    ck_assert_ptr_null(dsv4_checkpoint_file_path(ck, 1));
    ck_assert_uint_eq(dsv4_checkpoint_tensor_count(ck), 3);
    ck_assert_str_eq(dsv4_checkpoint_tensor(ck, 0)->name, "embed.weight");
    ck_assert_str_eq(dsv4_checkpoint_tensor(ck, 1)->name, "layers.3.ffn.experts.0.w1.weight");
    ck_assert_str_eq(dsv4_checkpoint_tensor(ck, 2)->name, "layers.3.ffn.gate.weight");
    ck_assert_ptr_null(dsv4_checkpoint_tensor(ck, 3));
    const dsv4_tensor_info *t = dsv4_checkpoint_find(ck, "layers.3.ffn.gate.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, DSV4_DTYPE_F32);
    ck_assert_float_eq(*(const float *)t->data, 1.0f);
    ck_assert_ptr_null(dsv4_checkpoint_find(ck, "layers.3.ffn"));
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_SPLIT);
    ck_assert_str_eq(dsv4_checkpoint_prefix(ck), "");
    dsv4_checkpoint_close(ck);
    dsv4_checkpoint_close(NULL);
    tu_path(path, sizeof path, "st_ck_missing.safetensors");
    expect_ckpt_fails(path, DSV4_ERR_IO, path, NULL, NULL, NULL);
}
END_TEST

static const char *const index_ab =
    "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
    "\"layers.3.ffn.gate.weight\":\"a.safetensors\",\"layers.3.ffn.experts.0.w1.weight\":\"a.safetensors\","
    "\"layers.3.ffn.experts.0.w2.weight\":\"b.safetensors\",\"layers.3.ffn.experts.0.w3.weight\":\"b.safetensors\"}}";

START_TEST(checkpoint_index)
{
    char dir[512], idx[1024];
    fresh_dir(dir, sizeof dir, "st_ck_index");
    write_in(dir, "a.safetensors", split_a, 2);
    write_in(dir, "b.safetensors", split_b, 2);
    write_in(dir, "stray.safetensors", split_b, 1); /* not in the index: ignored */
    write_text(dir, "model.safetensors.index.json", index_ab);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    for (int via_json = 0; via_json < 2; via_json++) {
        dsv4_checkpoint *ck;
        dsv4_error e;
        ck_assert_msg(dsv4_checkpoint_open(via_json ? idx : dir, &ck, &e) == DSV4_OK, "%s", e.message);
        ck_assert_uint_eq(dsv4_checkpoint_file_count(ck), 2);
        ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_file_path(ck, 0), "/a.safetensors"));
        ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_file_path(ck, 1), "/b.safetensors"));
        ck_assert_uint_eq(dsv4_checkpoint_tensor_count(ck), 4);
        static const char *const sorted[] = {"layers.3.ffn.experts.0.w1.weight", "layers.3.ffn.experts.0.w2.weight",
                                             "layers.3.ffn.experts.0.w3.weight", "layers.3.ffn.gate.weight"};
        for (size_t i = 0; i < 4; i++)
            ck_assert_str_eq(dsv4_checkpoint_tensor(ck, i)->name, sorted[i]);
        const dsv4_tensor_info *t = dsv4_checkpoint_find(ck, "layers.3.ffn.experts.0.w3.weight");
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_nonnull(strstr(t->file, "/b.safetensors"));
        ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_find(ck, "layers.3.ffn.gate.weight")->file, "/a.safetensors"));
        ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_SPLIT);
        dsv4_checkpoint_close(ck);
    }
}
END_TEST

START_TEST(checkpoint_index_errors)
{
    char dir[512];
    fresh_dir(dir, sizeof dir, "st_ck_idxerr");
    write_in(dir, "a.safetensors", split_a, 2);
    write_in(dir, "b.safetensors", split_b, 2);
    /* A listed key that its file lacks. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"layers.3.ffn.gate.weight\":\"a.safetensors\","
               "\"layers.3.ffn.experts.0.w1.weight\":\"a.safetensors\",\"missing.key\":\"a.safetensors\","
               "\"layers.3.ffn.experts.0.w2.weight\":\"b.safetensors\","
               "\"layers.3.ffn.experts.0.w3.weight\":\"b.safetensors\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'missing.key'", "a.safetensors", "does not hold it", NULL);
    /* A tensor of a file that the index does not list. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"layers.3.ffn.gate.weight\":\"a.safetensors\","
               "\"layers.3.ffn.experts.0.w1.weight\":\"a.safetensors\","
               "\"layers.3.ffn.experts.0.w2.weight\":\"b.safetensors\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'layers.3.ffn.experts.0.w3.weight'", "b.safetensors", "not listed",
                      NULL);
    /* File names must be plain names in the index's folder. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"layers.3.ffn.gate.weight\":\"sub/a.safetensors\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'layers.3.ffn.gate.weight'", "'sub/a.safetensors'", "plain name", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"k\":\"..\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'k'", "'..'", NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"k\":\"\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'k'", "plain name", NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"k\":3}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'k'", "not a file name", NULL, NULL);
    /* A listed file that is not there. */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"k\":\"c.safetensors\"}}");
    expect_ckpt_fails(dir, DSV4_ERR_IO, "c.safetensors", "cannot open", NULL, NULL);
    /* Malformed index files. */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":\n{\"k\": }}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "line 2, column", NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{}, \"weight_map\":{}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "duplicate", NULL, NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "weight_map", NULL, NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "no tensors", NULL, NULL, NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"k\":\"a.safetensors\"},\"metadata\":1}");
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "\"metadata\" is an integer", NULL, NULL, NULL);
    /* A key in two files, listed for one of them. */
    const char *dup[] = {"layers.3.ffn.gate.weight"};
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"layers.3.ffn.gate.weight\":\"a.safetensors\","
               "\"layers.3.ffn.experts.0.w1.weight\":\"c.safetensors\"}}");
    write_in(dir, "c.safetensors", (const char *[]){"layers.3.ffn.gate.weight", "layers.3.ffn.experts.0.w1.weight"},
             2);
    write_in(dir, "a.safetensors", dup, 1);
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'layers.3.ffn.gate.weight'", "a.safetensors", "c.safetensors",
                      "two files");
}
END_TEST

START_TEST(checkpoint_folder_without_index)
{
    char dir[512];
    fresh_dir(dir, sizeof dir, "st_ck_folder");
    expect_ckpt_fails(dir, DSV4_ERR_NOT_FOUND, dir, "no", NULL, NULL);
    write_in(dir, "model-00002-of-00002.safetensors", split_b, 2);
    write_in(dir, "model-00001-of-00002.safetensors", split_a, 2);
    write_text(dir, "README.md", "not a tensor file");
    write_text(dir, "config.json", "{}");
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_msg(dsv4_checkpoint_open(dir, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_checkpoint_file_count(ck), 2);
    ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_file_path(ck, 0), "model-00001-of-00002.safetensors"));
    ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_file_path(ck, 1), "model-00002-of-00002.safetensors"));
    ck_assert_uint_eq(dsv4_checkpoint_tensor_count(ck), 4);
    ck_assert_ptr_nonnull(strstr(dsv4_checkpoint_find(ck, "layers.3.ffn.experts.0.w2.weight")->file, "00002-of"));
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_SPLIT);
    dsv4_checkpoint_close(ck);
    /* The same key in two files. */
    write_in(dir, "model-00003-of-00003.safetensors", split_a + 1, 1);
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'layers.3.ffn.experts.0.w1.weight'", "model-00001-of-00002.safetensors",
                      "model-00003-of-00003.safetensors", "two files");
    /* A corrupt member file names itself. */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/model-00003-of-00003.safetensors", dir);
    write_raw(bad, 0, "{", 0);
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, bad, "not valid JSON", NULL, NULL);
}
END_TEST

/* A split key in one file and a stacked one in the other, both ways round, with and without an index. */
START_TEST(checkpoint_mixed_layouts)
{
    static const char *const split[] = {"layers.0.ffn.gate.weight"};
    static const char *const stacked[] = {"layers.0.mlp.experts.gate_up_proj"};
    for (int swap = 0; swap < 2; swap++)
        for (int with_index = 0; with_index < 2; with_index++) {
            char dir[512];
            fresh_dir(dir, sizeof dir, "st_ck_mixed");
            write_in(dir, "a.safetensors", swap ? stacked : split, 1);
            write_in(dir, "b.safetensors", swap ? split : stacked, 1);
            if (with_index) {
                char idx[512];
                snprintf(idx, sizeof idx, "{\"weight_map\":{\"%s\":\"a.safetensors\",\"%s\":\"b.safetensors\"}}",
                         swap ? stacked[0] : split[0], swap ? split[0] : stacked[0]);
                write_text(dir, "model.safetensors.index.json", idx);
            }
            expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'layers.0.ffn.gate.weight'", "'layers.0.mlp.experts.gate_up_proj'",
                              "a.safetensors", "b.safetensors");
            dsv4_error e;
            dsv4_checkpoint *ck;
            ck_assert_int_eq(dsv4_checkpoint_open(dir, &ck, &e), DSV4_ERR_FORMAT);
            /* Same message either way round, but for which file holds which key. */
            const char *sp = strstr(e.message, "split layout (key 'layers.0.ffn.gate.weight' in ");
            ck_assert_ptr_nonnull(sp);
            ck_assert_ptr_nonnull(strstr(sp, swap ? "b.safetensors" : "a.safetensors"));
        }
}
END_TEST

START_TEST(checkpoint_stacked_prefix)
{
    char path[512];
    dsv4_checkpoint *ck;
    dsv4_error e;
    tu_path(path, sizeof path, "st_ck_stacked_model.safetensors");
    const char *pre[] = {"model.layers.5.mlp.experts.gate_up_proj", "model.layers.5.mlp.experts.down_proj",
                         "model.embed_tokens.weight"};
    write_names(path, pre, 3);
    ck_assert_msg(dsv4_checkpoint_open(path, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_STACKED);
    ck_assert_str_eq(dsv4_checkpoint_prefix(ck), "model.");
    dsv4_checkpoint_close(ck);

    tu_path(path, sizeof path, "st_ck_stacked_bare.safetensors");
    const char *bare[] = {"layers.12.mlp.gate.weight", "layers.12.mlp.experts.down_proj"};
    write_names(path, bare, 2);
    ck_assert_msg(dsv4_checkpoint_open(path, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_STACKED);
    ck_assert_str_eq(dsv4_checkpoint_prefix(ck), "");
    dsv4_checkpoint_close(ck);

    char dir[512];
    fresh_dir(dir, sizeof dir, "st_ck_prefixes");
    write_in(dir, "a.safetensors", pre, 1);
    write_in(dir, "b.safetensors", bare, 1);
    expect_ckpt_fails(dir, DSV4_ERR_FORMAT, "'model.layers.5.mlp.experts.gate_up_proj'",
                      "'layers.12.mlp.gate.weight'", "'model.' prefix", NULL);
}
END_TEST

START_TEST(checkpoint_unknown_layout)
{
    char path[512];
    tu_path(path, sizeof path, "st_ck_unknown.safetensors");
    /* Near misses of both patterns: no digits, a prefix on a split key, the pattern not at the start. */
    const char *names[] = {"embed.weight", "layers.x.ffn.gate.weight", "model.layers.1.ffn.gate.weight",
                           "xlayers.1.mlp.gate.weight", "layers.1.attn.wq.weight", "layers.1.ffnx.w"};
    write_names(path, names, N_OF(names));
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_msg(dsv4_checkpoint_open(path, &ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_UNKNOWN);
    ck_assert_str_eq(dsv4_checkpoint_prefix(ck), "");
    ck_assert_uint_eq(dsv4_checkpoint_tensor_count(ck), N_OF(names));
    dsv4_checkpoint_close(ck);
}
END_TEST

Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, dtype_table);
    tcase_add_test(tc, round_trip_dtypes_metadata_padding);
    tcase_add_test(tc, empty_data_section);
    tcase_add_test(tc, fill_callback_path);
    tcase_add_test(tc, fill_error_leaves_no_file);
    tcase_add_test(tc, writer_rejects_bad_declarations);
    tcase_add_loop_test(tc, corrupt_header, 0, (int)N_OF(corrupt));
    tcase_add_test(tc, corrupt_framing);
    tcase_add_test(tc, every_truncation_fails);
    tcase_add_test(tc, checkpoint_single_file);
    tcase_add_test(tc, checkpoint_index);
    tcase_add_test(tc, checkpoint_index_errors);
    tcase_add_test(tc, checkpoint_folder_without_index);
    tcase_add_test(tc, checkpoint_mixed_layouts);
    tcase_add_test(tc, checkpoint_stacked_prefix);
    tcase_add_test(tc, checkpoint_unknown_layout);
    suite_add_tcase(s, tc);
    return s;
}
