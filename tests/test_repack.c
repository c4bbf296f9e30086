/*
 * The CUDA backend's fragment-native weight layout (fast/cuda/repack.c, fast/cuda/fragment.h),
 * checked on the CPU: the nibble -> e4m3 bit placement for every byte, and whole products
 * computed the way the kernels read the layout (one warp's 32 lanes building mma.m16n8k32 A and
 * B fragments, the instruction emulated per the PTX fragment tables, the per-step and per-block
 * scales applied as the kernels apply them) against a direct dot product of the checkpoint's
 * values. A layout or indexing mistake shows up here, before any GPU runs it.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/rng.h"
#include "fast/cuda/fragment.h"
#include "fast/cuda/repack.h"

Suite *repack_suite(void);

static float f32_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

START_TEST(nibble_to_e4m3_every_byte)
{
    /* every pair of nibbles, in every byte position: lo gives run A's e4m3 byte, hi run B's, each
       worth e2m1 * 2^-6 (the sign of a zero kept) */
    for (uint32_t na = 0; na < 16; na++)
        for (uint32_t nb = 0; nb < 16; nb++)
            for (int pos = 0; pos < 4; pos++) {
                uint32_t other = dsv4_fn_fp4_byte(15 - na, (nb + 5) & 15);
                uint32_t w = (dsv4_fn_fp4_byte(na, nb) << (8 * pos)) | (other << (8 * ((pos + 1) & 3)));
                uint8_t lo = (uint8_t)(dsv4_fn_lo(w) >> (8 * pos)), hi = (uint8_t)(dsv4_fn_hi(w) >> (8 * pos));
                float want_lo = dsv4_e2m1_to_f32((uint8_t)na) / 64.0f, want_hi = dsv4_e2m1_to_f32((uint8_t)nb) / 64.0f;
                ck_assert_msg(dsv4_e4m3_to_f32(lo) == want_lo && signbit(dsv4_e4m3_to_f32(lo)) == signbit(want_lo),
                              "nibbles %x/%x pos %d lo: %02x", na, nb, pos, lo);
                ck_assert_msg(dsv4_e4m3_to_f32(hi) == want_hi && signbit(dsv4_e4m3_to_f32(hi)) == signbit(want_hi),
                              "nibbles %x/%x pos %d hi: %02x", na, nb, pos, hi);
            }
    /* the step scale: 2^(s - 127) * 2^6 for every accepted byte, in every byte position */
    for (uint32_t sc = 0; sc <= DSV4_FN_FP4_SCALE_MAX; sc++)
        for (int c = 0; c < 4; c++) {
            uint32_t bytes = (dsv4_fn_fp4_scale_store(sc) << (8 * c)) | (0xA5u << (8 * ((c + 2) & 3)));
            ck_assert_float_eq(f32_bits(dsv4_fn_fp4_scale_bits(bytes, c)), ldexpf(dsv4_ue8m0_to_f32((uint8_t)sc), 6));
        }
    /* the fragment word: byte i holds run A's element i and run B's element i */
    for (int e = 0; e < 8; e++) {
        uint32_t nat = 0x9u << (4 * e), frag = dsv4_fn_fp4_word(nat);
        int byte = e & 3, runb = e >= 4;
        ck_assert_uint_eq(frag, (runb ? dsv4_fn_fp4_byte(0, 9) : dsv4_fn_fp4_byte(9, 0)) << (8 * byte));
    }
}
END_TEST

/* D[16][8] += A . B per mma.sync.m16n8k32 (e4m3), built from the 32 lanes' registers. */
static void emulate_mma(uint32_t a[32][4], uint32_t b[32][2], double d[16][8])
{
    uint8_t A[16][32], B[32][8];
    for (int lane = 0; lane < 32; lane++) {
        int gid = lane / 4, tig = lane % 4;
        for (int i = 0; i < 4; i++) {
            A[gid][4 * tig + i] = (uint8_t)(a[lane][0] >> (8 * i));
            A[gid + 8][4 * tig + i] = (uint8_t)(a[lane][1] >> (8 * i));
            A[gid][16 + 4 * tig + i] = (uint8_t)(a[lane][2] >> (8 * i));
            A[gid + 8][16 + 4 * tig + i] = (uint8_t)(a[lane][3] >> (8 * i));
            B[4 * tig + i][gid] = (uint8_t)(b[lane][0] >> (8 * i));
            B[16 + 4 * tig + i][gid] = (uint8_t)(b[lane][1] >> (8 * i));
        }
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int k = 0; k < 32; k++)
                s += (double)dsv4_e4m3_to_f32(A[m][k]) * (double)dsv4_e4m3_to_f32(B[k][n]);
            d[m][n] = s;
        }
}

