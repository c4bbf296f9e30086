/*
 * Number formats (SPEC.md section 5). Expected values come from formulas and
 * brute-force nearest-value searches written here in double precision, not
 * from the library's own encoders.
 */
#include <check.h>
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"

Suite *formats_suite(void);

/* Every passing ck_assert writes a mark point down Check's pipe; loops over millions of values
 * only report failures. */
#define REQUIRE(cond, ...)                                                                                 \
    do {                                                                                                   \
        if (!(cond))                                                                                       \
            ck_abort_msg(__VA_ARGS__);                                                                     \
    } while (0)
#define REQUIRE_TRUE(cond) REQUIRE(cond, "assertion '%s' failed at line %d", #cond, __LINE__)

/* ---- helpers ---- */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_sym(void) { return (float)((double)(rng_next() >> 11) * 0x1p-52 - 1.0); }

/* e4m3 value of a code from the definition: sign * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8. */
static double e4m3_formula(unsigned c)
{
    unsigned e = (c >> 3) & 0xF, m = c & 7;
    double mag = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp(m / 8.0, -6);
    return (c & 0x80) ? -mag : mag;
}

static const double e2m1_mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* Index of the nearest of n ascending magnitudes to a >= 0; ties to the even index; saturates. */
static unsigned nearest_even(const double *mags, unsigned n, double a)
{
    if (a >= mags[n - 1])
        return n - 1;
    unsigned lo = 0, hi = n - 1; /* mags[lo] <= a < mags[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (mags[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - mags[lo], dh = mags[hi] - a;
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1) ? hi : lo;
}

static double e4m3_mags[127]; /* codes 0x00..0x7E */

static void init_e4m3_mags(void)
{
    for (unsigned c = 0; c < 127; c++)
        e4m3_mags[c] = e4m3_formula(c);
}

static uint8_t ref_e4m3_encode(float x)
{
    if (e4m3_mags[1] == 0)
        init_e4m3_mags();
    unsigned sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return (uint8_t)(sign | 0x7F);
    return (uint8_t)(sign | nearest_even(e4m3_mags, 127, fabs((double)x)));
}

static uint8_t ref_e2m1_encode(float x)
{
    if (isnan(x))
        return 7;
    unsigned sign = signbit(x) ? 8 : 0;
    return (uint8_t)(sign | nearest_even(e2m1_mags, 8, fabs((double)x)));
}

/* bf16 by comparing the two bracketing bf16 values in double; the value past the max is 2^128. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = bits_of(x);
    uint16_t t = (uint16_t)(u >> 16);
    double lo = (double)float_of((uint32_t)t << 16);
    double hi = ((t + 1u) & 0x7FFFu) == 0x7F80u ? copysign(0x1p128, x) : (double)float_of((uint32_t)(t + 1u) << 16);
    double dl = fabs((double)x - lo), dh = fabs(hi - (double)x);
    if (dl < dh || (dl == dh && !(t & 1)))
        return t;
    return (uint16_t)(t + 1u);
}

/* Smallest k with amax <= limit * 2^k, by search in double (exact for fp32 inputs). */
static int ref_pow2_k(float amax, float limit)
{
    double a = amax < DSV4_AMAX_FLOOR ? (double)DSV4_AMAX_FLOOR : (double)amax;
    int k = -300;
    while (a > ldexp((double)limit, k))
        k++;
    return k;
}

/* Bound on |v - e4m3(v)| for |v| <= 448: half an ulp, 2^-4 relative for normals, 2^-10 for subnormals. */
static double e4m3_err_bound(double v) { return fmax(fabs(v) * 0x1p-4, 0x1p-10); }

/* Floats sampled across the whole bit space plus a dense walk of the range that matters. */
#define FOR_SAMPLED_FLOATS(u)                                                                              \
    for (uint64_t u##_i = 0, u = 0; u##_i < 2; u##_i++)                                                     \
        for (u = u##_i ? 0x39000000u : 0; u##_i ? u < 0x44800000u : u < 0x100000000ull;                    \
             u += u##_i ? 13u : 4099u)

/* ---- e4m3 ---- */

START_TEST(e4m3_decode_all_codes)
{
    for (unsigned c = 0; c < 256; c++) {
        float v = dsv4_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            ck_assert_msg(isnan(v), "code 0x%02x should be NaN", c);
            continue;
        }
        ck_assert_msg((double)v == e4m3_formula(c), "code 0x%02x: %a vs %a", c, (double)v, e4m3_formula(c));
        ck_assert_int_eq(!!signbit(v), !!(c & 0x80));
    }
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x7E), 448.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0xFE), -448.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x01), 0x1p-9f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x08), 0x1p-6f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x38), 1.0f);
}
END_TEST

START_TEST(e4m3_codes_reencode_to_themselves)
{
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F)
            continue;
        ck_assert_uint_eq(dsv4_f32_to_e4m3(dsv4_e4m3_to_f32((uint8_t)c)), c);
    }
    ck_assert_uint_eq(dsv4_f32_to_e4m3(-0.0f), 0x80);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(0.0f), 0x00);
}
END_TEST

START_TEST(e4m3_nan)
{
    const uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA00000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        ck_assert_uint_eq(dsv4_f32_to_e4m3(float_of(nans[i])), 0x7F);
        ck_assert_uint_eq(dsv4_f32_to_e4m3(float_of(nans[i] | 0x80000000u)), 0xFF);
    }
}
END_TEST

START_TEST(e4m3_ties_to_even_and_neighbours)
{
    for (unsigned c = 0; c < 0x7E; c++) {
        double lo = e4m3_formula(c), hi = e4m3_formula(c + 1);
        float mid = (float)((lo + hi) / 2); /* exact: a few significant bits */
        ck_assert((double)mid == (lo + hi) / 2);
        unsigned even = (c & 1) ? c + 1 : c;
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            unsigned sg = s ? 0x80 : 0;
            ck_assert_msg(dsv4_f32_to_e4m3(m) == (sg | even), "tie %a between 0x%02x and 0x%02x gave 0x%02x",
                          (double)m, c, c + 1, dsv4_f32_to_e4m3(m));
            ck_assert_uint_eq(dsv4_f32_to_e4m3(nextafterf(m, s ? -INFINITY : INFINITY)), sg | (c + 1));
            ck_assert_uint_eq(dsv4_f32_to_e4m3(nextafterf(m, 0.0f)), sg | c);
        }
    }
    /* Subnormal region, spelled out: 1.5 * 2^-9 -> 2 * 2^-9 (code 2), 2.5 * 2^-9 -> code 2. */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(1.5f * 0x1p-9f), 0x02);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(2.5f * 0x1p-9f), 0x02);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(7.5f * 0x1p-9f), 0x08); /* subnormal -> first normal */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(432.0f), 0x7E);         /* 416 | 448 tie: 448 has the even mantissa */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(1.0625f), 0x38);        /* 1 | 1.125 tie */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(1.1875f), 0x3A);        /* 1.125 | 1.25 tie */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(1.9375f), 0x40);        /* 1.875 | 2 tie: carry into the exponent */
}
END_TEST

START_TEST(e4m3_saturates)
{
    const float big[] = {448.0f, nextafterf(448.0f, INFINITY), 449.0f, 464.0f, 480.0f, 512.0f, 1e10f, FLT_MAX,
                         INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        ck_assert_msg(dsv4_f32_to_e4m3(big[i]) == 0x7E, "%g", (double)big[i]);
        ck_assert_msg(dsv4_f32_to_e4m3(-big[i]) == 0xFE, "%g", (double)-big[i]);
    }
    ck_assert_uint_eq(dsv4_f32_to_e4m3(nextafterf(448.0f, 0.0f)), 0x7E);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(431.0f), 0x7D);
}
END_TEST

