/*
 * The kernel tables: built once (the first backend creation), reference-first, each level
 * a copy of the level below with its instruction set's entries overridden; only the levels
 * this CPU runs are built. The level a backend runs is its creator's choice
 * (dsv4_backend_options.cpu_kernels); the library reads no environment.
 */
#include <pthread.h>

#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"
#include "core/err.h"

float dsv4_cpu_ue8m0_f32[256];
uint16_t dsv4_cpu_e2m1_bf16[32];

#define NLEVELS (DSV4_CPU_KERNELS_AVX512_VBMI + 1)

static dsv4_cpu_kernels_table tables[NLEVELS];
static dsv4_cpu_kernels best; /* the highest level this CPU runs */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const names[NLEVELS] = {"auto", "ref", "avx2", "avx512", "avx512-bf16", "avx512-vbmi"};

/* Whether this CPU has the instructions of exactly this level (the levels below are checked apart). */
static bool cpu_has(dsv4_cpu_kernels level)
{
#if CPU_X86
    __builtin_cpu_init();
    switch (level) {
    case DSV4_CPU_KERNELS_REF: return true;
    case DSV4_CPU_KERNELS_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case DSV4_CPU_KERNELS_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    case DSV4_CPU_KERNELS_AVX512_BF16: return __builtin_cpu_supports("avx512bf16");
    case DSV4_CPU_KERNELS_AVX512_VBMI: return __builtin_cpu_supports("avx512vbmi");
    default: return false;
    }
#else
    return level == DSV4_CPU_KERNELS_REF;
#endif
}

static void build(void)
{
    static const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    static void (*const fill[NLEVELS])(dsv4_cpu_kernels_table *) = {
        NULL, dsv4_cpu_kernels_fill_ref, dsv4_cpu_kernels_fill_avx2, dsv4_cpu_kernels_fill_avx512,
        dsv4_cpu_kernels_fill_avx512bf16, dsv4_cpu_kernels_fill_avx512vbmi};
    for (int i = 0; i < 256; i++)
        dsv4_cpu_ue8m0_f32[i] = ue8m0f((uint8_t)i);
    for (int i = 0; i < 32; i++)
        dsv4_cpu_e2m1_bf16[i] = (uint16_t)(dsv4_f32_bits(e2m1[i & 15]) >> 16); /* exact: 2 mantissa bits */
    best = DSV4_CPU_KERNELS_REF;
    for (int l = DSV4_CPU_KERNELS_REF; l < NLEVELS && cpu_has((dsv4_cpu_kernels)l); l++) {
        if (l > DSV4_CPU_KERNELS_REF)
            tables[l] = tables[l - 1];
        fill[l](&tables[l]);
        tables[l].level = (dsv4_cpu_kernels)l;
        tables[l].name = names[l];
        best = (dsv4_cpu_kernels)l;
    }
}

const char *dsv4_cpu_kernels_name(dsv4_cpu_kernels level)
{
    return (int)level >= 0 && (int)level < NLEVELS ? names[level] : "unknown";
}

dsv4_status dsv4_cpu_kernels_from_name(const char *name, dsv4_cpu_kernels *out, dsv4_error *err)
{
    for (int l = 0; name && l < NLEVELS; l++)
        if (strcmp(name, names[l]) == 0) {
            *out = (dsv4_cpu_kernels)l;
            return DSV4_OK;
        }
    return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu kernels",
                       "'%s' is not a kernel table (auto, ref, avx2, avx512, avx512-bf16, avx512-vbmi)",
                       name ? name : "(null)");
}

bool dsv4_cpu_kernels_available(dsv4_cpu_kernels level)
{
    pthread_once(&once, build);
    return (int)level >= 0 && (int)level < NLEVELS && level <= best;
}

dsv4_status dsv4_cpu_kernels_get(dsv4_cpu_kernels level, const dsv4_cpu_kernels_table **out, dsv4_error *err)
{
    pthread_once(&once, build);
    if ((int)level < 0 || (int)level >= NLEVELS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu kernels", "value %d is not a dsv4_cpu_kernels", (int)level);
    if (level == DSV4_CPU_KERNELS_AUTO)
        level = best;
    if (level > best)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "cpu kernels",
                           "table %s needs instructions this CPU lacks (the best it runs is %s)", names[level],
                           names[best]);
    *out = &tables[level];
    return DSV4_OK;
}

const dsv4_cpu_kernels_table *dsv4_cpu_kernels_ref(void)
{
    pthread_once(&once, build);
    return &tables[DSV4_CPU_KERNELS_REF];
}
