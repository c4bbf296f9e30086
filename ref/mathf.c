/*
 * The reference's transcendental functions. libm's results may differ by an
 * ulp between libm versions and machines; these use only IEEE basic
 * operations in a fixed order, so they give the same bits everywhere.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ref/ref_internal.h"

static const double LN2_HI = 6.93147180369123816490e-01; /* high bits of ln 2, exact times small ints */
static const double LN2_LO = 1.90821492927058770002e-10;
static const double INV_LN2 = 1.44269504088896338700e+00;

static double pow2i(int k)
{
    /* 2^k for k in [-1022, 1023] by building the exponent field. */
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

double dsv4_ref_exp_d(double x)
{
    if (x != x)
        return x;
    if (x > 709.0)
        return INFINITY;
    if (x < -745.0)
        return 0.0;
    double kd = floor(x * INV_LN2 + 0.5);
    int k = (int)kd;
    double r = (x - kd * LN2_HI) - kd * LN2_LO; /* |r| <= 0.3466 */
    /* Taylor series to r^13, Horner form: truncation below 2^-60 relative. */
    double p = 1.0 / 6227020800.0;
    static const double c[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                               1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                               1.0 / 24.0,        1.0 / 6.0,        0.5,             1.0,
                               1.0};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        p = p * r + c[i];
    if (k < -1000) /* keep the scale factor a normal double */
        return p * pow2i(k + 60) * pow2i(-60);
    if (k > 1000)
        return p * pow2i(k - 60) * pow2i(60);
    return p * pow2i(k);
}

double dsv4_ref_log1p_d(double x)
{
    if (x != x || x < -1.0)
        return NAN;
    if (x == -1.0)
        return -INFINITY;
    if (x == INFINITY)
        return x;
    double ax = fabs(x);
    if (ax < 1e-4) {
        /* log1p(x) = x - x^2/2 + x^3/3 - x^4/4 + x^5/5; next term below 2^-66 relative. */
        return x * (1.0 + x * (-0.5 + x * (1.0 / 3.0 + x * (-0.25 + x * 0.2))));
    }
    double u = 1.0 + x;
    /* The rounding of 1 + x is undone by the correction term c / u. */
    double c = (u - 1.0) - x;
    int e;
    double m = frexp(u, &e); /* u = m 2^e, m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0); /* |s| <= 0.1716 */
    double s2 = s * s;
    /* 2 atanh(s) = 2 (s + s^3/3 + ... + s^23/23): truncation below 2^-60 relative. */
    double p = 1.0 / 23.0;
    for (int n = 21; n >= 1; n -= 2)
        p = p * s2 + 1.0 / (double)n;
    double lm = 2.0 * s * p;
    return ((double)e * LN2_HI + lm) + ((double)e * LN2_LO - c / u);
}

float dsv4_ref_expf(float x) { return (float)dsv4_ref_exp_d((double)x); }

float dsv4_ref_softplusf(float l)
{
    if (l > 20.0f)
        return l;
    return (float)dsv4_ref_log1p_d(dsv4_ref_exp_d((double)l));
}

float dsv4_ref_siluf(float g)
{
    float e = dsv4_ref_expf(-g);
    return g / (1.0f + e);
}