START_TEST(e4m3_underflow_to_zero)
{
    ck_assert_uint_eq(dsv4_f32_to_e4m3(0x1p-10f), 0x00); /* half the smallest subnormal: tie to 0 */
    ck_assert_uint_eq(dsv4_f32_to_e4m3(-0x1p-10f), 0x80);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)), 0x01);
    ck_assert_uint_eq(dsv4_f32_to_e4m3(nextafterf(0x1p-10f, 0.0f)), 0x00);
    const float tiny[] = {0x1p-11f, 1e-20f, FLT_MIN, 0x1p-149f, 1e-40f};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        ck_assert_uint_eq(dsv4_f32_to_e4m3(tiny[i]), 0x00);
        ck_assert_uint_eq(dsv4_f32_to_e4m3(-tiny[i]), 0x80);
    }
}
END_TEST

START_TEST(e4m3_matches_nearest_search)
{
    init_e4m3_mags();
    uint64_t checked = 0;
    FOR_SAMPLED_FLOATS(u)
    {
        float x = float_of((uint32_t)u);
        uint8_t got = dsv4_f32_to_e4m3(x), want = ref_e4m3_encode(x);
        REQUIRE(got == want, "%a (0x%08x): got 0x%02x want 0x%02x", (double)x, (unsigned)u, got, want);
        checked++;
    }
    ck_assert_uint_gt(checked, 1000000);
}
END_TEST

/* ---- e2m1 ---- */

START_TEST(e2m1_all_codes)
{
    for (unsigned c = 0; c < 16; c++) {
        float v = dsv4_e2m1_to_f32((uint8_t)c);
        double want = (c & 8) ? -e2m1_mags[c & 7] : e2m1_mags[c & 7];
        ck_assert((double)v == want);
        ck_assert_int_eq(!!signbit(v), !!(c & 8));
        ck_assert_uint_eq(dsv4_f32_to_e2m1(v), c);
        /* Only the low nibble counts. */
        ck_assert(bits_of(dsv4_e2m1_to_f32((uint8_t)(c | 0xF0))) == bits_of(v));
    }
}
END_TEST

START_TEST(e2m1_ties_to_even)
{
    const struct {
        float tie;
        unsigned code, below, above;
    } t[] = {{0.25f, 0, 0, 1}, {0.75f, 2, 1, 2}, {1.25f, 2, 2, 3}, {1.75f, 4, 3, 4},
             {2.5f, 4, 4, 5},  {3.5f, 6, 5, 6},  {5.0f, 6, 6, 7}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        for (int s = 0; s < 2; s++) {
            float x = s ? -t[i].tie : t[i].tie;
            unsigned sg = s ? 8 : 0;
            ck_assert_msg(dsv4_f32_to_e2m1(x) == (sg | t[i].code), "tie %g gave %u", (double)x,
                          dsv4_f32_to_e2m1(x));
            ck_assert_uint_eq(dsv4_f32_to_e2m1(nextafterf(x, 0.0f)), sg | t[i].below);
            ck_assert_uint_eq(dsv4_f32_to_e2m1(nextafterf(x, s ? -INFINITY : INFINITY)), sg | t[i].above);
        }
}
END_TEST

START_TEST(e2m1_saturation_nan_zero)
{
    const float big[] = {6.0f, nextafterf(6.0f, INFINITY), 7.0f, 8.0f, 1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        ck_assert_uint_eq(dsv4_f32_to_e2m1(big[i]), 0x7);
        ck_assert_uint_eq(dsv4_f32_to_e2m1(-big[i]), 0xF);
    }
    ck_assert_uint_eq(dsv4_f32_to_e2m1(NAN), 0x7);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(-NAN), 0x7);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(float_of(0xFF800001u)), 0x7);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(0.0f), 0x0);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(-0.0f), 0x8);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(-0.1f), 0x8);
    ck_assert_uint_eq(dsv4_f32_to_e2m1(1e-40f), 0x0);
}
END_TEST

START_TEST(e2m1_matches_nearest_search)
{
    FOR_SAMPLED_FLOATS(u)
    {
        float x = float_of((uint32_t)u);
        REQUIRE(dsv4_f32_to_e2m1(x) == ref_e2m1_encode(x), "%a: got %u want %u", (double)x,
                      dsv4_f32_to_e2m1(x), ref_e2m1_encode(x));
    }
}
END_TEST

/* ---- bf16 ---- */

START_TEST(bf16_round_to_nearest_even)
{
    /* 1 + 2^-8 is halfway between 0x3F80 (1) and 0x3F81 (1 + 2^-7): even is 0x3F80. */
    ck_assert_uint_eq(dsv4_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
    ck_assert_uint_eq(bits_of(1.0f + 0x1p-8f), 0x3F808000u);
    /* 1 + 3 * 2^-8 is halfway between 0x3F81 and 0x3F82 (1 + 2^-6): even is 0x3F82. */
    ck_assert_uint_eq(dsv4_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
    ck_assert_float_eq(dsv4_bf16_to_f32(0x3F82), 1.0f + 0x1p-6f);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x3F808001u)), 0x3F81);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x3F807FFFu)), 0x3F80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x3F818000u)), 0x3F82);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0xBF818000u)), 0xBF82);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0xBF808000u)), 0xBF80);
    /* Carry into the exponent: 0x3FFF8000 -> 0x4000 (2.0). */
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x3FFF8000u)), 0x4000);
    /* Subnormals round like everything else. */
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x00018000u)), 0x0002);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x00008000u)), 0x0000);
    ck_assert_float_eq(dsv4_round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
}
END_TEST

START_TEST(bf16_specials)
{
    ck_assert_uint_eq(dsv4_f32_to_bf16(INFINITY), 0x7F80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(-INFINITY), 0xFF80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(0.0f), 0x0000);
    ck_assert_uint_eq(dsv4_f32_to_bf16(-0.0f), 0x8000);
    /* Above the largest bf16 by more than half an ulp: Inf, as IEEE RNE overflow does. */
    ck_assert_uint_eq(dsv4_f32_to_bf16(FLT_MAX), 0x7F80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F);
    ck_assert_uint_eq(dsv4_f32_to_bf16(float_of(0x7F7F8000u)), 0x7F80); /* tie, odd 0x7F7F -> Inf */
    /* NaN payloads only in the low 16 bits must not truncate to Inf; sign kept; quiet. */
    const uint32_t nans[] = {0x7F800001u, 0x7FC00000u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t b = dsv4_f32_to_bf16(float_of(nans[i]));
        ck_assert_msg(isnan(dsv4_bf16_to_f32(b)), "0x%08x -> 0x%04x", nans[i], b);
        ck_assert_uint_eq(b & 0x0040u, 0x0040u);
        ck_assert_uint_eq(b >> 15, nans[i] >> 31);
        ck_assert(isnan(dsv4_round_bf16(float_of(nans[i]))));
    }
}
END_TEST

START_TEST(bf16_all_patterns_round_trip)
{
    for (uint32_t p = 0; p < 65536; p++) {
        float f = dsv4_bf16_to_f32((uint16_t)p);
        REQUIRE_TRUE(bits_of(f) == p << 16);
        uint16_t back = dsv4_f32_to_bf16(f);
        if ((p & 0x7F80u) == 0x7F80u && (p & 0x7Fu)) { /* NaN */
            REQUIRE_TRUE(isnan(f));
            REQUIRE_TRUE(isnan(dsv4_bf16_to_f32(back)));
            REQUIRE_TRUE(back >> 15 == p >> 15);
        } else {
            REQUIRE(back == p, "0x%04x -> 0x%04x", p, back);
        }
    }
}
END_TEST

