/*
 * bench/ceilings.cu: the two hardware ceilings, measured on the device in the same call
 * as the benchmark they normalise.
 *
 *   copy   device-to-device cudaMemcpyAsync of a few GiB; GB/s counts bytes read + bytes written;
 *          median of many event-timed repetitions.
 *   host   pageable and pinned host<->device copies of 128 MiB (the public forward takes host x and
 *          returns host y, so these bound what a forward pays for its own I/O).
 *   gemm   cuBLASLt matrix products on random data (never zeros): FP8 e4m3 with block scaling
 *          (1x128 activations, 128x128 weights: CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F /
 *          BLK128x128_32F), FP8 with per-tensor scales, and bf16 for reference. For each kind the
 *          supported scale-mode combinations are probed through cublasLtMatmulAlgoGetHeuristic,
 *          the best of the first few algorithms is picked, then timed (median of many reps).
 *          A block-scaled product is also checked against a naive kernel on a 64x64 corner, under
 *          both plausible orders of each scale tensor (K blocks fastest or rows fastest), so the
 *          JSON says which layout cuBLASLt used and how close it was.
 *
 * Conventions (cuBLAS is column-major): the weight W [N, K] row-major is cuBLAS A (op T, K x N),
 * the activation X [M, K] row-major is cuBLAS B (op N, K x M), D is N x M column-major, i.e.
 * Y [M, N] row-major = X W^T, the layer's y = x . W^T. Orientation "aw" swaps the roles (the
 * activation is A), as NVIDIA's block-scaling sample does; both are probed.
 *
 * usage: ceilings [JSON_PATH] [--quick]      (default out/bench/ceilings.json)
 * Exit status: 0 when the copy and at least one GEMM were measured, 1 otherwise.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                                 \
    do {                                                                                                      \
        cudaError_t e_ = (x);                                                                                 \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "ceilings: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

static double median(std::vector<double> v)
{
    if (v.empty())
        return NAN;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- random fills (a hash of the index: deterministic, not zeros) ---- */

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint32_t h = (uint32_t)(i * 0x9E3779B97F4A7C15ull >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

/* uniform in [-2, 2) */
__device__ __forceinline__ float urand(uint64_t i, uint32_t seed)
{
    return ((float)(hash32(i, seed) >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f;
}

__global__ void fill_fp8(__nv_fp8_e4m3 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __nv_fp8_e4m3(urand(i, seed));
}

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(urand(i, seed));
}

/* powers of two 2^-3 .. 2^3, so a scale layout mix-up shows as an O(1) error */
__global__ void fill_scale(float *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = ldexpf(1.0f, (int)(hash32(i, seed) % 7u) - 3);
}

__global__ void fill_bytes(uint4 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(hash32(4 * i, seed), hash32(4 * i + 1, seed), hash32(4 * i + 2, seed),
                          hash32(4 * i + 3, seed));
}

/* The scale of row r, K block kb, of an operand with `rows` rows under scale order `hyp`. */
__device__ double scale_at(const float *s, int mode, int hyp, int64_t r, int64_t rows, int64_t kb, int64_t KB)
{
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
        return s[0];
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
        int64_t RB = (rows + 127) / 128, rb = r / 128;
        return hyp ? s[rb + kb * RB] : s[kb + rb * KB];
    }
    return hyp ? s[r + kb * rows] : s[kb + r * KB];
}

/*
 * Naive reference of D[i, j] (column-major m x n) = sum_k A'[i, k] B'[j, k] sa sb, where A' rows
 * and B' rows are K-contiguous (op T on A, op N on B). Scale order per operand: 0 = K blocks
 * fastest (s[kb + r * KB]), 1 = rows fastest (s[r + kb * R]); block rows are r / 128 for 128x128.
 * Writes out[hyp * cnt + i * cj + j] for the 4 hypotheses (hyp = ha * 2 + hb).
 */
__global__ void ref_corner(const __nv_fp8_e4m3 *A, const float *sa, int amode, int64_t m, const __nv_fp8_e4m3 *B,
                           const float *sb, int bmode, int64_t n, int64_t K, int ci, int cj, double *out)
{
    int i = blockIdx.x, j = threadIdx.x;
    if (i >= ci || j >= cj)
        return;
    int64_t KB = (K + 127) / 128;
    double acc[4] = {0, 0, 0, 0};
    for (int64_t kb = 0; kb < KB; kb++) {
        double part = 0;
        for (int64_t k = kb * 128; k < K && k < kb * 128 + 128; k++)
            part += (double)(float)A[k + (int64_t)i * K] * (double)(float)B[k + (int64_t)j * K];
        for (int ha = 0; ha < 2; ha++)
            for (int hb = 0; hb < 2; hb++) {
                double s_a = scale_at(sa, amode, ha, i, m, kb, KB), s_b = scale_at(sb, bmode, hb, j, n, kb, KB);
                acc[ha * 2 + hb] += part * s_a * s_b;
            }
    }
    for (int h = 0; h < 4; h++)
        out[(size_t)h * ci * cj + (size_t)i * cj + j] = acc[h];
}

static const char *mode_name(int m)
{
    switch (m) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F:
        return "scalar";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
        return "vec128";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
        return "blk128x128";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F:
        return "outer_vec";
    default:
        return "?";
    }
}

