// The scaled low-precision GEMM on Hopper (sm_90a), built on CUTLASS 3.x: WGMMA tensor-core
// instructions fed by TMA loads, warp-specialized (producer warps load, consumer warpgroups
// multiply), with the scales applied in an epilogue visitor tree:
//
//     out[i, j] = bf16( a_scale[i] * (b_scale[j] * sum_k a[i, k] b[j, k]) )
//
// a [m, k] row-major (the activations, quantized per token), b [n, k] row-major (the weight:
// each output channel's k values contiguous, "TN"), in fp8 e4m3 or int8; the sum in fp32 (fp8)
// or int32 (int8). A scale vector is per row / per column or a single value (a per-tensor scale):
// the broadcast's stride is chosen at run time, so one kernel serves both.
//
// Two tile configurations per type, chosen by m: 64 x 128 for the few rows of decode steps,
// 128 x 128 with clusters of two along m for prefill (the weight tile multicast to both CTAs).
// The templates here are instantiated once per type (scaled_gemm_sm90_fp8.cu, _int8.cu: two
// translation units that compile in parallel), for sm_90a only (their own object library,
// cuda/CMakeLists.txt); scaled_gemm.cu checks the device and the problem before calling them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "scaled_gemm_sm90.h"

namespace corellm::cuda::sm90 {
namespace detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// The epilogue: acc -> * b_scale (per column) -> * a_scale (per row) -> bf16.
template <class TileShape>
struct ScaleEpilogue {
  using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<bool, _0, _0>>;
  using ScaleB = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, bool, _0>>;
  using ScaledByB = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float,
                                                        cutlass::FloatRoundStyle::round_to_nearest>,
                                    ScaleB, fusion::Sm90AccFetch>;
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, cutlass::bfloat16_t, float,
                                                   cutlass::FloatRoundStyle::round_to_nearest>,
                               ScaleA, ScaledByB>;

  static typename Tree::Arguments arguments(const ScaledGemmProblem& p) {
    return {{static_cast<const float*>(p.a_scales), 0.0f, {p.a_scales_per_row, _0{}, _0{}}},
            {{static_cast<const float*>(p.b_scales), 0.0f, {_0{}, p.b_scales_per_column, _0{}}}, {}, {}},
            {}};
  }
};

template <class Element, class Accumulator, class TileShape, class ClusterShape, class KernelSchedule,
          class EpilogueSchedule>
struct ScaledGemmKernel {
  using Epilogue = ScaleEpilogue<TileShape>;
  using Out = cutlass::bfloat16_t;
  static constexpr int kAlignAB = 16;  // elements of 8 bits: one 16-byte TMA granule
  static constexpr int kAlignOut = 8;  // bf16

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, kAlignOut, Out,
      cutlass::layout::RowMajor, kAlignOut, EpilogueSchedule, typename Epilogue::Tree>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignAB, Element,
      cutlass::layout::ColumnMajor, kAlignAB, Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static void run(const ScaledGemmProblem& p, cudaStream_t stream) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    StrideA stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1));
    StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(n, k, 1));
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(m, n, 1));
    get<0>(stride_d) = p.out_stride;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(p.a), stride_a, static_cast<const Element*>(p.b), stride_b},
        {Epilogue::arguments(p), nullptr, stride_d, static_cast<Out*>(p.out), stride_d}};
    Gemm gemm;
    check(gemm.can_implement(args), "can_implement");
    const size_t workspace_bytes = Gemm::get_workspace_size(args);
    void* workspace = nullptr;
    if (workspace_bytes > 0 && cudaMallocAsync(&workspace, workspace_bytes, stream) != cudaSuccess) {
      throw std::runtime_error("scaled_gemm: could not allocate the CUTLASS workspace");
    }
    const cutlass::Status status = gemm.run(args, workspace, stream);
    if (workspace != nullptr) cudaFreeAsync(workspace, stream);
    check(status, "run");
  }

  static void check(cutlass::Status status, const char* what) {
    if (status != cutlass::Status::kSuccess) {
      throw std::runtime_error(std::string("scaled_gemm: CUTLASS ") + what + " failed: " +
                               cutlassGetStatusString(status));
    }
  }
};

// m <= kSmallM: the decode configuration.
constexpr int64_t kSmallM = 64;

template <class Element, class Accumulator, class KernelSchedule>
void run_for_m(const ScaledGemmProblem& p, cudaStream_t stream) {
  if (p.m <= kSmallM) {
    ScaledGemmKernel<Element, Accumulator, Shape<_64, _128, _128>, Shape<_1, _1, _1>, KernelSchedule,
                     cutlass::epilogue::TmaWarpSpecialized>::run(p, stream);
  } else {
    ScaledGemmKernel<Element, Accumulator, Shape<_128, _128, _128>, Shape<_2, _1, _1>, KernelSchedule,
                     cutlass::epilogue::TmaWarpSpecialized>::run(p, stream);
  }
}

}  // namespace detail
}  // namespace corellm::cuda::sm90
