/*
 * The reference kernel table (portable C): every entry the others override. Weight rows are
 * decoded by the library's own dsv4_matrix_dequant_rows, so these kernels define the values
 * the vector ones must reproduce; the dot is one fixed-order four-sum per output.
 */
#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

/* C[q, j] = X[q, :] . W[r0 + j, :] for j < nr, q < n; tmp: k floats. */
void dsv4_cpu_ref_dot(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X, int64_t ldx,
                      float *C, int64_t ldc, float *tmp)
{
    int64_t k = m->k;
    for (int64_t j = 0; j < nr; j++) {
        dsv4_matrix_dequant_rows(m, r0 + j, 1, tmp);
        for (int64_t q = 0; q < n; q++)
            C[q * ldc + j] = dot4(X + q * ldx, tmp, k);
    }
}

void dsv4_cpu_kernels_fill_ref(dsv4_cpu_kernels_table *t)
{
    t->dequant = dsv4_matrix_dequant_rows;
    t->dot = dsv4_cpu_ref_dot;
    t->dot_fp4_packed = t->dot_fp8 = NULL;
    t->pack_fp4 = NULL;
    t->dot_fp4_bf16 = t->dot_fp4_bf16_k128 = t->dot_fp8_bf16 = NULL;
    t->swiglu_row = NULL;
}