struct GemmResult {
    std::string name, kind, orient, note, layout;
    int64_t M = 0, N = 0, K = 0;
    int amode = 0, bmode = 0; /* weight's and activation's scale modes */
    bool supported = false;
    int algos = 0, algo_used = -1;
    double ms = NAN, tflops = NAN, verify_rel = NAN;
};

struct Bufs {
    void *w = nullptr, *x = nullptr, *d = nullptr, *ws = nullptr;
    float *sw = nullptr, *sx = nullptr;
    size_t ws_bytes = 64ull << 20;
};

/*
 * One product Y[M, N] = X[M, K] W[N, K]^T. kind: "fp8" or "bf16". wmode/xmode: scale modes of the
 * weight and the activation (fp8 only). orient "wa": W is cuBLAS A; "aw": X is cuBLAS A.
 */
static GemmResult run_gemm(cublasLtHandle_t lt, cudaStream_t st, Bufs &b, const char *name, const char *kind,
                           const char *orient, int64_t M, int64_t N, int64_t K, int wmode, int xmode, int reps,
                           bool verify)
{
    GemmResult r;
    r.name = name;
    r.kind = kind;
    r.orient = orient;
    r.M = M;
    r.N = N;
    r.K = K;
    r.amode = wmode;
    r.bmode = xmode;
    bool fp8 = !strcmp(kind, "fp8"), wa = !strcmp(orient, "wa");
    cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    /* cuBLAS operands: A op T (K x m stored, m x K used), B op N (K x n) */
    int64_t m = wa ? N : M, n = wa ? M : N;
    void *A = wa ? b.w : b.x, *B = wa ? b.x : b.w;
    const float *sA = wa ? b.sw : b.sx, *sB = wa ? b.sx : b.sw;
    int amode = wa ? wmode : xmode, bmode = wa ? xmode : wmode;

    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
    if (fp8 && s == CUBLAS_STATUS_SUCCESS) {
        int32_t am = amode, bm = bmode;
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sA, sizeof sA);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sB, sizeof sB);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        r.note = "descriptor rejected (status " + std::to_string((int)s) + ")";
        if (op)
            cublasLtMatmulDescDestroy(op);
        return r;
    }
    cublasLtMatrixLayoutCreate(&la, ab, K, m, K);
    cublasLtMatrixLayoutCreate(&lb, ab, K, n, K);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b.ws_bytes,
                                         sizeof b.ws_bytes);
    cublasLtMatmulHeuristicResult_t heur[8];
    int nh = 0;
    s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 8, heur, &nh);
    float alpha = 1.0f, beta = 0.0f;
    if (s != CUBLAS_STATUS_SUCCESS || nh == 0) {
        r.note = "no algorithm (heuristic status " + std::to_string((int)s) + ", " + std::to_string(nh) + " results)";
    } else {
        r.algos = nh;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        /* pick the fastest of the first four algorithms (5 timed launches each) */
        double best = 1e30;
        for (int a = 0; a < nh && a < 4; a++) {
            if (cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, b.d, ld, b.d, ld, &heur[a].algo, b.ws,
                               b.ws_bytes, st) != CUBLAS_STATUS_SUCCESS)
                continue;
            std::vector<double> t;
            for (int i = 0; i < 5; i++) {
                CK(cudaEventRecord(e0, st));
                cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, b.d, ld, b.d, ld, &heur[a].algo, b.ws, b.ws_bytes,
                               st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float msf;
                CK(cudaEventElapsedTime(&msf, e0, e1));
                t.push_back(msf);
            }
            double md = median(t);
            if (md < best) {
                best = md;
                r.algo_used = a;
            }
        }
        CK(cudaGetLastError());
        if (r.algo_used < 0) {
            r.note = "every algorithm failed to launch";
        } else {
            std::vector<double> t;
            for (int i = 0; i < reps; i++) {
                CK(cudaEventRecord(e0, st));
                cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, b.d, ld, b.d, ld, &heur[r.algo_used].algo, b.ws,
                               b.ws_bytes, st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float msf;
                CK(cudaEventElapsedTime(&msf, e0, e1));
                t.push_back(msf);
            }
            CK(cudaGetLastError());
            r.supported = true;
            r.ms = median(t);
            r.tflops = 2.0 * (double)M * (double)N * (double)K / (r.ms * 1e-3) / 1e12;
            if (verify && fp8) {
                const int ci = 64, cj = 64, cnt = ci * cj;
                double *dref;
                CK(cudaMalloc(&dref, sizeof(double) * 4 * cnt));
                ref_corner<<<ci, cj, 0, st>>>((const __nv_fp8_e4m3 *)A, sA, amode, m, (const __nv_fp8_e4m3 *)B, sB,
                                              bmode, n, K, ci, cj, dref);
                CK(cudaGetLastError());
                std::vector<double> href(4 * cnt);
                std::vector<__nv_bfloat16> hd((size_t)m * cj);
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(href.data(), dref, sizeof(double) * 4 * cnt, cudaMemcpyDeviceToHost));
                /* columns 0..cj of D (column-major m x n), rows 0..ci */
                CK(cudaMemcpy2D(hd.data(), sizeof(__nv_bfloat16) * ci, b.d, sizeof(__nv_bfloat16) * m,
                                sizeof(__nv_bfloat16) * ci, cj, cudaMemcpyDeviceToHost));
                CK(cudaFree(dref));
                double best_rel = 1e30;
                int best_h = -1;
                for (int h = 0; h < 4; h++) {
                    double num = 0, den = 0;
                    bool finite = true;
                    for (int i = 0; i < ci; i++)
                        for (int j = 0; j < cj; j++) {
                            double ref = href[(size_t)h * cnt + (size_t)i * cj + j];
                            double got = (double)__bfloat162float(hd[(size_t)j * ci + i]);
                            if (!std::isfinite(got))
                                finite = false;
                            num += (got - ref) * (got - ref);
                            den += ref * ref;
                        }
                    double rel = finite && den > 0 ? sqrt(num / den) : INFINITY;
                    if (rel < best_rel) {
                        best_rel = rel;
                        best_h = h;
                    }
                }
                r.verify_rel = best_rel;
                const char *lay[2] = {"kblocks-fastest", "rows-fastest"};
                bool a_scalar = amode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                     b_scalar = bmode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
                char buf[160];
                snprintf(buf, sizeof buf, "A scales %s, B scales %s", a_scalar ? "scalar" : lay[best_h / 2],
                         b_scalar ? "scalar" : lay[best_h % 2]);
                r.layout = buf;
                if (best_rel > 2e-2)
                    r.note = "numerics do not match the naive reference under any scale order tried";
            }
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return r;
}