/*
 * out[tok][row] for the repacked matrix, as the kernels compute it: per (tile, k128 block), four
 * k32 steps; fp4: each step's partial times the row's step scale, the block's sum times the
 * token's activation scale; fp8: the four steps chained, times block scale and activation scale.
 * Rows are numbered in tile order (tile t, half h, gid -> 16 t + 8 h + gid).
 */
static void emulate_gemm(int fp4, const uint8_t *w, const uint8_t *ws, int64_t tiles, int64_t k, const uint8_t *x,
                         const float *xs, int ntok, double *out)
{
    const int64_t kbs = k / 128;
    for (int64_t t = 0; t < tiles; t++)
        for (int j0 = 0; j0 < ntok; j0 += 8) {
            double acc[16][8] = {{0}};
            for (int64_t kb = 0; kb < kbs; kb++) {
                double blk[16][8] = {{0}};
                const uint8_t *chunk = w + (uint64_t)(t * kbs + kb) * (fp4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK);
                for (int c = 0; c < 4; c++) {
                    uint32_t a[32][4], b[32][2];
                    for (int lane = 0; lane < 32; lane++) {
                        int gid = lane / 4, tig = lane % 4;
                        if (fp4) {
                            uint32_t wa = rd32(chunk + lane * 16 + c * 4), wb = rd32(chunk + 512 + lane * 16 + c * 4);
                            a[lane][0] = dsv4_fn_lo(wa), a[lane][1] = dsv4_fn_lo(wb);
                            a[lane][2] = dsv4_fn_hi(wa), a[lane][3] = dsv4_fn_hi(wb);
                        } else {
                            const uint8_t *h0 = chunk + (c / 2) * 512 + lane * 16 + (c & 1) * 8;
                            const uint8_t *h1 = chunk + (2 + c / 2) * 512 + lane * 16 + (c & 1) * 8;
                            a[lane][0] = rd32(h0), a[lane][2] = rd32(h0 + 4);
                            a[lane][1] = rd32(h1), a[lane][3] = rd32(h1 + 4);
                        }
                        int tok = j0 + gid;
                        const uint8_t *xb = x + (uint64_t)(tok < ntok ? tok : 0) * k + kb * 128 + c * 32 + 4 * tig;
                        b[lane][0] = tok < ntok ? rd32(xb) : 0;
                        b[lane][1] = tok < ntok ? rd32(xb + 16) : 0;
                    }
                    double d[16][8];
                    emulate_mma(a, b, d);
                    for (int m = 0; m < 16; m++) {
                        double sw = 1;
                        if (fp4) {
                            const uint8_t *sc = ws + (uint64_t)(t * kbs + kb) * DSV4_FN_FP4_SCHUNK + (m % 8) * 8 + (m / 8) * 4;
                            sw = f32_bits(dsv4_fn_fp4_scale_bits(rd32(sc), c));
                        }
                        for (int n = 0; n < 8; n++)
                            blk[m][n] += d[m][n] * sw;
                    }
                }
                for (int m = 0; m < 16; m++)
                    for (int n = 0; n < 8 && j0 + n < ntok; n++) {
                        double sw = 1;
                        if (!fp4) {
                            const float *fs = (const float *)(const void *)(ws + (uint64_t)(t * kbs + kb) * DSV4_FN_FP8_SCHUNK);
                            sw = fs[m / 8];
                        }
                        acc[m][n] += blk[m][n] * sw * xs[(j0 + n) * kbs + kb];
                    }
            }
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 8 && j0 + n < ntok; n++)
                    out[(uint64_t)(j0 + n) * (tiles * 16) + t * 16 + m] = acc[m][n];
        }
}

/* The checkpoint's value of row r, element kk, and the tile-order row of (matrix, row). */
static double ref_weight(int fp4, const dsv4_fn_src *s, int64_t k, int64_t r, int64_t kk)
{
    const uint8_t *row = s->data + (uint64_t)r * s->row_bytes;
    if (fp4) {
        uint8_t byte = row[kk / 2];
        return (double)dsv4_e2m1_to_f32(kk & 1 ? byte >> 4 : byte & 15) * dsv4_ue8m0_to_f32(s->scales[r * (k / 32) + kk / 32]);
    }
    int64_t si = (r / 128) * ((k + 127) / 128) + kk / 128;
    float sc;
    if (s->sfp32)
        memcpy(&sc, s->scales + si * 4, 4);
    else
        sc = dsv4_ue8m0_to_f32(s->scales[si]);
    return (double)dsv4_e4m3_to_f32(row[kk]) * sc;
}