START_TEST(bf16_matches_bracket_search)
{
    FOR_SAMPLED_FLOATS(u)
    {
        float x = float_of((uint32_t)u);
        if (isnan(x))
            continue;
        REQUIRE(dsv4_f32_to_bf16(x) == ref_bf16(x), "0x%08x: got 0x%04x want 0x%04x", (unsigned)u,
                      dsv4_f32_to_bf16(x), ref_bf16(x));
    }
}
END_TEST

/* ---- ue8m0 ---- */

START_TEST(ue8m0_decode)
{
    ck_assert_float_eq(dsv4_ue8m0_to_f32(127), 1.0f);
    ck_assert_float_eq(dsv4_ue8m0_to_f32(128), 2.0f);
    ck_assert_float_eq(dsv4_ue8m0_to_f32(126), 0.5f);
    ck_assert_float_eq(dsv4_ue8m0_to_f32(254), 0x1p127f);
    ck_assert_float_eq(dsv4_ue8m0_to_f32(1), 0x1p-126f);
    ck_assert((double)dsv4_ue8m0_to_f32(0) == 0x1p-127); /* an fp32 subnormal */
    ck_assert(isnan(dsv4_ue8m0_to_f32(255)));
    for (int b = 0; b < 255; b++)
        ck_assert((double)dsv4_ue8m0_to_f32((uint8_t)b) == ldexp(1.0, b - 127));
}
END_TEST

START_TEST(ue8m0_scale_at_exact_powers)
{
    const float limits[] = {448.0f, 6.0f};
    for (int li = 0; li < 2; li++) {
        float lim = limits[li];
        uint8_t floor_b = (uint8_t)(127 + ref_pow2_k(DSV4_AMAX_FLOOR, lim));
        for (int k = -20; k <= 20; k++) {
            float a = ldexpf(lim, k);
            float up = nextafterf(a, INFINITY), dn = nextafterf(a, 0.0f);
            if (dn >= DSV4_AMAX_FLOOR) {
                ck_assert_msg(dsv4_ue8m0_scale_for(a, lim) == 127 + k, "limit %g k %d", (double)lim, k);
                ck_assert_uint_eq(dsv4_ue8m0_scale_for(up, lim), 127 + k + 1);
                ck_assert_uint_eq(dsv4_ue8m0_scale_for(dn, lim), 127 + k);
            } else if (up < DSV4_AMAX_FLOOR) {
                ck_assert_uint_eq(dsv4_ue8m0_scale_for(a, lim), floor_b);
                ck_assert_uint_eq(dsv4_ue8m0_scale_for(up, lim), floor_b);
                ck_assert_uint_eq(dsv4_ue8m0_scale_for(dn, lim), floor_b);
            }
        }
    }
    /* The floors themselves: 1e-4 / 448 lies in (2^-23, 2^-22], 1e-4 / 6 in (2^-16, 2^-15]. */
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(DSV4_AMAX_FLOOR, 448.0f), 127 - 22);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(DSV4_AMAX_FLOOR, 6.0f), 127 - 15);
}
END_TEST

START_TEST(ue8m0_scale_specials)
{
    uint8_t fl = dsv4_ue8m0_scale_for(DSV4_AMAX_FLOOR, 448.0f);
    const float below[] = {0.0f, -0.0f, 1e-30f, 0x1p-149f, nextafterf(DSV4_AMAX_FLOOR, 0.0f), -5.0f, -INFINITY};
    for (size_t i = 0; i < sizeof below / sizeof below[0]; i++)
        ck_assert_uint_eq(dsv4_ue8m0_scale_for(below[i], 448.0f), fl);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(nextafterf(DSV4_AMAX_FLOOR, 1.0f), 448.0f), fl);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(INFINITY, 448.0f), 254);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(NAN, 448.0f), 255);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(-NAN, 6.0f), 255);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(FLT_MAX, 448.0f), 127 + 120); /* 2^128 / 448 < 2^120 */
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(FLT_MAX, 1.0f), 254);         /* clamped: 2^128 needed */
    /* Subnormal and tiny limits: exact exponent arithmetic, then the clamp. */
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, 0x1p-126f), 127 + 126);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, 0x1p-140f), 254);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1e-4f, 1e30f), 127 - 112); /* 1e-34 in (2^-113, 2^-112] */
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1e-4f, 1e38f), 0);
    /* A limit that is not positive and finite has no scale. */
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, 0.0f), 255);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, -6.0f), 255);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, INFINITY), 255);
    ck_assert_uint_eq(dsv4_ue8m0_scale_for(1.0f, NAN), 255);
}
END_TEST

START_TEST(ue8m0_scale_is_tight)
{
    rng_state = 11;
    const float limits[] = {448.0f, 6.0f, 1.0f, 3.3f};
    for (int i = 0; i < 200000; i++) {
        float lim = limits[i & 3];
        /* Random significand, exponent over [-20, 60]. */
        float a = ldexpf(1.0f + 0.5f * (rng_sym() + 1.0f), (int)(rng_next() % 81) - 20);
        if (i % 7 == 0)
            a = ldexpf(lim, (int)(rng_next() % 41) - 10); /* exact boundaries */
        uint8_t b = dsv4_ue8m0_scale_for(a, lim);
        double s = ldexp(1.0, b - 127), af = fmax((double)a, (double)DSV4_AMAX_FLOOR);
        REQUIRE(af <= lim * s && af > lim * s / 2, "a %a limit %g -> b %u", (double)a, (double)lim, b);
        REQUIRE_TRUE(b == 127 + ref_pow2_k(a, lim));
    }
}
END_TEST

/* ---- weight quantizers ---- */

/* A 130 x 200 matrix whose 2 x 2 blocks span very different magnitudes, with exact-boundary values. */
static float *make_weights(int64_t n, int64_t k, uint64_t seed)
{
    rng_state = seed;
    float *w = malloc((size_t)(n * k) * sizeof *w);
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++) {
            int e = (int)(((r / 128) * 7 + (c / 128) * 5 + (c / 32) * 3) % 23) - 12;
            w[r * k + c] = ldexpf(rng_sym(), e);
        }
    if (n > 5 && k > 7) {
        w[5 * k + 7] = 448.0f * 0x1p-3f; /* block (0, 0) amax exactly 448 * 2^-3 if it dominates */
        w[0] = 0.75f;                  /* an e2m1 tie after scaling, at some scale */
    }
    return w;
}

/* max |w| over the block, floored. */
static float block_amax(const float *w, int64_t n, int64_t k, int64_t r0, int64_t c0, int64_t rb, int64_t cb)
{
    float m = 0.0f;
    for (int64_t r = r0; r < r0 + rb && r < n; r++)
        for (int64_t c = c0; c < c0 + cb && c < k; c++)
            m = fmaxf(m, fabsf(w[r * k + c]));
    return fmaxf(m, DSV4_AMAX_FLOOR);
}