static void json_str(FILE *f, const std::string &s)
{
    fputc('"', f);
    for (char c : s) {
        if (c == '"' || c == '\\')
            fputc('\\', f);
        fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (std::isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

int main(int argc, char **argv)
{
    const char *json = "out/bench/ceilings.json";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: ceilings [JSON_PATH] [--quick]\n");
            return 0;
        } else
            json = argv[i];
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int clock_khz = 0, mem_clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    printf("ceilings: %s sm_%d%d, %d SMs, L2 %d MiB, %.1f GiB (%.1f free), cublasLt %zu\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20, total_b / 1073741824.0,
           free_b / 1073741824.0, cublasLtGetVersion());
    cudaStream_t st;
    CK(cudaStreamCreate(&st));

    /* ---- copy bandwidth ---- */
    const size_t copy_bytes = (quick ? 1ull : 2ull) << 30;
    const int copy_reps = quick ? 10 : 30;
    void *src, *dst;
    CK(cudaMalloc(&src, copy_bytes));
    CK(cudaMalloc(&dst, copy_bytes));
    fill_bytes<<<1024, 256, 0, st>>>((uint4 *)src, copy_bytes / 16, 11);
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
    std::vector<double> ct;
    for (int i = 0; i < copy_reps; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float msf;
        CK(cudaEventElapsedTime(&msf, e0, e1));
        ct.push_back(msf);
    }
    double copy_ms = median(ct), copy_min = *std::min_element(ct.begin(), ct.end());
    double copy_gbs = 2.0 * (double)copy_bytes / (copy_ms * 1e-3) / 1e9;
    printf("copy: %.2f GiB D2D, median %.3f ms (min %.3f) over %d reps: %.1f GB/s (read + written)\n",
           copy_bytes / 1073741824.0, copy_ms, copy_min, copy_reps, copy_gbs);
    /* host <-> device: the public API takes host x and returns host y, so these bound what a
       forward pays for its own I/O (pageable malloc memory, as a caller has, and pinned) */
    const size_t io_bytes = 128ull << 20;
    double io_gbs[2][2]; /* [pinned][0 = h2d, 1 = d2h] */
    for (int pinned = 0; pinned < 2; pinned++) {
        void *h = nullptr;
        if (pinned)
            CK(cudaMallocHost(&h, io_bytes));
        else
            h = malloc(io_bytes);
        if (!h) {
            fprintf(stderr, "ceilings: out of host memory\n");
            return 1;
        }
        memset(h, 1, io_bytes);
        for (int dir = 0; dir < 2; dir++) {
            std::vector<double> t;
            for (int i = 0; i < 8; i++) {
                CK(cudaEventRecord(e0, st));
                if (dir == 0)
                    CK(cudaMemcpyAsync(dst, h, io_bytes, cudaMemcpyHostToDevice, st));
                else
                    CK(cudaMemcpyAsync(h, src, io_bytes, cudaMemcpyDeviceToHost, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float msf;
                CK(cudaEventElapsedTime(&msf, e0, e1));
                if (i >= 2)
                    t.push_back(msf);
            }
            io_gbs[pinned][dir] = (double)io_bytes / (median(t) * 1e-3) / 1e9;
        }
        if (pinned)
            CK(cudaFreeHost(h));
        else
            free(h);
    }
    printf("host copies of 128 MiB: pageable h2d %.1f GB/s, d2h %.1f GB/s; pinned h2d %.1f GB/s, d2h %.1f GB/s\n",
           io_gbs[0][0], io_gbs[0][1], io_gbs[1][0], io_gbs[1][1]);
    CK(cudaFree(src));
    CK(cudaFree(dst));

    /* ---- GEMMs ---- */
    const int64_t S = quick ? 4096 : 8192;
    Bufs b;
    size_t wbytes = (size_t)S * S * 2; /* bf16 size; fp8 uses half */
    CK(cudaMalloc(&b.w, wbytes));
    CK(cudaMalloc(&b.x, wbytes));
    CK(cudaMalloc(&b.d, (size_t)S * S * 2));
    CK(cudaMalloc(&b.ws, b.ws_bytes));
    /* scale tensors: vec128 needs rows * K/128, blk128 (rows/128) * (K/128): rows*K/128 covers both */
    size_t ns = (size_t)S * ((S + 127) / 128);
    CK(cudaMalloc(&b.sw, ns * sizeof(float)));
    CK(cudaMalloc(&b.sx, ns * sizeof(float)));
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "ceilings: cublasLtCreate failed\n");
        return 1;
    }
    const int reps = quick ? 10 : 30;
    std::vector<GemmResult> res;
    auto fill_fp8_all = [&]() {
        fill_fp8<<<1024, 256, 0, st>>>((__nv_fp8_e4m3 *)b.w, (size_t)S * S, 1);
        fill_fp8<<<1024, 256, 0, st>>>((__nv_fp8_e4m3 *)b.x, (size_t)S * S, 2);
        fill_scale<<<256, 256, 0, st>>>(b.sw, ns, 3);
        fill_scale<<<256, 256, 0, st>>>(b.sx, ns, 4);
        CK(cudaGetLastError());
    };
    fill_fp8_all();
    const int SC = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, V = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
              BL = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    /* the DeepSeek recipe first: weights 128x128, activations 1x128 */
    struct Combo {
        const char *name, *orient;
        int wmode, xmode;
    } combos[] = {
        {"fp8 block (w 128x128, x 1x128)", "wa", BL, V}, {"fp8 block (w 128x128, x 1x128)", "aw", BL, V},
        {"fp8 block (w 1x128, x 1x128)", "wa", V, V},    {"fp8 per-tensor", "wa", SC, SC},
    };
    for (const Combo &c : combos)
        res.push_back(run_gemm(lt, st, b, c.name, "fp8", c.orient, S, S, S, c.wmode, c.xmode, reps, c.wmode != SC));
    /* expert-shaped block-scaled products (gate/up fused 2I x H and down H x I at a 4096-row group) */
    if (!quick) {
        for (const Combo &c : combos) {
            if (c.wmode != BL)
                continue;
            res.push_back(run_gemm(lt, st, b, "fp8 block, w13 shape", "fp8", c.orient, 4096, 4096, 4096, c.wmode,
                                   c.xmode, reps, false));
            res.push_back(run_gemm(lt, st, b, "fp8 block, w2 shape", "fp8", c.orient, 4096, 4096, 2048, c.wmode,
                                   c.xmode, reps, false));
        }
    }
    fill_bf16<<<1024, 256, 0, st>>>((__nv_bfloat16 *)b.w, (size_t)S * S, 5);
    fill_bf16<<<1024, 256, 0, st>>>((__nv_bfloat16 *)b.x, (size_t)S * S, 6);
    CK(cudaGetLastError());
    res.push_back(run_gemm(lt, st, b, "bf16", "bf16", "wa", S, S, S, SC, SC, reps, false));
    CK(cudaStreamSynchronize(st));

    /* headline numbers */
    double fp8_block = NAN, fp8_tensor = NAN, bf16 = NAN;
    std::string fp8_block_mode = "none supported";
    for (const GemmResult &r : res) {
        if (!r.supported || r.M != S || r.K != S)
            continue;
        /* a product whose corner did not match the naive reference is still a rate, but says so */
        bool unverified = r.verify_rel > 2e-2;
        if (r.kind == "bf16")
            bf16 = r.tflops;
        else if (r.amode == SC)
            fp8_tensor = r.tflops;
        else if (!(r.tflops <= fp8_block)) {
            fp8_block = r.tflops;
            fp8_block_mode = std::string("w ") + mode_name(r.amode) + ", x " + mode_name(r.bmode) + ", " + r.orient +
                             (unverified ? ", numerics unverified" : "");
        }
    }
    printf("%-34s %-4s %6s %6s %6s %8s %9s %9s  %s\n", "gemm", "ori", "M", "N", "K", "ms", "TFLOP/s", "rel.err",
           "note");
    for (const GemmResult &r : res)
        printf("%-34s %-4s %6lld %6lld %6lld %8.3f %9.1f %9.2e  %s%s%s\n", r.name.c_str(), r.orient.c_str(),
               (long long)r.M, (long long)r.N, (long long)r.K, r.ms, r.tflops, r.verify_rel,
               r.supported ? "" : "UNSUPPORTED: ", r.note.c_str(), r.layout.empty() ? "" : (" [" + r.layout + "]").c_str());
    printf("ceilings: copy %.1f GB/s; fp8 block-scaled %.1f TFLOP/s (%s); fp8 per-tensor %.1f; bf16 %.1f TFLOP/s\n",
           copy_gbs, fp8_block, fp8_block_mode.c_str(), fp8_tensor, bf16);
    if (!std::isfinite(fp8_block))
        printf("ceilings: block-scaled FP8 is not available here; the FP8 ceiling falls back to per-tensor scaling\n");

    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "ceilings: cannot write %s\n", json);
        return 1;
    }
    fprintf(f, "{\n  \"device\": ");
    json_str(f, prop.name);
    fprintf(f, ",\n  \"sm\": %d,\n  \"sm_count\": %d,\n  \"l2_bytes\": %d,\n  \"memory_bytes\": %zu,\n", prop.major * 10 + prop.minor,
            prop.multiProcessorCount, prop.l2CacheSize, total_b);
    fprintf(f, "  \"sm_clock_khz\": %d,\n  \"cublaslt_version\": %zu,\n", clock_khz, cublasLtGetVersion());
    fprintf(f, "  \"copy\": {\"bytes\": %zu, \"reps\": %d, \"median_ms\": ", copy_bytes, copy_reps);
    json_num(f, copy_ms);
    fprintf(f, ", \"min_ms\": ");
    json_num(f, copy_min);
    fprintf(f, ", \"gbs\": ");
    json_num(f, copy_gbs);
    fprintf(f, ", \"counts\": \"bytes read + bytes written\"},\n");
    fprintf(f, "  \"host_copy_gbs\": {\"bytes\": %zu, \"pageable_h2d\": %.3f, \"pageable_d2h\": %.3f, "
               "\"pinned_h2d\": %.3f, \"pinned_d2h\": %.3f},\n  \"copy_gbs\": ",
            io_bytes, io_gbs[0][0], io_gbs[0][1], io_gbs[1][0], io_gbs[1][1]);
    json_num(f, copy_gbs);
    fprintf(f, ",\n  \"fp8_block_tflops\": ");
    json_num(f, fp8_block);
    fprintf(f, ",\n  \"fp8_block_mode\": ");
    json_str(f, fp8_block_mode);
    fprintf(f, ",\n  \"fp8_tensor_tflops\": ");
    json_num(f, fp8_tensor);
    fprintf(f, ",\n  \"fp8_gemm_tflops\": ");
    json_num(f, std::isfinite(fp8_block) ? fp8_block : fp8_tensor);
    fprintf(f, ",\n  \"fp8_gemm_kind\": \"%s\"", std::isfinite(fp8_block) ? "block-scaled" : "per-tensor");
    fprintf(f, ",\n  \"bf16_tflops\": ");
    json_num(f, bf16);
    fprintf(f, ",\n  \"gemms\": [\n");
    for (size_t i = 0; i < res.size(); i++) {
        const GemmResult &r = res[i];
        fprintf(f, "    {\"name\": ");
        json_str(f, r.name);
        fprintf(f, ", \"kind\": \"%s\", \"orientation\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                   "\"weight_scale\": \"%s\", \"act_scale\": \"%s\", \"supported\": %s, \"algos\": %d, \"algo_used\": %d, "
                   "\"median_ms\": ",
                r.kind.c_str(), r.orient.c_str(), (long long)r.M, (long long)r.N, (long long)r.K,
                r.kind == "fp8" ? mode_name(r.amode) : "none", r.kind == "fp8" ? mode_name(r.bmode) : "none",
                r.supported ? "true" : "false", r.algos, r.algo_used);
        json_num(f, r.ms);
        fprintf(f, ", \"tflops\": ");
        json_num(f, r.tflops);
        fprintf(f, ", \"verify_rel_err\": ");
        json_num(f, r.verify_rel);
        fprintf(f, ", \"scale_layout\": ");
        json_str(f, r.layout);
        fprintf(f, ", \"note\": ");
        json_str(f, r.note);
        fprintf(f, "}%s\n", i + 1 < res.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("ceilings: wrote %s\n", json);
    cublasLtDestroy(lt);
    return std::isfinite(copy_gbs) && (std::isfinite(fp8_block) || std::isfinite(fp8_tensor) || std::isfinite(bf16))
               ? 0
               : 1;
}
