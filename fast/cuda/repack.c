/*
 * Host repacking into the fragment-native layout (fast/cuda/fragment.h, repack.h). Pure byte
 * moves: the values the kernels see are exactly the checkpoint's.
 */
#include "fast/cuda/repack.h"

#include <string.h>

#include "dsv4moe/formats.h"
#include "fast/cuda/fragment.h"

int64_t dsv4_fn_tiles(int64_t n, int interleaved) { return interleaved ? n / 8 : n / 16; }

void dsv4_fn_sizes(int fmt_fp4, int64_t n, int64_t k, int interleaved, uint64_t *data, uint64_t *scales)
{
    uint64_t chunks = (uint64_t)dsv4_fn_tiles(n, interleaved) * (uint64_t)(k / 128);
    *data = chunks * (fmt_fp4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK);
    *scales = chunks * (fmt_fp4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK);
}

/* Fragment row i of the repacked matrix, i = 16 t + 8 h + gid: row gid of row half h of tile t,
   with the source matrix it comes from (repack.h's two row orders), its row there and its bytes.
   Both repackers walk the rows in this order (tile, half, gid). */
typedef struct {
    int64_t t, r;
    int h, gid;
    const dsv4_fn_src *s;
    const uint8_t *row;
} frag_row;

static frag_row frag_row_at(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t i)
{
    frag_row f = {.t = i / 16, .h = (int)(i / 8 % 2), .gid = (int)(i % 8)};
    if (b) {
        f.r = 8 * f.t + f.gid;
        f.s = f.h ? b : a;
    } else {
        f.r = 16 * f.t + 8 * f.h + f.gid;
        f.s = a;
    }
    f.row = f.s->data + (uint64_t)f.r * f.s->row_bytes;
    return f;
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
    const int64_t rows = 16 * dsv4_fn_tiles(n, b != NULL), kbs = k / 128, groups = k / 32;
    uint8_t lo = 255, hi = 0;
    for (int64_t i = 0; i < rows; i++) {
        const frag_row f = frag_row_at(a, b, i);
        const uint8_t *srow = f.s->scales + f.r * groups;
        for (int64_t kb = 0; kb < kbs; kb++) {
            uint8_t *chunk = dst + (uint64_t)(f.t * kbs + kb) * DSV4_FN_FP4_CHUNK + (uint64_t)f.h * 512;
            for (int tig = 0; tig < 4; tig++)
                for (int c = 0; c < 4; c++) {
                    /* elements 4 tig .. + 3 and 16 + 4 tig .. + 3 of the step: 2 bytes each */
                    const uint8_t *na = f.row + (kb * 128 + c * 32 + 4 * tig) / 2, *nb = na + 8;
                    uint32_t nat = (uint32_t)na[0] | (uint32_t)na[1] << 8 | (uint32_t)nb[0] << 16 |
                                   (uint32_t)nb[1] << 24;
                    store_u32(chunk + (f.gid * 4 + tig) * 16 + c * 4, dsv4_fn_fp4_word(nat));
                }
            uint8_t *sc = dst_scales + (uint64_t)(f.t * kbs + kb) * DSV4_FN_FP4_SCHUNK + f.gid * 8 + f.h * 4;
            for (int c = 0; c < 4; c++) {
                uint8_t v = srow[kb * 4 + c];
                if (v > DSV4_FN_FP4_SCALE_MAX) {
                    if (bad_which)
                        *bad_which = f.s == b;
                    if (bad_row)
                        *bad_row = f.r;
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
    const int64_t rows = 16 * dsv4_fn_tiles(n, b != NULL), kbs = k / 128, sk = (k + 127) / 128;
    for (int64_t i = 0; i < rows; i++) {
        const frag_row f = frag_row_at(a, b, i);
        for (int64_t kb = 0; kb < kbs; kb++) {
            uint8_t *chunk = dst + (uint64_t)(f.t * kbs + kb) * DSV4_FN_FP8_CHUNK;
            for (int tig = 0; tig < 4; tig++)
                for (int c = 0; c < 4; c++) {
                    uint8_t *d = chunk + (2 * f.h + c / 2) * 512 + (f.gid * 4 + tig) * 16 + (c & 1) * 8;
                    memcpy(d, f.row + kb * 128 + c * 32 + 4 * tig, 4);
                    memcpy(d + 4, f.row + kb * 128 + c * 32 + 16 + 4 * tig, 4);
                }
            if (f.gid == 0) {
                int64_t si = (f.r / 128) * sk + kb;
                float v;
                if (f.s->sfp32)
                    memcpy(&v, f.s->scales + si * 4, 4);
                else
                    v = dsv4_ue8m0_to_f32(f.s->scales[si]);
                dst_scales[(f.t * kbs + kb) * 2 + f.h] = v;
            }
        }
    }
}