static void check_product(int fp4, int interleaved, int sfp32, int64_t n, int64_t k, int ntok, uint64_t seed)
{
    const uint64_t key = dsv4_rng_key(seed, "repack");
    uint64_t ctr = 0;
#define NEXT() dsv4_rng_u64(key, ctr++)
    const int nm = interleaved ? 2 : 1;
    uint64_t rb = fp4 ? (uint64_t)k / 2 + 8 : (uint64_t)k + 16; /* unaligned row stride */
    dsv4_fn_src src[2];
    uint8_t *data[2], *scl[2];
    for (int m = 0; m < nm; m++) {
        data[m] = malloc(rb * (uint64_t)n);
        uint64_t sbytes = fp4 ? (uint64_t)(n * (k / 32)) : (uint64_t)(((n + 127) / 128) * (k / 128)) * (sfp32 ? 4 : 1);
        scl[m] = malloc(sbytes);
        ck_assert(data[m] && scl[m]);
        for (uint64_t i = 0; i < rb * (uint64_t)n; i++) {
            uint8_t v = (uint8_t)NEXT();
            if (!fp4 && (v & 0x7F) == 0x7F)
                v ^= 1; /* no NaN codes: the comparison is numeric */
            data[m][i] = v;
        }
        if (fp4 || !sfp32) {
            for (uint64_t i = 0; i < sbytes; i++)
                scl[m][i] = (uint8_t)(110 + NEXT() % 30);
            if (fp4) {
                scl[m][0] = 0; /* 2^-127, a subnormal fp32 scale */
                scl[m][sbytes - 1] = DSV4_FN_FP4_SCALE_MAX;
            }
        } else {
            for (uint64_t i = 0; i < sbytes / 4; i++) {
                float f = (float)(0.001 + (double)(NEXT() % 1000) * 1e-5);
                memcpy(scl[m] + 4 * i, &f, 4);
            }
        }
        src[m].data = data[m], src[m].row_bytes = rb, src[m].scales = scl[m], src[m].sfp32 = sfp32;
    }
    uint64_t db, sb;
    dsv4_fn_sizes(fp4, n, k, interleaved, &db, &sb);
    uint8_t *w = malloc(db), *ws = malloc(sb);
    ck_assert(w && ws);
    memset(w, 0xCD, db);
    if (fp4) {
        int which = -1;
        int64_t brow = -1, bgrp = -1;
        uint8_t smin = 0, smax = 0;
        ck_assert_int_eq(dsv4_fn_repack_fp4(&src[0], interleaved ? &src[1] : NULL, n, k, w, ws, &which, &brow, &bgrp,
                                            &smin, &smax), 0);
        ck_assert_uint_eq(smin, 0);
        ck_assert_uint_eq(smax, DSV4_FN_FP4_SCALE_MAX);
    } else {
        dsv4_fn_repack_fp8(&src[0], interleaved ? &src[1] : NULL, n, k, w, (float *)(void *)ws);
    }
    uint8_t *x = malloc((uint64_t)ntok * k);
    float *xs = malloc(sizeof(float) * (uint64_t)ntok * (k / 128));
    ck_assert(x && xs);
    for (uint64_t i = 0; i < (uint64_t)ntok * k; i++) {
        uint8_t v = (uint8_t)NEXT();
        x[i] = (v & 0x7F) == 0x7F ? 0 : v;
    }
    for (int64_t i = 0; i < ntok * (k / 128); i++)
        xs[i] = ldexpf(1.0f, -(int)(NEXT() % 8));
    const int64_t tiles = dsv4_fn_tiles(n, interleaved), rows = tiles * 16;
    double *got = malloc(sizeof(double) * (uint64_t)ntok * rows);
    ck_assert(got);
    emulate_gemm(fp4, w, ws, tiles, k, x, xs, ntok, got);
    double worst = 0;
    for (int tok = 0; tok < ntok; tok++)
        for (int64_t t = 0; t < tiles; t++)
            for (int m = 0; m < 16; m++) {
                int h = m / 8, gid = m % 8;
                const dsv4_fn_src *s = interleaved ? &src[h] : &src[0];
                int64_t r = interleaved ? 8 * t + gid : 16 * t + m;
                double want = 0, mag = 0;
                for (int64_t kk = 0; kk < k; kk++) {
                    double xv = (double)dsv4_e4m3_to_f32(x[(uint64_t)tok * k + kk]) * xs[tok * (k / 128) + kk / 128];
                    double p = xv * ref_weight(fp4, s, k, r, kk);
                    want += p;
                    mag += fabs(p);
                }
                double g = got[(uint64_t)tok * rows + t * 16 + m];
                double rel = fabs(g - want) / (mag > 0 ? mag : 1);
                if (rel > worst)
                    worst = rel;
                ck_assert_msg(rel < 1e-12, "fp4 %d il %d tok %d tile %lld row %d: %.17g want %.17g", fp4, interleaved,
                              tok, (long long)t, m, g, want);
            }
    ck_assert(worst < 1e-12);
#undef NEXT
    free(got), free(x), free(xs), free(w), free(ws);
    for (int m = 0; m < nm; m++)
        free(data[m]), free(scl[m]);
}

