/*
 * The router logits of large chunks on cuBLASLt (logits_blas.cuh: why, and what is kept).
 *
 * cuBLAS is column-major: the gate [E, H] row-major is cuBLAS A (op T: an H x E matrix, ld H), x
 * [rows, H] row-major is B (op N: H x rows, ld H), and D = A^T B is E x rows column-major, ld E,
 * which is logits [rows, E] row-major. The layouts of B and D depend on the chunk's rows, so they
 * and the algorithm are made per call (host work of a few microseconds on chunks of more than 32
 * tokens, whose forward takes hundreds); nothing is cached, so calls from several threads or
 * streams share no mutable state.
 */
#include "fast/cuda/logits_blas.cuh"

#include <cublasLt.h>
#include <new>
#include <stdio.h>

namespace dsv4cuda {

struct LogitsBlas {
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr; /* the gate */
    cublasLtMatmulPreference_t pref = nullptr;
    int E = 0, H = 0;
};

namespace {

/* The per-call part: B and D's layouts for rows, the first algorithm the heuristic returns. */
struct Call {
    cublasLtMatrixLayout_t lb = nullptr, ld = nullptr;
    cublasLtMatmulHeuristicResult_t heur;
    ~Call()
    {
        if (lb)
            cublasLtMatrixLayoutDestroy(lb);
        if (ld)
            cublasLtMatrixLayoutDestroy(ld);
    }
};

cublasStatus_t prepare(const LogitsBlas *g, int rows, Call &c)
{
    cublasStatus_t s = cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, (uint64_t)g->H, (uint64_t)rows, (int64_t)g->H);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&c.ld, CUDA_R_32F, (uint64_t)g->E, (uint64_t)rows, (int64_t)g->E);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    int n = 0;
    s = cublasLtMatmulAlgoGetHeuristic(g->lt, g->op, g->la, c.lb, c.ld, c.ld, g->pref, 1, &c.heur, &n);
    if (s == CUBLAS_STATUS_SUCCESS && (n < 1 || c.heur.state != CUBLAS_STATUS_SUCCESS))
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    return s;
}

} // namespace

void logits_blas_free(LogitsBlas *g)
{
    if (!g)
        return;
    if (g->pref)
        cublasLtMatmulPreferenceDestroy(g->pref);
    if (g->la)
        cublasLtMatrixLayoutDestroy(g->la);
    if (g->op)
        cublasLtMatmulDescDestroy(g->op);
    if (g->lt)
        cublasLtDestroy(g->lt);
    delete g;
}

cudaError_t logits_blas_create(LogitsBlas **out, int E, int H, int max_rows, char *why, size_t why_len)
{
    *out = nullptr;
    if (why_len)
        why[0] = 0;
    if (E < 1 || H < 1 || max_rows < 1) {
        snprintf(why, why_len, "cuBLASLt logits: E %d, H %d, rows %d (each must be at least 1)", E, H, max_rows);
        return cudaErrorInvalidValue;
    }
    LogitsBlas *g = new (std::nothrow) LogitsBlas;
    if (!g) {
        snprintf(why, why_len, "out of memory");
        return cudaErrorMemoryAllocation;
    }
    g->E = E, g->H = H;
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    /* no workspace and no reduction scheme: an algorithm that splits K would sum its slices through
       one, so only those that keep each output's sum in one block remain */
    const uint64_t ws = 0;
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    const char *step = "cublasLtCreate";
    cublasStatus_t s = cublasLtCreate(&g->lt);
    if (s == CUBLAS_STATUS_SUCCESS)
        step = "the operation", s = cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
    if (s == CUBLAS_STATUS_SUCCESS)
        step = "the gate's layout", s = cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, (uint64_t)H, (uint64_t)E, (int64_t)H);
    if (s == CUBLAS_STATUS_SUCCESS)
        step = "the preference", s = cublasLtMatmulPreferenceCreate(&g->pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
    const int probe[2] = {1, max_rows};
    for (int i = 0; i < 2 && s == CUBLAS_STATUS_SUCCESS; i++) {
        Call c;
        s = prepare(g, probe[i], c);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(why, why_len, "cuBLASLt logits: no algorithm for [%d, %d] x [%d, %d] bf16 -> fp32 without workspace: %s",
                     probe[i], H, H, E, cublasLtGetStatusString(s));
            logits_blas_free(g);
            return cudaErrorNotSupported;
        }
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "cuBLASLt logits: %s failed: %s", step, cublasLtGetStatusString(s));
        logits_blas_free(g);
        return cudaErrorNotSupported;
    }
    *out = g;
    return cudaSuccess;
}

cudaError_t logits_blas_enqueue(LogitsBlas *g, const uint16_t *x, const uint16_t *gate, float *logits, int rows,
                                cudaStream_t s)
{
    if (!g || rows < 1)
        return cudaErrorInvalidValue;
    Call c;
    if (prepare(g, rows, c) != CUBLAS_STATUS_SUCCESS)
        return cudaErrorNotSupported;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(g->lt, g->op, &alpha, gate, g->la, x, c.lb, &beta, logits, c.ld, logits,
                                             c.ld, &c.heur.algo, nullptr, 0, s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        const cudaError_t ce = cudaPeekAtLastError();
        return ce != cudaSuccess ? ce : cudaErrorNotSupported;
    }
    return cudaPeekAtLastError();
}

} // namespace dsv4cuda
