// Block-wide primitives over one row of a float vector (a thread block of kThreads threads per
// row), for the CUDA sampler: reductions whose result every thread gets, radix selection of the
// key where a descending running weight reaches a target, and the index where a running sum in
// row order crosses a value.
//
// Radix selection: the k-th largest (or the weight where the descending mass crosses a target)
// is found digit by digit, 8 bits at a time from the top, on an order-preserving integer key of
// the float: a histogram of the matching elements per digit (warp-aggregated shared-memory
// atomics), walked from the top bucket. Crossing: per-thread segment sums, a block scan, then one
// warp scans the one segment holding the target.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "common.cuh"

namespace corellm::cuda::row {

constexpr int kThreads = 1024;
using u64 = unsigned long long;

struct ArgMax {
  float value;
  int id;
};

struct BetterArgMax {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    return (a.value > b.value || (a.value == b.value && a.id < b.id)) ? a : b;
  }
};

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// A row's shared-memory scratch for these primitives.
struct RowScratch {
  union {
    cub::BlockReduce<float, kThreads>::TempStorage reduce_f32;
    cub::BlockReduce<int, kThreads>::TempStorage reduce_i32;
    cub::BlockReduce<u64, kThreads>::TempStorage reduce_u64;
    cub::BlockReduce<ArgMax, kThreads>::TempStorage reduce_arg;
    cub::BlockScan<u64, kThreads>::TempStorage scan_u64;
  } tmp;
  u64 hist[256];
  // Broadcast slots (thread 0 writes, all read after a barrier).
  float f32;
  int i32;
  u64 u64a, u64b;
  ArgMax arg;
};

// Larger float -> larger key; -inf lowest (NaN never reaches a key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// ---- block-wide reductions (every thread gets the result) ----------------------------------------

// Thread 0's value, to every thread (slot: a RowScratch field of the value's type).
template <class V>
__device__ inline V from_thread0(V value, V& slot) {
  if (threadIdx.x == 0) slot = value;
  __syncthreads();
  const V out = slot;
  __syncthreads();
  return out;
}

__device__ inline float block_max(float v, RowScratch& s) {
  return from_thread0(cub::BlockReduce<float, kThreads>(s.tmp.reduce_f32).Reduce(v, MaxOp()), s.f32);
}

__device__ inline float block_sum_f32(float v, RowScratch& s) {
  return from_thread0(cub::BlockReduce<float, kThreads>(s.tmp.reduce_f32).Sum(v), s.f32);
}

__device__ inline int block_sum_i32(int v, RowScratch& s) {
  return from_thread0(cub::BlockReduce<int, kThreads>(s.tmp.reduce_i32).Sum(v), s.i32);
}

__device__ inline u64 block_sum_u64(u64 v, RowScratch& s) {
  return from_thread0(cub::BlockReduce<u64, kThreads>(s.tmp.reduce_u64).Sum(v), s.u64a);
}

__device__ inline ArgMax block_argmax(ArgMax v, RowScratch& s) {
  return from_thread0(cub::BlockReduce<ArgMax, kThreads>(s.tmp.reduce_arg).Reduce(v, BetterArgMax()), s.arg);
}

__device__ inline ArgMax row_argmax(const float* x, int v, RowScratch& s) {
  ArgMax best{-INFINITY, INT_MAX};
  for (int t = threadIdx.x; t < v; t += kThreads) {
    const float y = x[t];
    if (y > best.value || (y == best.value && t < best.id)) best = {y, t};
  }
  return block_argmax(best, s);
}

// ---- radix selection -------------------------------------------------------------------------------

// hist[bucket] += w over the lanes of a warp that hold the same bucket, one atomic per bucket.
// w < 2^41: summed as two 20-bit-ish halves that cannot overflow 32 bits over 32 lanes.
__device__ __forceinline__ void warp_aggregated_add(u64* hist, bool active, int bucket, u64 w) {
  const unsigned active_mask = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(active_mask, bucket);
  const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(w & 0xFFFFFu));
  const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(w >> 20));
  if (static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) {
    atomicAdd(hist + bucket, (static_cast<u64>(hi) << 20) + lo);
  }
}

