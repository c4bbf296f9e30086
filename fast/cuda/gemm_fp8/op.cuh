/*
 * The fp8 mode's grouped GEMM, shared by its two configurations (fast/cuda/gemm_fp8.h): the CUTLASS
 * 4.2 types, the per-group argument kernel and the operator's create / enqueue / free as templates
 * over the weight scales' rows SFN (1 or 128). Included by gemm_fp8/rows.cu (SFN 1) and
 * gemm_fp8/blocks.cu (SFN 128) only: each instantiates one configuration, so the two CUTLASS kernels
 * compile side by side (each took half of the one file's minute). Why the configuration is what it
 * is: fast/cuda/gemm_fp8.cu.
 */
#ifndef DSV4MOE_CUDA_GEMM_FP8_OP_CUH
#define DSV4MOE_CUDA_GEMM_FP8_OP_CUH

#include "fast/cuda/gemm_fp8.h"

#include <new>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

namespace dsv4cuda {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using ElementC = cutlass::bfloat16_t; /* never read: beta = 0 */
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor; /* B^T row-major: the weight [N, K] with K contiguous */
using LayoutD = cutlass::layout::RowMajor;
constexpr int AlignA = 16, AlignB = 16, AlignD = 8;
using Acc = float;
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _2, _1>;
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, ElementC, LayoutD *, AlignD, ElementD, LayoutD *, AlignD,
    EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<ElementD, Acc>>::CollectiveOp;

/* The operator for weight scales of SFN rows (1 or 128) x 128 of K. Pingpong with 64x128 tiles
   measured slower in the same call (11.48 ms; with block scales 9.75). A macro, not a class
   template: g++ (nvcc's host pass) rejects CUTLASS's collective builders in a dependent context. */
#define DSV4C_FP8_CFG(NAME, SFN)                                                                                 \
    struct NAME {                                                                                               \
        using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, SFN, 128>;                             \
        using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());                                           \
        using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());                                           \
        using Mainloop = cutlass::gemm::collective::CollectiveBuilder<                                          \
            cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA *, LayoutSFA *>, \
            AlignA, ElementB, cute::tuple<LayoutB *, LayoutSFB *>, AlignB, Acc, TileShape, ClusterShape,         \
            cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(                                 \
                sizeof(Epilogue::SharedStorage))>,                                                              \
            KernelSchedule>::CollectiveOp;                                                                      \
        using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;                  \
        using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;                                       \
        using StrideA = Kernel::InternalStrideA;                                                                \
        using StrideB = Kernel::InternalStrideB;                                                                \
        using StrideD = Kernel::InternalStrideD;                                                                \
        using Shape3 = ProblemShape::UnderlyingProblemShape;                                                    \
    }
/* Each configuration's translation unit (rows.cu, blocks.cu) instantiates DSV4C_FP8_CFG for its SFN
   and specializes CfgOf<SFN> with it. */
template <int SFN> struct CfgOf;

/* The per-group argument arrays CUTLASS reads (device memory, one allocation). */
template <int SFN> struct Arrays {
    using C = CfgOf<SFN>;
    typename C::Shape3 *shape;
    const ElementA **a;
    const ElementB **b;
    const ElementC **c;
    ElementD **d;
    const Acc **sfa, **sfb;
    typename C::StrideA *da;
    typename C::StrideB *db;
    typename C::StrideD *dd;
    typename C::LayoutSFA *lsfa;
    typename C::LayoutSFB *lsfb;
};

template <int SFN> struct Op {
    int groups = 0;
    uint8_t *mem = nullptr; /* the arrays, then CUTLASS's workspace */
    Arrays<SFN> arr{};
    typename CfgOf<SFN>::Gemm op;
};