START_TEST(fp4_plain_product)
{
    check_product(1, 0, 0, 32, 256, 5, 11);
    check_product(1, 0, 0, 16, 128, 9, 12);
}
END_TEST

START_TEST(fp4_interleaved_product)
{
    check_product(1, 1, 0, 16, 256, 8, 13);
    check_product(1, 1, 0, 8, 384, 3, 14);
}
END_TEST

START_TEST(fp8_products)
{
    check_product(0, 0, 0, 32, 256, 6, 15);
    check_product(0, 0, 1, 144, 256, 2, 16); /* two 128-row scale blocks, fp32 scales */
    check_product(0, 1, 0, 16, 128, 8, 17);
    check_product(0, 1, 1, 136, 256, 4, 18);
}
END_TEST

START_TEST(fp4_scale_out_of_range)
{
    int64_t n = 16, k = 128;
    uint8_t data[16 * 64], sc[16 * 4];
    memset(data, 0x11, sizeof data);
    memset(sc, 127, sizeof sc);
    sc[5 * 4 + 2] = DSV4_FN_FP4_SCALE_MAX + 1;
    dsv4_fn_src s = {data, 64, sc, 0};
    uint8_t w[DSV4_FN_FP4_CHUNK], ws[DSV4_FN_FP4_SCHUNK];
    int which = -1;
    int64_t row = -1, grp = -1;
    ck_assert_int_eq(dsv4_fn_repack_fp4(&s, NULL, n, k, w, ws, &which, &row, &grp, NULL, NULL), 1);
    ck_assert_int_eq(which, 0);
    ck_assert_int_eq(row, 5);
    ck_assert_int_eq(grp, 2);
    sc[5 * 4 + 2] = 255; /* NaN scale: also refused (the fast path would lose the NaN) */
    ck_assert_int_eq(dsv4_fn_repack_fp4(&s, NULL, n, k, w, ws, NULL, NULL, NULL, NULL, NULL), 1);
    sc[5 * 4 + 2] = DSV4_FN_FP4_SCALE_MAX;
    ck_assert_int_eq(dsv4_fn_repack_fp4(&s, NULL, n, k, w, ws, NULL, NULL, NULL, NULL, NULL), 0);
    /* interleaved: the second matrix is named */
    uint8_t sc2[8 * 4];
    memset(sc2, 127, sizeof sc2);
    sc2[3 * 4] = 250;
    dsv4_fn_src a = {data, 64, sc, 0}, b = {data, 64, sc2, 0};
    ck_assert_int_eq(dsv4_fn_repack_fp4(&a, &b, 8, k, w, ws, &which, &row, &grp, NULL, NULL), 1);
    ck_assert_int_eq(which, 1);
    ck_assert_int_eq(row, 3);
    ck_assert_int_eq(grp, 0);
    uint64_t db, sb;
    dsv4_fn_sizes(1, 8, 128, 1, &db, &sb);
    ck_assert_uint_eq(db, DSV4_FN_FP4_CHUNK);
    ck_assert_uint_eq(sb, DSV4_FN_FP4_SCHUNK);
    dsv4_fn_sizes(0, 256, 512, 0, &db, &sb);
    ck_assert_uint_eq(db, 16 * 4 * DSV4_FN_FP8_CHUNK);
    ck_assert_uint_eq(sb, 16 * 4 * DSV4_FN_FP8_SCHUNK);
}
END_TEST

Suite *repack_suite(void)
{
    Suite *s = suite_create("repack");
    TCase *tc = tcase_create("repack");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, nibble_to_e4m3_every_byte);
    tcase_add_test(tc, fp4_plain_product);
    tcase_add_test(tc, fp4_interleaved_product);
    tcase_add_test(tc, fp8_products);
    tcase_add_test(tc, fp4_scale_out_of_range);
    suite_add_tcase(s, tc);
    return s;
}