static void check_fp8_roundtrip(dsv4_scale_format fmt)
{
    init_e4m3_mags();
    const int64_t N = 130, K = 200, nbn = 2, nbk = 2;
    float *w = make_weights(N, K, 5);
    uint8_t *q = malloc((size_t)(N * K));
    float *deq = malloc((size_t)(N * K) * sizeof *deq);
    uint8_t s8[4];
    float s32[4];
    void *scales = fmt == DSV4_SCALE_UE8M0 ? (void *)s8 : (void *)s32;
    dsv4_error err;
    dsv4_error_clear(&err);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, fmt, q, scales, "w", &err), DSV4_OK);
    ck_assert_int_eq(err.status, DSV4_OK);
    dsv4_dequant_fp8_rows(q, scales, fmt, N, K, 0, N, deq);
    for (int64_t bn = 0; bn < nbn; bn++)
        for (int64_t bk = 0; bk < nbk; bk++) {
            float amax = block_amax(w, N, K, bn * 128, bk * 128, 128, 128);
            float s;
            if (fmt == DSV4_SCALE_UE8M0) {
                int kk = ref_pow2_k(amax, 448.0f);
                ck_assert_int_eq(s8[bn * nbk + bk], 127 + kk);
                s = ldexpf(1.0f, kk);
            } else {
                s = amax / 448.0f;
                ck_assert_float_eq(s32[bn * nbk + bk], s);
            }
            for (int64_t r = bn * 128; r < N && r < (bn + 1) * 128; r++)
                for (int64_t c = bk * 128; c < K && c < (bk + 1) * 128; c++) {
                    float x = w[r * K + c], v = x / s;
                    uint8_t code = q[r * K + c];
                    REQUIRE(code == ref_e4m3_encode(v), "[%lld, %lld] %a: 0x%02x", (long long)r,
                                  (long long)c, (double)v, code);
                    float d = deq[r * K + c];
                    REQUIRE_TRUE(bits_of(d) == bits_of(dsv4_e4m3_to_f32(code) * s));
                    REQUIRE_TRUE(fabs((double)v - (double)dsv4_e4m3_to_f32(code)) <= e4m3_err_bound(v));
                    REQUIRE_TRUE(fabs((double)x - (double)d) <= (double)s * e4m3_err_bound(v) * (1 + 0x1p-16));
                }
        }
    if (fmt == DSV4_SCALE_UE8M0) {
        ck_assert_uint_eq(q[5 * K + 7], 0x7E);
        ck_assert_uint_eq(s8[0], 127 - 3);
    }
    free(w);
    free(q);
    free(deq);
}

START_TEST(fp8_block_ue8m0_roundtrip) { check_fp8_roundtrip(DSV4_SCALE_UE8M0); }
END_TEST

START_TEST(fp8_block_fp32_roundtrip) { check_fp8_roundtrip(DSV4_SCALE_FP32); }
END_TEST

START_TEST(fp8_zero_block_gets_floor_scale)
{
    const int64_t N = 129, K = 130;
    float *w = calloc((size_t)(N * K), sizeof *w);
    w[0] = 3.0f; /* block (0,0) nonzero; the other three all zero */
    uint8_t *q = malloc((size_t)(N * K));
    uint8_t s8[4];
    float s32[4];
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s8, NULL, NULL), DSV4_OK);
    ck_assert_uint_eq(s8[0], 127 + ref_pow2_k(3.0f, 448.0f));
    for (int i = 1; i < 4; i++)
        ck_assert_uint_eq(s8[i], 127 - 22);
    for (int64_t i = 1; i < N * K; i++)
        ck_assert_uint_eq(q[i], 0);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_FP32, q, s32, NULL, NULL), DSV4_OK);
    ck_assert_float_eq(s32[0], 3.0f / 448.0f);
    ck_assert_uint_eq(q[0], 0x7E);
    for (int i = 1; i < 4; i++)
        ck_assert_float_eq(s32[i], DSV4_AMAX_FLOOR / 448.0f);
    free(w);
    free(q);
}
END_TEST

START_TEST(fp8_ue8m0_requant_keeps_values)
{
    /* The reference re-quantizes dequantized weights: with power-of-two scales nothing may move. */
    const int64_t N = 130, K = 200;
    float *w = make_weights(N, K, 9);
    uint8_t *q = malloc((size_t)(N * K)), *q2 = malloc((size_t)(N * K)), s[4], s2[4];
    float *d = malloc((size_t)(N * K) * sizeof *d), *d2 = malloc((size_t)(N * K) * sizeof *d2);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s, "w", NULL), DSV4_OK);
    dsv4_dequant_fp8_rows(q, s, DSV4_SCALE_UE8M0, N, K, 0, N, d);
    ck_assert_int_eq(dsv4_quant_fp8_block(d, N, K, DSV4_SCALE_UE8M0, q2, s2, "w", NULL), DSV4_OK);
    dsv4_dequant_fp8_rows(q2, s2, DSV4_SCALE_UE8M0, N, K, 0, N, d2);
    ck_assert_mem_eq(d, d2, (size_t)(N * K) * sizeof *d);
    free(w);
    free(q);
    free(q2);
    free(d);
    free(d2);
}
END_TEST

START_TEST(fp4_packing_order)
{
    /* Element k of each row is e2m1 code k % 16 times 4 (every group holds a 6 * 4 = 24, so s = 4). */
    const int64_t N = 3, K = 64;
    float w[3 * 64];
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < K; c++)
            w[r * K + c] = dsv4_e2m1_to_f32((uint8_t)(c % 16)) * ldexpf(4.0f, (int)r);
    uint8_t q[3 * 32], s[3 * 2];
    ck_assert_int_eq(dsv4_quant_fp4_block(w, N, K, q, s, "e", NULL), DSV4_OK);
    for (int64_t r = 0; r < N; r++) {
        ck_assert_uint_eq(s[r * 2], 127 + 2 + r);
        ck_assert_uint_eq(s[r * 2 + 1], 127 + 2 + r);
        for (int64_t c = 0; c < K; c += 2)
            ck_assert_msg(q[r * 32 + c / 2] == (uint8_t)((c % 16) | (((c + 1) % 16) << 4)), "row %lld byte %lld: 0x%02x",
                          (long long)r, (long long)c / 2, q[r * 32 + c / 2]);
    }
    float out[2 * 64];
    dsv4_dequant_fp4_rows(q, s, N, K, 1, 2, out);
    for (int64_t i = 0; i < 2 * K; i++)
        ck_assert(bits_of(out[i]) == bits_of(w[K + i]));
}
END_TEST

START_TEST(fp4_roundtrip)
{
    const int64_t N = 130, K = 256;
    float *w = make_weights(N, K, 21);
    uint8_t *q = malloc((size_t)(N * K / 2)), *s = malloc((size_t)(N * K / 32));
    float *d = malloc((size_t)(N * K) * sizeof *d);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, N, K, q, s, "w", NULL), DSV4_OK);
    dsv4_dequant_fp4_rows(q, s, N, K, 0, N, d);
    for (int64_t r = 0; r < N; r++)
        for (int64_t g = 0; g < K / 32; g++) {
            float amax = block_amax(w, N, K, r, g * 32, 1, 32);
            int kk = ref_pow2_k(amax, 6.0f);
            ck_assert_uint_eq(s[r * (K / 32) + g], 127 + kk);
            float sc = ldexpf(1.0f, kk);
            for (int64_t c = g * 32; c < (g + 1) * 32; c++) {
                float v = w[r * K + c] / sc;
                uint8_t nib = (q[(r * K + c) / 2] >> ((c & 1) * 4)) & 0xF;
                REQUIRE(nib == ref_e2m1_encode(v), "[%lld, %lld] %a -> %u", (long long)r, (long long)c,
                              (double)v, nib);
                double gap = fabs(v) < 2 ? 0.25 : fabs(v) < 4 ? 0.5 : 1.0;
                REQUIRE_TRUE(fabs((double)v - (double)dsv4_e2m1_to_f32(nib)) <= gap);
                REQUIRE_TRUE(bits_of(d[r * K + c]) == bits_of(dsv4_e2m1_to_f32(nib) * sc));
            }
        }
    free(w);
    free(q);
    free(s);
    free(d);
}
END_TEST