/* One thread per group: its rows (0 when another kernel computes it), pointers, strides, layouts. */
template <int SFN> __global__ void k_fp8_args(Fp8Proj p, Arrays<SFN> r, int groups)
{
    using C = CfgOf<SFN>;
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups)
        return;
    const bool sh = g == p.E;
    int m = 0;
    long long row0 = 0;
    if (!sh) {
        m = p.cnt[g];
        row0 = p.pad_off[g];
    } else if (p.has_shared) {
        m = *p.ntok;
    }
    if (m <= p.min_rows || !p.ok[g])
        m = 0;
    const int n = sh ? p.Nsh : p.N, k = sh ? p.Ksh : p.K;
    r.shape[g] = typename C::Shape3(m, n, k);
    const uint8_t *a = sh ? p.Ash : p.A + row0 * k;
    const float *sfa = sh ? p.SFAsh : p.SFA + row0 * (k / 128);
    const uint8_t *b = sh ? p.Bsh : p.B + (long long)g * p.b_stride;
    const float *sfb = sh ? p.SFBsh : p.SFB + (long long)g * p.sfb_stride;
    uint16_t *d = sh ? p.Dsh : p.D + row0 * n;
    r.a[g] = reinterpret_cast<const ElementA *>(a);
    r.b[g] = reinterpret_cast<const ElementB *>(b);
    r.d[g] = reinterpret_cast<ElementD *>(d);
    r.c[g] = reinterpret_cast<const ElementC *>(d);
    r.sfa[g] = sfa;
    r.sfb[g] = sfb;
    r.da[g] = cutlass::make_cute_packed_stride(typename C::StrideA{}, cute::make_shape(m, k, 1));
    r.db[g] = cutlass::make_cute_packed_stride(typename C::StrideB{}, cute::make_shape(n, k, 1));
    r.dd[g] = cutlass::make_cute_packed_stride(typename C::StrideD{}, cute::make_shape(m, n, 1));
    r.lsfa[g] = C::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    r.lsfb[g] = C::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
}

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

template <int SFN> void op_free(Op<SFN> *g)
{
    if (!g)
        return;
    cudaFree(g->mem);
    delete g;
}