// Walking keys from the largest down, each element weighing weight_of(t) (0: not a candidate), the
// key where the running weight first reaches target (> 0). *above: the weight of the larger keys.
// Where rounding leaves the target unreached, the smallest candidate key.
template <class KeyOf, class WeightOf>
__device__ inline uint32_t select_from_top(int v, KeyOf key_of, WeightOf weight_of, u64 target, u64* above_out,
                                          RowScratch& s) {
  uint32_t prefix = 0, mask = 0;
  u64 above = 0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    for (int base = warp * 32; base < v; base += kThreads) {  // warp-uniform bounds: every lane votes
      const int t = base + lane;
      u64 w = 0;
      uint32_t key = 0;
      if (t < v) {
        w = weight_of(t);
        key = key_of(t);
      }
      const bool active = w > 0 && (key & mask) == prefix;
      warp_aggregated_add(s.hist, active, static_cast<int>((key >> shift) & 0xFFu), w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1, lowest = -1;
      for (int b = 255; b >= 0; --b) {
        const u64 h = s.hist[b];
        if (h == 0) continue;
        lowest = b;
        if (above + h >= target) {
          chosen = b;
          break;
        }
        above += h;
      }
      if (chosen < 0 && lowest >= 0) {  // rounding: the smallest bucket, whole
        chosen = lowest;
        above -= s.hist[lowest];
      }
      s.i32 = chosen < 0 ? 0 : chosen;
      s.u64a = above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.i32) << shift;
    mask |= 0xFFu << shift;
    above = s.u64a;
    __syncthreads();
  }
  *above_out = above;
  return prefix;
}

// The first index t (vocabulary order) where the running sum of f reaches past r, i.e. the
// inclusive prefix sum exceeds r; where the total is <= r, the last t with f(t) > 0; -1 if f is 0
// everywhere. *total: the sum of f. Segment j (one per thread) is [j*S, (j+1)*S).
template <class F>
__device__ inline int find_crossing(int v, F f, u64 r, u64* total_out, RowScratch& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int seg_len = (v + kThreads - 1) / kThreads;
  u64 mine = 0;
  for (int q = 0; q < 32; ++q) {  // the warp sums its 32 segments together, coalesced
    const int lo = (warp * 32 + q) * seg_len, hi = min(v, lo + seg_len);
    u64 part = 0;
    for (int t = lo + lane; t < hi; t += 32) part += f(t);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) part += __shfl_xor_sync(0xffffffffu, part, offset);
    if (lane == q) mine = part;
  }
  u64 before, total;
  cub::BlockScan<u64, kThreads>(s.tmp.scan_u64).ExclusiveSum(mine, before, total);
  __syncthreads();
  if (threadIdx.x == 0) s.i32 = -1;
  __syncthreads();
  const bool past = total <= r;
  // The segment holding the crossing, or (past the end) the last segment with weight.
  if (mine > 0 && (past ? before + mine == total : (before <= r && r < before + mine))) {
    s.i32 = threadIdx.x;
    s.u64b = before;
  }
  __syncthreads();
  const int seg = s.i32;
  const u64 seg_before = s.u64b;
  __syncthreads();
  if (seg < 0) {
    *total_out = total;
    return -1;
  }
  if (warp == 0) {
    const int lo = seg * seg_len, hi = min(v, lo + seg_len);
    u64 running = seg_before;
    int found = -1;
    for (int base = lo; base < hi; base += 32) {  // found and past are warp-uniform
      const int t = base + lane;
      const u64 val = t < hi ? f(t) : 0;
      if (past) {  // the last t with weight: scan the whole segment
        const unsigned nz = __ballot_sync(0xffffffffu, val > 0);
        if (nz) found = base + 31 - __clz(nz);
        continue;
      }
      u64 incl = val;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, incl, offset);
        if (lane >= offset) incl += y;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, running + incl > r);
      if (hit) {
        found = base + __ffs(hit) - 1;
        break;
      }
      running += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) s.i32 = found;
  }
  __syncthreads();
  const int out = s.i32;
  __syncthreads();
  *total_out = total;
  return out;
}

}  // namespace corellm::cuda::row