START_TEST(quant_rejects_nonfinite)
{
    const int64_t N = 130, K = 200;
    float *w = make_weights(N, K, 3);
    uint8_t *q = malloc((size_t)(N * K)), s8[4];
    dsv4_error err;
    /* [5, 10] sits in block (0, 0), [3, 150] in block (0, 1): the report is the first in row-major order. */
    w[5 * K + 10] = INFINITY;
    w[3 * K + 150] = NAN;
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s8, "blk.w1", &err), DSV4_ERR_NUMERIC);
    ck_assert_int_eq(err.status, DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(err.message, "blk.w1") && strstr(err.message, "[3, 150]") && strstr(err.message, "nan"),
                  "%s", err.message);
    w[3 * K + 150] = 1.0f;
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_FP32, q, s8, NULL, &err), DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(err.message, "weight") && strstr(err.message, "[5, 10]") && strstr(err.message, "inf"),
                  "%s", err.message);
    w[5 * K + 10] = 1.0f;
    w[129 * K + 199] = -INFINITY;
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s8, "x", &err), DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(err.message, "[129, 199]") && strstr(err.message, "-inf"), "%s", err.message);
    w[129 * K + 199] = 1.0f;
    w[128 * K + 0] = NAN; /* column 0, first row of the second block row */
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s8, "x", &err), DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(err.message, "[128, 0]"), "%s", err.message);
    w[128 * K + 0] = 1.0f;
    w[129 * K + 199] = -INFINITY;
    /* NULL err is allowed. */
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q, s8, "x", NULL), DSV4_ERR_NUMERIC);
    w[129 * K + 199] = 0.0f;

    /* fp4: K = 192; [2, 70] is in group 2, [2, 40] in group 1 of the same row. */
    uint8_t sc[130 * 6];
    w[2 * 192 + 70] = NAN;
    w[2 * 192 + 40] = -NAN;
    ck_assert_int_eq(dsv4_quant_fp4_block(w, N, 192, q, sc, "experts.3.w2", &err), DSV4_ERR_NUMERIC);
    ck_assert_msg(strstr(err.message, "experts.3.w2") && strstr(err.message, "[2, 40]") && strstr(err.message, "nan"),
                  "%s", err.message);
    free(w);
    free(q);
}
END_TEST

START_TEST(quant_rejects_bad_arguments)
{
    float w[64] = {0};
    uint8_t q[64], s[4];
    dsv4_error err;
    ck_assert_int_eq(dsv4_quant_fp8_block(w, -1, 8, DSV4_SCALE_UE8M0, q, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, 8, -1, DSV4_SCALE_UE8M0, q, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp8_block(NULL, 8, 8, DSV4_SCALE_UE8M0, q, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, 8, 8, DSV4_SCALE_UE8M0, NULL, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, 8, 8, DSV4_SCALE_FP32, q, NULL, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, 8, 8, (dsv4_scale_format)7, q, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, 2, 16, q, s, "w", &err), DSV4_ERR_SHAPE);
    ck_assert_msg(strstr(err.message, "w") && strstr(err.message, "32"), "%s", err.message);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, 1, 33, q, s, "w", NULL), DSV4_ERR_SHAPE);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, -2, 32, q, s, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, 2, 32, q, NULL, "w", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, 2, 32, q, s, "w", &err), DSV4_OK);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, 0, 32, q, s, "w", &err), DSV4_OK);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, 0, 0, DSV4_SCALE_UE8M0, q, s, "w", &err), DSV4_OK);
}
END_TEST

START_TEST(dequant_row_ranges)
{
    const int64_t N = 300, K = 136;
    float *w = make_weights(N, K, 4);
    uint8_t *q = malloc((size_t)(N * K));
    float s32[3 * 2];
    float *all = malloc((size_t)(N * K) * sizeof *all), *part = malloc((size_t)(40 * K) * sizeof *part);
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_FP32, q, s32, "w", NULL), DSV4_OK);
    dsv4_dequant_fp8_rows(q, s32, DSV4_SCALE_FP32, N, K, 0, N, all);
    dsv4_dequant_fp8_rows(q, s32, DSV4_SCALE_FP32, N, K, 120, 40, part); /* crosses a block edge */
    ck_assert_mem_eq(part, all + 120 * K, (size_t)(40 * K) * sizeof *part);
    ck_assert_float_eq(all[200 * K + 130], dsv4_e4m3_to_f32(q[200 * K + 130]) * s32[1 * 2 + 1]);

    uint16_t b[6] = {0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000, 0x4049};
    float o[4];
    dsv4_dequant_bf16_rows(b, 2, 1, 2, o); /* rows 1 and 2 of a [3, 2] matrix */
    ck_assert(isinf(o[0]) && o[0] > 0);
    ck_assert(bits_of(o[1]) == 0x00010000u);
    ck_assert(bits_of(o[2]) == 0x80000000u);
    ck_assert_float_eq(o[3], 3.140625f);
    free(w);
    free(q);
    free(all);
    free(part);
}
END_TEST

/* ---- activation quantizer ---- */

/* Expected act-quant output for one group, from the definition. */
static void check_act_group(const float *x, int64_t len, dsv4_act_quant mode, const float *out, const uint8_t *codes,
                            float scale)
{
    float amax = DSV4_AMAX_FLOOR;
    for (int64_t i = 0; i < len; i++)
        if (!isnan(x[i]))
            amax = fmaxf(amax, fabsf(x[i]));
    float s = mode == DSV4_ACT_QUANT_UE8M0 ? ldexpf(1.0f, ref_pow2_k(amax, 448.0f)) : amax / 448.0f;
    ck_assert_msg(bits_of(scale) == bits_of(s), "scale %a want %a", (double)scale, (double)s);
    for (int64_t i = 0; i < len; i++) {
        float v = fminf(fmaxf(x[i] / s, -448.0f), 448.0f);
        uint8_t want = isnan(x[i]) ? ref_e4m3_encode(x[i]) : ref_e4m3_encode(v);
        ck_assert_msg(codes[i] == want, "elem %lld: %a -> 0x%02x want 0x%02x", (long long)i, (double)x[i], codes[i],
                      want);
        float o = dsv4_e4m3_to_f32(want) * s;
        if (isnan(o))
            ck_assert(isnan(out[i]));
        else
            ck_assert_msg(bits_of(out[i]) == bits_of(o), "elem %lld: %a want %a", (long long)i, (double)out[i],
                          (double)o);
    }
}

START_TEST(act_quant_exact_power_amax)
{
    init_e4m3_mags();
    float x[128], out[128], sc[1];
    uint8_t codes[128];
    for (int k = -8; k <= 8; k++) {
        rng_state = (uint64_t)(k + 100);
        for (int i = 0; i < 128; i++)
            x[i] = ldexpf(rng_sym() * 400.0f, k);
        x[77] = -ldexpf(448.0f, k);
        dsv4_act_quant_row(x, 128, DSV4_ACT_QUANT_UE8M0, out, codes, sc);
        ck_assert_float_eq(sc[0], ldexpf(1.0f, k));
        ck_assert_uint_eq(codes[77], 0xFE);
        ck_assert_float_eq(out[77], x[77]);
        check_act_group(x, 128, DSV4_ACT_QUANT_UE8M0, out, codes, sc[0]);
        /* Just above: the scale doubles. */
        x[77] = -nextafterf(ldexpf(448.0f, k), INFINITY);
        dsv4_act_quant_row(x, 128, DSV4_ACT_QUANT_UE8M0, out, codes, sc);
        ck_assert_float_eq(sc[0], ldexpf(2.0f, k));
        check_act_group(x, 128, DSV4_ACT_QUANT_UE8M0, out, codes, sc[0]);
    }
}
END_TEST