template <int SFN> cudaError_t op_create(Op<SFN> **out, int groups, size_t *bytes)
{
    using C = CfgOf<SFN>;
    *out = nullptr;
    Op<SFN> *g = new (std::nothrow) Op<SFN>;
    if (!g)
        return cudaErrorMemoryAllocation;
    g->groups = groups;
    const size_t n = (size_t)groups;
    size_t off = 0;
    size_t o_shape = off;
    off += align256(n * sizeof(typename C::Shape3));
    size_t o_ptr = off; /* a, b, c, d, sfa, sfb: six pointer arrays */
    off += 6 * align256(n * sizeof(void *));
    size_t o_da = off;
    off += align256(n * sizeof(typename C::StrideA));
    size_t o_db = off;
    off += align256(n * sizeof(typename C::StrideB));
    size_t o_dd = off;
    off += align256(n * sizeof(typename C::StrideD));
    size_t o_lsfa = off;
    off += align256(n * sizeof(typename C::LayoutSFA));
    size_t o_lsfb = off;
    off += align256(n * sizeof(typename C::LayoutSFB));
    const size_t arrays = off;

    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        delete g;
        return ce;
    }
    cutlass::KernelHardwareInfo hw = cutlass::KernelHardwareInfo::make_kernel_hardware_info<typename C::Kernel>(dev);
    /* the arrays' addresses are fixed, so the arguments (and CUTLASS's params) are built once */
    typename C::Gemm::Arguments args;
    auto build = [&](uint8_t *base) {
        Arrays<SFN> &r = g->arr;
        r.shape = (typename C::Shape3 *)(base + o_shape);
        void **p = (void **)(base + o_ptr);
        const size_t step = align256(n * sizeof(void *)) / sizeof(void *);
        r.a = (const ElementA **)(p + 0 * step);
        r.b = (const ElementB **)(p + 1 * step);
        r.c = (const ElementC **)(p + 2 * step);
        r.d = (ElementD **)(p + 3 * step);
        r.sfa = (const Acc **)(p + 4 * step);
        r.sfb = (const Acc **)(p + 5 * step);
        r.da = (typename C::StrideA *)(base + o_da);
        r.db = (typename C::StrideB *)(base + o_db);
        r.dd = (typename C::StrideD *)(base + o_dd);
        r.lsfa = (typename C::LayoutSFA *)(base + o_lsfa);
        r.lsfb = (typename C::LayoutSFB *)(base + o_lsfb);
        args = typename C::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                           {groups, r.shape, nullptr},
                                           {r.a, r.da, r.b, r.db, r.sfa, r.lsfa, r.sfb, r.lsfb},
                                           {{}, r.c, r.dd, r.d, r.dd},
                                           hw};
        auto &f = args.epilogue.thread;
        f.alpha = 1.0f;
        f.beta = 0.0f;
        f.alpha_ptr = nullptr;
        f.beta_ptr = nullptr;
        f.alpha_ptr_array = nullptr;
        f.beta_ptr_array = nullptr;
        f.dAlpha = {cute::_0{}, cute::_0{}, 0};
        f.dBeta = {cute::_0{}, cute::_0{}, 0};
        /* along M: the CTAs working at one time share an expert's weight tiles (each N tile of a
           group is visited for all its M tiles in a row), so the weights, which dominate the
           traffic of an MoE GEMM (384 rows per expert at T = 16384 against 16 MiB of gate|up),
           come from DRAM about once; the group's activation rows are small and stay in L2 */
        args.scheduler.raster_order = cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
        args.scheduler.max_swizzle_size = 1;
    };
    build(nullptr); /* sizes only: the workspace size does not depend on the addresses */
    const size_t ws = C::Gemm::get_workspace_size(args);
    const size_t total = arrays + align256(ws);
    if ((ce = cudaMalloc((void **)&g->mem, total)) != cudaSuccess) {
        delete g;
        return ce;
    }
    if ((ce = cudaMemset(g->mem, 0, total)) != cudaSuccess) {
        op_free<SFN>(g);
        return ce;
    }
    build(g->mem);
    if (g->op.initialize(args, g->mem + arrays) != cutlass::Status::kSuccess) {
        op_free<SFN>(g);
        return cudaErrorInvalidConfiguration;
    }
    if (bytes)
        *bytes = total;
    *out = g;
    return cudaSuccess;
}

template <int SFN> cudaError_t op_enqueue(Op<SFN> *g, const Fp8Proj &p, cudaStream_t s)
{
    k_fp8_args<SFN><<<(unsigned)((g->groups + 127) / 128), 128, 0, s>>>(p, g->arr, g->groups);
    cudaError_t ce = cudaPeekAtLastError();
    if (ce != cudaSuccess)
        return ce;
    if (g->op.run(s) != cutlass::Status::kSuccess)
        return cudaErrorLaunchFailure;
    return cudaPeekAtLastError();
}

} // namespace

/* The three entry points of one configuration (gemm_fp8/entries.h), around Op<SFN>. */
#define DSV4C_FP8_ENTRIES(SUFFIX, SFN)                                                                          \
    cudaError_t fp8op_create_##SUFFIX(void **out, int groups, size_t *bytes)                                  \
    {                                                                                                         \
        Op<SFN> *g = nullptr;                                                                                 \
        cudaError_t ce = op_create<SFN>(&g, groups, bytes);                                                   \
        *out = g;                                                                                             \
        return ce;                                                                                            \
    }                                                                                                         \
    cudaError_t fp8op_enqueue_##SUFFIX(void *op, const Fp8Proj &p, cudaStream_t s)                            \
    {                                                                                                         \
        return op_enqueue<SFN>(static_cast<Op<SFN> *>(op), p, s);                                             \
    }                                                                                                         \
    void fp8op_free_##SUFFIX(void *op) { op_free<SFN>(static_cast<Op<SFN> *>(op)); }

} // namespace dsv4cuda

#endif
