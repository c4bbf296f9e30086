/*
 * Host repacking into the fragment-native layout (fast/cuda/fragment.h, repack.h). Pure byte
 * moves: the values the kernels see are exactly the checkpoint's.
 */
#include "repack.h"

#include <string.h>

#include "dsv4moe/formats.h"
#include "fragment.h"

int64_t dsv4_fn_tiles(int64_t n, int interleaved) { return interleaved ? n / 8 : n / 16; }

void dsv4_fn_sizes(int fmt_fp4, int64_t n, int64_t k, int interleaved, uint64_t *data, uint64_t *scales)
{
    uint64_t chunks = (uint64_t)dsv4_fn_tiles(n, interleaved) * (uint64_t)(k / 128);
    *data = chunks * (fmt_fp4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK);
    *scales = chunks * (fmt_fp4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK);
}

/* The source matrix and row of row half h, row gid of tile t. */
static const dsv4_fn_src *src_row(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t t, int h, int gid,
                                  int64_t *row)
{
    if (b) {
        *row = 8 * t + gid;
        return h ? b : a;
    }
    *row = 16 * t + 8 * h + gid;
    return a;
}

static void store_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

int dsv4_fn_repack_fp4(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t n, int64_t k, uint8_t *dst,
                       uint8_t *dst_scales, int *bad_which, int64_t *bad_row, int64_t *bad_group, uint8_t *smin,
                       uint8_t *smax)
{
    const int64_t tiles = dsv4_fn_tiles(n, b != NULL), kbs = k / 128, groups = k / 32;
    uint8_t lo = 255, hi = 0;
    for (int64_t t = 0; t < tiles; t++)
        for (int h = 0; h < 2; h++)
            for (int gid = 0; gid < 8; gid++) {
                int64_t r;
                const dsv4_fn_src *s = src_row(a, b, t, h, gid, &r);
                const uint8_t *row = s->data + (uint64_t)r * s->row_bytes;
                const uint8_t *srow = s->scales + r * groups;
                for (int64_t kb = 0; kb < kbs; kb++) {
                    uint8_t *chunk = dst + (uint64_t)(t * kbs + kb) * DSV4_FN_FP4_CHUNK + (uint64_t)h * 512;
                    for (int tig = 0; tig < 4; tig++)
                        for (int c = 0; c < 4; c++) {
                            /* elements 4 tig .. + 3 and 16 + 4 tig .. + 3 of the step: 2 bytes each */
                            const uint8_t *na = row + (kb * 128 + c * 32 + 4 * tig) / 2, *nb = na + 8;
                            uint32_t nat = (uint32_t)na[0] | (uint32_t)na[1] << 8 | (uint32_t)nb[0] << 16 |
                                         (uint32_t)nb[1] << 24;
                            store_u32(chunk + (gid * 4 + tig) * 16 + c * 4, dsv4_fn_fp4_word(nat));
                        }
                    uint8_t *sc = dst_scales + (uint64_t)(t * kbs + kb) * DSV4_FN_FP4_SCHUNK + gid * 8 + h * 4;
                    for (int c = 0; c < 4; c++) {
                        uint8_t v = srow[kb * 4 + c];
                        if (v > DSV4_FN_FP4_SCALE_MAX) {
                            if (bad_which)
                                *bad_which = s == b;
                            if (bad_row)
                                *bad_row = r;
                            if (bad_group)
                                *bad_group = kb * 4 + c;
                            return 1;
                        }
                        sc[c] = (uint8_t)dsv4_fn_fp4_scale_store(v);
                        lo = v < lo ? v : lo;
                        hi = v > hi ? v : hi;
                    }
                }
            }
    if (smin)
        *smin = lo;
    if (smax)
        *smax = hi;
    return 0;
}

void dsv4_fn_repack_fp8(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t n, int64_t k, uint8_t *dst,
                        float *dst_scales)
{
    const int64_t tiles = dsv4_fn_tiles(n, b != NULL), kbs = k / 128, sk = (k + 127) / 128;
    for (int64_t t = 0; t < tiles; t++)
        for (int h = 0; h < 2; h++)
            for (int gid = 0; gid < 8; gid++) {
                int64_t r;
                const dsv4_fn_src *s = src_row(a, b, t, h, gid, &r);
                const uint8_t *row = s->data + (uint64_t)r * s->row_bytes;
                for (int64_t kb = 0; kb < kbs; kb++) {
                    uint8_t *chunk = dst + (uint64_t)(t * kbs + kb) * DSV4_FN_FP8_CHUNK;
                    for (int tig = 0; tig < 4; tig++)
                        for (int c = 0; c < 4; c++) {
                            uint8_t *d = chunk + (2 * h + c / 2) * 512 + (gid * 4 + tig) * 16 + (c & 1) * 8;
                            memcpy(d, row + kb * 128 + c * 32 + 4 * tig, 4);
                            memcpy(d + 4, row + kb * 128 + c * 32 + 16 + 4 * tig, 4);
                        }
                    if (gid == 0) {
                        int64_t si = (r / 128) * sk + kb;
                        float v;
                        if (s->sfp32)
                            memcpy(&v, s->scales + si * 4, 4);
                        else
                            v = dsv4_ue8m0_to_f32(s->scales[si]);
                        dst_scales[(t * kbs + kb) * 2 + h] = v;
                    }
                }
            }
}