START_TEST(act_quant_partial_last_group)
{
    init_e4m3_mags();
    const int64_t K = 200;
    float x[200], out[200], sc[2] = {-1, -1};
    uint8_t codes[200];
    rng_state = 77;
    for (int i = 0; i < K; i++)
        x[i] = rng_sym() * (i < 128 ? 30.0f : 0.01f);
    for (int m = 0; m < 2; m++) {
        dsv4_act_quant mode = m ? DSV4_ACT_QUANT_FP32 : DSV4_ACT_QUANT_UE8M0;
        dsv4_act_quant_row(x, K, mode, out, codes, sc);
        check_act_group(x, 128, mode, out, codes, sc[0]);
        check_act_group(x + 128, 72, mode, out + 128, codes + 128, sc[1]);
        ck_assert(sc[1] < sc[0] / 1000);
        /* codes and scales are optional, and out may alias x. */
        float y[200];
        memcpy(y, x, sizeof y);
        dsv4_act_quant_row(y, K, mode, y, NULL, NULL);
        ck_assert_mem_eq(y, out, sizeof y);
    }
}
END_TEST

START_TEST(act_quant_floor)
{
    float x[130] = {0}, out[130], sc[2];
    uint8_t codes[130];
    x[129] = -0.0f;
    dsv4_act_quant_row(x, 130, DSV4_ACT_QUANT_UE8M0, out, codes, sc);
    ck_assert_float_eq(sc[0], 0x1p-22f);
    ck_assert_float_eq(sc[1], 0x1p-22f);
    for (int i = 0; i < 130; i++) {
        ck_assert(out[i] == 0.0f);
        ck_assert_uint_eq(codes[i], i == 129 ? 0x80 : 0x00);
    }
    dsv4_act_quant_row(x, 130, DSV4_ACT_QUANT_FP32, out, codes, sc);
    ck_assert_float_eq(sc[0], DSV4_AMAX_FLOOR / 448.0f);
    for (int i = 0; i < 130; i++)
        ck_assert(out[i] == 0.0f);
    /* Below the floor the values are quantized against the floor's scale, not their own. */
    x[3] = 1e-6f;
    dsv4_act_quant_row(x, 130, DSV4_ACT_QUANT_UE8M0, out, codes, sc);
    ck_assert_float_eq(sc[0], 0x1p-22f);
    ck_assert_uint_eq(codes[3], ref_e4m3_encode(1e-6f * 0x1p22f));
}
END_TEST

START_TEST(act_quant_fp32_mode_and_clamp)
{
    init_e4m3_mags();
    float x[128], out[128], sc[1];
    uint8_t codes[128];
    /* Find an amax whose fp32 scale rounds down, so that amax / s exceeds 448 before the clamp. */
    int found = 0;
    for (float a = 1.0f; a < 2.0f && !found; a = nextafterf(a, 2.0f)) {
        float s = a / 448.0f;
        if (a / s > 448.0f) {
            memset(x, 0, sizeof x);
            x[10] = a;
            x[11] = -a;
            x[12] = a * 0.3f;
            dsv4_act_quant_row(x, 128, DSV4_ACT_QUANT_FP32, out, codes, sc);
            ck_assert_float_eq(sc[0], s);
            ck_assert_uint_eq(codes[10], 0x7E);
            ck_assert_uint_eq(codes[11], 0xFE);
            ck_assert_float_eq(out[10], 448.0f * s);
            check_act_group(x, 128, DSV4_ACT_QUANT_FP32, out, codes, sc[0]);
            found = 1;
        }
    }
    ck_assert(found);
    /* fp32 and ue8m0 differ where the power-of-two scale is coarser. */
    rng_state = 8;
    for (int i = 0; i < 128; i++)
        x[i] = rng_sym() * 5.0f;
    x[0] = 5.0f;
    float o2[128], sc2[1];
    uint8_t c2[128];
    dsv4_act_quant_row(x, 128, DSV4_ACT_QUANT_FP32, out, codes, sc);
    dsv4_act_quant_row(x, 128, DSV4_ACT_QUANT_UE8M0, o2, c2, sc2);
    ck_assert_float_eq(sc[0], 5.0f / 448.0f);
    ck_assert_float_eq(sc2[0], 0x1p-6f); /* 5 / 448 in (2^-7, 2^-6] */
    ck_assert_uint_eq(codes[0], 0x7E);
    ck_assert_uint_eq(c2[0], ref_e4m3_encode(5.0f * 64.0f));
    check_act_group(x, 128, DSV4_ACT_QUANT_FP32, out, codes, sc[0]);
    check_act_group(x, 128, DSV4_ACT_QUANT_UE8M0, o2, c2, sc2[0]);
    ck_assert(memcmp(out, o2, sizeof out) != 0);
}
END_TEST

START_TEST(act_quant_none_copies)
{
    float x[5] = {1.1f, -NAN, INFINITY, 1e-30f, -0.0f}, out[5];
    uint8_t codes[5] = {9, 9, 9, 9, 9};
    float sc[1] = {42.0f};
    dsv4_act_quant_row(x, 5, DSV4_ACT_QUANT_NONE, out, codes, sc);
    ck_assert_mem_eq(x, out, sizeof x);
    ck_assert_uint_eq(codes[0], 9);
    ck_assert_float_eq(sc[0], 42.0f);
    dsv4_act_quant_row(x, 5, DSV4_ACT_QUANT_NONE, x, NULL, NULL);
    ck_assert_mem_eq(x, out, sizeof x);
}
END_TEST

START_TEST(act_quant_nan_stays_local)
{
    init_e4m3_mags();
    float x[256], ref[256], out[256], sc[2], rsc[2];
    uint8_t codes[256], rcodes[256];
    rng_state = 5;
    for (int i = 0; i < 256; i++)
        x[i] = rng_sym() * 3.0f;
    for (int m = 0; m < 2; m++) {
        dsv4_act_quant mode = m ? DSV4_ACT_QUANT_FP32 : DSV4_ACT_QUANT_UE8M0;
        dsv4_act_quant_row(x, 256, mode, ref, rcodes, rsc);
        float y[256];
        memcpy(y, x, sizeof y);
        y[40] = NAN;
        y[41] = -NAN;
        dsv4_act_quant_row(y, 256, mode, out, codes, sc);
        ck_assert(isnan(out[40]) && isnan(out[41]));
        ck_assert_uint_eq(codes[40], 0x7F);
        ck_assert_uint_eq(codes[41], 0xFF);
        /* The scale and every other element are as if the NaNs were absent (they were not the amax). */
        ck_assert_mem_eq(sc, rsc, sizeof sc);
        for (int i = 0; i < 256; i++)
            if (i != 40 && i != 41) {
                ck_assert(bits_of(out[i]) == bits_of(ref[i]));
                ck_assert_uint_eq(codes[i], rcodes[i]);
            }
        check_act_group(y, 128, mode, out, codes, sc[0]);
    }
    /* Inf counts in amax. UE8M0: s = 2^127, Inf saturates back to Inf. FP32: s = Inf, Inf / Inf is a NaN
     * whose code carries the sign of x, not the CPU's default NaN sign. */
    float z[4] = {1.0f, -INFINITY, 2.0f, INFINITY}, zo[4], zs[1];
    uint8_t zc[4];
    dsv4_act_quant_row(z, 4, DSV4_ACT_QUANT_UE8M0, zo, zc, zs);
    ck_assert_float_eq(zs[0], 0x1p127f);
    ck_assert_uint_eq(zc[1], 0xFE);
    ck_assert_uint_eq(zc[3], 0x7E);
    ck_assert(isinf(zo[1]) && zo[1] < 0 && isinf(zo[3]) && zo[3] > 0);
    ck_assert(zo[0] == 0.0f && zo[2] == 0.0f);
    dsv4_act_quant_row(z, 4, DSV4_ACT_QUANT_FP32, zo, zc, zs);
    ck_assert(isinf(zs[0]));
    ck_assert_uint_eq(zc[1], 0xFF);
    ck_assert_uint_eq(zc[3], 0x7F);
    ck_assert_uint_eq(zc[0], 0x00);
    for (int i = 0; i < 4; i++) /* 0 * Inf and Inf / Inf: NaN with the sign of x */
        ck_assert_uint_eq(bits_of(zo[i]), i == 1 ? 0xFFC00000u : 0x7FC00000u);
}
END_TEST

/* ---- rounding mode ---- */

START_TEST(results_do_not_depend_on_rounding_mode)
{
    const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    enum { NS = 20000 };
    static uint8_t e4[NS], e2[NS], sb[NS];
    static uint16_t bf[NS];
    float xs[NS];
    rng_state = 99;
    for (int i = 0; i < NS; i++)
        xs[i] = float_of((uint32_t)rng_next());
    for (int i = 0; i < NS; i++) {
        e4[i] = dsv4_f32_to_e4m3(xs[i]);
        e2[i] = dsv4_f32_to_e2m1(xs[i]);
        bf[i] = dsv4_f32_to_bf16(xs[i]);
        sb[i] = dsv4_ue8m0_scale_for(fabsf(xs[i]), 448.0f);
    }
    const int64_t N = 130, K = 192;
    float *w = make_weights(N, K, 13);
    uint8_t *q0 = malloc((size_t)(N * K)), *q1 = malloc((size_t)(N * K)), s0[4], s1[4];
    uint8_t *p0 = malloc((size_t)(N * K / 2)), *p1 = malloc((size_t)(N * K / 2));
    uint8_t *g0 = malloc((size_t)(N * K / 32)), *g1 = malloc((size_t)(N * K / 32));
    float a0[192], a1[192];
    ck_assert_int_eq(dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q0, s0, "w", NULL), DSV4_OK);
    ck_assert_int_eq(dsv4_quant_fp4_block(w, N, K, p0, g0, "w", NULL), DSV4_OK);
    dsv4_act_quant_row(w, K, DSV4_ACT_QUANT_UE8M0, a0, NULL, NULL);
    int saved = fegetround();
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        ck_assert_int_eq(fesetround(modes[m]), 0);
        int bad = 0;
        for (int i = 0; i < NS && !bad; i++)
            bad = e4[i] != dsv4_f32_to_e4m3(xs[i]) || e2[i] != dsv4_f32_to_e2m1(xs[i]) ||
                  bf[i] != dsv4_f32_to_bf16(xs[i]) || sb[i] != dsv4_ue8m0_scale_for(fabsf(xs[i]), 448.0f);
        dsv4_status st8 = dsv4_quant_fp8_block(w, N, K, DSV4_SCALE_UE8M0, q1, s1, "w", NULL);
        dsv4_status st4 = dsv4_quant_fp4_block(w, N, K, p1, g1, "w", NULL);
        dsv4_act_quant_row(w, K, DSV4_ACT_QUANT_UE8M0, a1, NULL, NULL);
        fesetround(saved);
        ck_assert_msg(!bad, "encoder changed under rounding mode %d", modes[m]);
        ck_assert_int_eq(st8, DSV4_OK);
        ck_assert_int_eq(st4, DSV4_OK);
        ck_assert_mem_eq(q0, q1, (size_t)(N * K));
        ck_assert_mem_eq(s0, s1, sizeof s0);
        ck_assert_mem_eq(p0, p1, (size_t)(N * K / 2));
        ck_assert_mem_eq(g0, g1, (size_t)(N * K / 32));
        ck_assert_mem_eq(a0, a1, sizeof a0);
    }
    free(w);
    free(q0);
    free(q1);
    free(p0);
    free(p1);
    free(g0);
    free(g1);
}
END_TEST


/* ---- fp4 / fp8 weights to e4m3 with 1x128 scales (the fp8 GEMM mode) ---- */

/* Every e2m1 value of every sub-group scale within the spread converts exactly; one more is refused. */
START_TEST(fp4_to_e4m3_exact_within_spread)
{
    enum { N = 3, K = 256 };
    uint8_t q[N * K / 2], sc[N * K / 32], dst[N * K];
    float ds[(K / 128) * N];
    uint32_t st = 12345;
    for (int base = 0; base <= 240; base += 7)
        for (int spread = 0; spread <= DSV4_FP4_TO_FP8_SPREAD + 1; spread++) {
            for (int i = 0; i < N * K / 2; i++) {
                st = st * 1664525u + 1013904223u;
                q[i] = (uint8_t)(st >> 24);
            }
            for (int r = 0; r < N; r++)
                for (int g = 0; g < K / 32; g++) /* the four sub-groups of each 128-group: base .. base + spread */
                    sc[r * (K / 32) + g] = (uint8_t)(base + (g % 4 == 1 ? spread : (g % 4 == 3 ? spread / 2 : 0)));
            int64_t fr = -1, fg = -1;
            int64_t bad = dsv4_fp4_to_e4m3_128(q, K / 2, sc, N, K, dst, K, ds, N, 1, &fr, &fg);
            REQUIRE(dsv4_fp4_scales_beyond_e4m3(sc, N, K) == bad, "base %d spread %d: the count differs from the "
                    "conversion's", base, spread);
            if (spread > DSV4_FP4_TO_FP8_SPREAD || base + spread > 254) {
                REQUIRE(bad == N * (K / 128) && fr == 0 && fg == 0, "base %d spread %d: %lld groups refused", base,
                        spread, (long long)bad);
                REQUIRE(isnan(ds[0]), "refused group's scale is NaN");
                continue;
            }
            REQUIRE(bad == 0, "base %d spread %d: %lld groups refused", base, spread, (long long)bad);
            float want[N * K];
            dsv4_dequant_fp4_rows(q, sc, N, K, 0, N, want);
            for (int r = 0; r < N; r++)
                for (int k = 0; k < K; k++) {
                    float got = dsv4_e4m3_to_f32(dst[r * K + k]) * ds[(k / 128) * N + r];
                    REQUIRE(got == want[r * K + k], "base %d spread %d [%d,%d]: %a != %a", base, spread, r, k,
                            (double)got, (double)want[r * K + k]);
                }
        }
}
END_TEST

/* The fp8 conversion tests' layer: 200 x 256 codes (every byte value, in a fixed pattern) and the
   ue8m0 scales of its 2 x 2 blocks of 128. */
enum { F8N = 200, F8K = 256 };
static const uint8_t fp8_su[2 * 2] = {120, 127, 130, 3};

static void fp8_codes(uint8_t *q)
{
    for (int i = 0; i < F8N * F8K; i++)
        q[i] = (uint8_t)(i * 37 + 11);
}

/* fp8 codes are kept; each row gets its 128x128 block's scale (ue8m0 and fp32), N-major. */
START_TEST(fp8_to_e4m3_rows_take_block_scale)
{
    enum { N = F8N, K = F8K };
    static uint8_t q[N * K], dst[N * K];
    const uint8_t *su = fp8_su;
    float sf[2 * 2] = {0.5f, 3.0f, 1e-3f, 7.25f};
    static float ds[(K / 128) * N];
    fp8_codes(q);
    for (int mode = 0; mode < 2; mode++) {
        dsv4_fp8_to_e4m3_128(q, K, mode ? (const void *)sf : (const void *)su, mode ? DSV4_SCALE_FP32 : DSV4_SCALE_UE8M0,
                             N, K, dst, K, ds, N, 1);
        ck_assert_int_eq(memcmp(q, dst, sizeof q), 0);
        for (int r = 0; r < N; r++)
            for (int kb = 0; kb < 2; kb++) {
                float want = mode ? sf[(r / 128) * 2 + kb] : dsv4_ue8m0_to_f32(su[(r / 128) * 2 + kb]);
                REQUIRE(ds[kb * N + r] == want, "row %d block %d", r, kb);
            }
    }
}
END_TEST

/* One scale per 128x128 block: every value code x scale equals the per-row conversion's (the
   codes move by a power of two per row, the scale back); a block whose rows' bytes spread past
   the rule together is refused though each row alone converts; a partial last block. */
START_TEST(fp4_to_e4m3_blocks_match_rows)
{
    enum { N = 300, K = 256, NB = (N + 127) / 128 };
    static uint8_t q[N * K / 2], sc[N * K / 32], dr[N * K], db[N * K];
    static float sr[(K / 128) * N], sb[(K / 128) * NB], want[N * K];
    uint32_t st = 777;
    for (int i = 0; i < N * K / 2; i++) {
        st = st * 1664525u + 1013904223u;
        q[i] = (uint8_t)(st >> 24);
    }
    for (int wide = 0; wide < 2; wide++) {
        /* rows' bytes in [120, 126]; with `wide`, rows 130.. of block 1 K block 1 at 140 (spread 20 across rows) */
        for (int r = 0; r < N; r++)
            for (int g = 0; g < K / 32; g++)
                sc[r * (K / 32) + g] = (uint8_t)(wide && r >= 130 && r < 256 && g >= 4 ? 140 : 120 + (r * 7 + g * 3) % 7);
        ck_assert_int_eq(dsv4_fp4_to_e4m3_128(q, K / 2, sc, N, K, dr, K, sr, N, 1, NULL, NULL), 0);
        int64_t fr = -1, fg = -1;
        const int64_t bad = dsv4_fp4_to_e4m3_blocks(q, K / 2, sc, N, K, 128, db, K, sb, NB, 1, &fr, &fg);
        dsv4_dequant_fp4_rows(q, sc, N, K, 0, N, want);
        if (wide) {
            REQUIRE(bad == 1 && fr == 128 && fg == 1, "refused %lld blocks, first row %lld group %lld", (long long)bad,
                    (long long)fr, (long long)fg);
            REQUIRE(isnan(sb[1 * NB + 1]), "the refused block's scale is NaN");
        } else {
            REQUIRE(bad == 0, "%lld blocks refused", (long long)bad);
        }
        for (int r = 0; r < N; r++)
            for (int k = 0; k < K; k++) {
                const int blk = r / 128, kb = k / 128;
                if (wide && blk == 1 && kb == 1)
                    continue;
                const float rowv = dsv4_e4m3_to_f32(dr[r * K + k]) * sr[kb * N + r];
                const float blkv = dsv4_e4m3_to_f32(db[r * K + k]) * sb[kb * NB + blk];
                REQUIRE(blkv == rowv && blkv == want[r * K + k], "[%d,%d]: block %a row %a want %a", r, k, (double)blkv,
                        (double)rowv, (double)want[r * K + k]);
            }
    }
}
END_TEST

/* fp8 with 128-row blocks: the codes kept, one scale per block (the first row's). */
START_TEST(fp8_to_e4m3_blocks_keep_block_scale)
{
    enum { N = F8N, K = F8K };
    static uint8_t q[N * K], dst[N * K];
    const uint8_t *su = fp8_su;
    float ds[2 * 2];
    fp8_codes(q);
    dsv4_fp8_to_e4m3_blocks(q, K, su, DSV4_SCALE_UE8M0, N, K, 128, dst, K, ds, 2, 1);
    ck_assert_int_eq(memcmp(q, dst, sizeof q), 0);
    for (int rb = 0; rb < 2; rb++)
        for (int kb = 0; kb < 2; kb++)
            REQUIRE(ds[kb * 2 + rb] == dsv4_ue8m0_to_f32(su[rb * 2 + kb]), "block %d %d", rb, kb);
}
END_TEST

Suite *formats_suite(void)
{
    Suite *s = suite_create("formats");
    TCase *tc = tcase_create("e4m3");
    tcase_add_test(tc, e4m3_decode_all_codes);
    tcase_add_test(tc, e4m3_codes_reencode_to_themselves);
    tcase_add_test(tc, e4m3_nan);
    tcase_add_test(tc, e4m3_ties_to_even_and_neighbours);
    tcase_add_test(tc, e4m3_saturates);
    tcase_add_test(tc, e4m3_underflow_to_zero);
    tcase_add_test(tc, e4m3_matches_nearest_search);
    suite_add_tcase(s, tc);

    tc = tcase_create("e2m1");
    tcase_add_test(tc, e2m1_all_codes);
    tcase_add_test(tc, e2m1_ties_to_even);
    tcase_add_test(tc, e2m1_saturation_nan_zero);
    tcase_add_test(tc, e2m1_matches_nearest_search);
    suite_add_tcase(s, tc);

    tc = tcase_create("bf16");
    tcase_add_test(tc, bf16_round_to_nearest_even);
    tcase_add_test(tc, bf16_specials);
    tcase_add_test(tc, bf16_all_patterns_round_trip);
    tcase_add_test(tc, bf16_matches_bracket_search);
    suite_add_tcase(s, tc);

    tc = tcase_create("ue8m0");
    tcase_add_test(tc, ue8m0_decode);
    tcase_add_test(tc, ue8m0_scale_at_exact_powers);
    tcase_add_test(tc, ue8m0_scale_specials);
    tcase_add_test(tc, ue8m0_scale_is_tight);
    suite_add_tcase(s, tc);

    tc = tcase_create("weights");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fp8_block_ue8m0_roundtrip);
    tcase_add_test(tc, fp8_block_fp32_roundtrip);
    tcase_add_test(tc, fp8_zero_block_gets_floor_scale);
    tcase_add_test(tc, fp8_ue8m0_requant_keeps_values);
    tcase_add_test(tc, fp4_packing_order);
    tcase_add_test(tc, fp4_roundtrip);
    tcase_add_test(tc, quant_rejects_nonfinite);
    tcase_add_test(tc, quant_rejects_bad_arguments);
    tcase_add_test(tc, dequant_row_ranges);
    suite_add_tcase(s, tc);

    tc = tcase_create("act_quant");
    tcase_add_test(tc, act_quant_exact_power_amax);
    tcase_add_test(tc, act_quant_partial_last_group);
    tcase_add_test(tc, act_quant_floor);
    tcase_add_test(tc, act_quant_fp32_mode_and_clamp);
    tcase_add_test(tc, act_quant_none_copies);
    tcase_add_test(tc, act_quant_nan_stays_local);
    suite_add_tcase(s, tc);

    tc = tcase_create("determinism");
    tcase_add_test(tc, results_do_not_depend_on_rounding_mode);
    tcase_add_test(tc, fp4_to_e4m3_exact_within_spread);
    tcase_add_test(tc, fp8_to_e4m3_rows_take_block_scale);
    tcase_add_test(tc, fp4_to_e4m3_blocks_match_rows);
    tcase_add_test(tc, fp8_to_e4m3_blocks_keep_block_scale);
    suite_add_tcase(s, tc);
    return s;
}
