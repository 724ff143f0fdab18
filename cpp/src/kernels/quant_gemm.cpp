// quant_gemm (quant_gemm.h): the types, packing the file's blocks into panels, dequantizing
// embedding rows, the reference path (the epilogues written out plainly), and the dispatch: x
// quantized once per call, then the panels shared by the team (shared_panels.h).
#include "corellm/kernels/quant_gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/cpu_isa.h"
#include "quant_formats.h"
#include "quant_gemm_paths.h"

namespace corellm {

using quant::Layout;
using quant::layout_of;
using quant::QuantBlock;

namespace {

constexpr QuantType kAllTypes[] = {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ5_0,
                                   QuantType::kQ5_1, QuantType::kQ8_0, QuantType::kQ2_K,
                                   QuantType::kQ3_K, QuantType::kQ4_K, QuantType::kQ5_K,
                                   QuantType::kQ6_K, QuantType::kIQ4_NL, QuantType::kIQ4_XS,
                                   QuantType::kMXFP4};

inline float fp16(uint16_t h) { return _cvtsh_ss(h); }

// A block's scale d as a float: fp16 bits, or MXFP4's bf16 ones.
inline float scale_d(QuantType t, uint16_t d) { return t == QuantType::kMXFP4 ? bf16_to_f32(d) : fp16(d); }

int64_t num_panels(int64_t n) { return (n + kQuantPanelRows - 1) / kQuantPanelRows; }

void check_shape(QuantType type, int64_t n, int64_t k, const char* what) {
  CORELLM_CHECK_ARG(n >= 1 && k >= 1 && k % quant_block_elements(type) == 0, what, ": a ", quant_type_name(type),
                    " weight needs n >= 1 and k a multiple of ", quant_block_elements(type), " (got n=", n, " k=", k,
                    ")");
}

// Row c's block values, dequantized (w as quant_gemm.h defines it).
void dequantize_block(QuantType t, const QuantBlock& q, float* out) {
  const Layout L = layout_of(t);
  const float d = scale_d(t, q.d), m = fp16(q.m);
  for (int e = 0; e < L.block; ++e) {
    const int u = q.u[e];
    if (t == QuantType::kIQ4_NL || t == QuantType::kMXFP4) {
      out[e] = d * static_cast<float>(quant::nibble_levels(t)[u]);
    } else if (t == QuantType::kIQ4_XS) {
      out[e] = d * static_cast<float>(static_cast<int8_t>(q.sc[e / 32])) * static_cast<float>(quant::kIq4Levels[u]);
    } else if (t == QuantType::kQ2_K) {
      out[e] = d * static_cast<float>(q.sc[e / 16]) * static_cast<float>(u) - m * static_cast<float>(q.mn[e / 16]);
    } else if (t == QuantType::kQ4_K || t == QuantType::kQ5_K) {
      out[e] = d * static_cast<float>(q.sc[e / 32]) * static_cast<float>(u) - m * static_cast<float>(q.mn[e / 32]);
    } else if (t == QuantType::kQ6_K || t == QuantType::kQ3_K) {
      out[e] = d * static_cast<float>(static_cast<int8_t>(q.sc[e / 16])) * static_cast<float>(u - L.offset);
    } else if (L.has_min) {
      out[e] = d * static_cast<float>(u) + m;
    } else {
      out[e] = d * static_cast<float>(u - L.offset);
    }
  }
}

// The epilogues of quant_gemm.h for one row and one weight row's block b, onto acc.
float block_dot(QuantType t, const QuantBlock& w, const quant::QuantizedRows& x, int64_t r, int64_t b, float acc) {
  const Layout L = layout_of(t);
  const int8_t* xq = x.row_q(r) + b * L.block;
  const float *xd = x.row_d(r), *xs = x.row_s(r);
  const int32_t* sum16 = x.row_sum16(r);
  const float d = scale_d(t, w.d), m = fp16(w.m);
  auto dot = [&](int begin, int count) {
    int32_t s = 0;
    for (int e = begin; e < begin + count; ++e) s += static_cast<int32_t>(w.u[e]) * xq[e];
    return s;
  };
  auto level_dot = [&](int begin) {  // IQ4, MXFP4: the levels kv[q] (= u - 128) times x over 32 values
    int32_t s = 0;
    for (int e = begin; e < begin + 32; ++e) s += static_cast<int32_t>(quant::nibble_levels(t)[w.u[e]]) * xq[e];
    return s;
  };
  if (t == QuantType::kIQ4_NL || t == QuantType::kMXFP4) return std::fma(static_cast<float>(level_dot(0)), d * xd[b], acc);
  if (t == QuantType::kIQ4_XS) {
    for (int j = 0; j < 8; ++j) {
      const int64_t a = 8 * b + j;
      acc = std::fma(static_cast<float>(static_cast<int8_t>(w.sc[j]) * level_dot(32 * j)), d * xd[a], acc);
    }
    return acc;
  }
  if (L.block == 32) {
    const int64_t a = b;
    const int32_t S = dot(0, 32), Sx = sum16[2 * a] + sum16[2 * a + 1];
    if (L.has_min) {
      acc = std::fma(static_cast<float>(S), d * xd[a], acc);
      return std::fma(m, xs[a], acc);
    }
    return std::fma(static_cast<float>(S - L.offset * Sx), d * xd[a], acc);
  }
  for (int j = 0; j < 8; ++j) {  // the block's 32-value activation blocks
    const int64_t a = 8 * b + j;
    if (t == QuantType::kQ2_K) {
      const int32_t T = w.sc[2 * j] * dot(32 * j, 16) + w.sc[2 * j + 1] * dot(32 * j + 16, 16);
      const int32_t M = w.mn[2 * j] * sum16[2 * a] + w.mn[2 * j + 1] * sum16[2 * a + 1];
      acc = std::fma(static_cast<float>(T), d * xd[a], acc);
      acc = std::fma(-static_cast<float>(M), m * xd[a], acc);
    } else if (t == QuantType::kQ6_K || t == QuantType::kQ3_K) {
      const int32_t sa = static_cast<int8_t>(w.sc[2 * j]), sb = static_cast<int8_t>(w.sc[2 * j + 1]), o = L.offset;
      const int32_t T = sa * (dot(32 * j, 16) - o * sum16[2 * a]) + sb * (dot(32 * j + 16, 16) - o * sum16[2 * a + 1]);
      acc = std::fma(static_cast<float>(T), d * xd[a], acc);
    } else {
      acc = std::fma(static_cast<float>(dot(32 * j, 32)), d * static_cast<float>(w.sc[j]) * xd[a], acc);
      acc = std::fma(-(m * static_cast<float>(w.mn[j])), xs[a], acc);
    }
  }
  return acc;
}

// The calling thread's buffers for the quantized rows, grown as needed and kept.
quant::QuantizedRows quantized_rows_buffer(int64_t m, int64_t k) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d, s;
  thread_local std::vector<int32_t> sum16;
  const auto values = static_cast<size_t>(m * k), blocks = static_cast<size_t>(m * k / quant::kActBlock);
  if (q.size() < values) q.resize(values);
  if (d.size() < blocks) {
    d.resize(blocks);
    s.resize(blocks);
    sum16.resize(2 * blocks);
  }
  return {q.data(), d.data(), s.data(), sum16.data(), k};
}

}  // namespace

bool quant_type_supported(int32_t ggml_type) {
  return std::any_of(std::begin(kAllTypes), std::end(kAllTypes),
                     [&](QuantType t) { return static_cast<int32_t>(t) == ggml_type; });
}

QuantType quant_type_of(int32_t ggml_type) {
  CORELLM_CHECK_ARG(quant_type_supported(ggml_type), "ggml type ", ggml_type,
                    " has no quantized kernel (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
                    "IQ4_XS, MXFP4 do)");
  return static_cast<QuantType>(ggml_type);
}

const char* quant_type_name(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0: return "Q4_0";
    case QuantType::kQ4_1: return "Q4_1";
    case QuantType::kQ5_0: return "Q5_0";
    case QuantType::kQ5_1: return "Q5_1";
    case QuantType::kQ8_0: return "Q8_0";
    case QuantType::kQ2_K: return "Q2_K";
    case QuantType::kQ3_K: return "Q3_K";
    case QuantType::kIQ4_NL: return "IQ4_NL";
    case QuantType::kMXFP4: return "MXFP4";
    case QuantType::kIQ4_XS: return "IQ4_XS";
    case QuantType::kQ4_K: return "Q4_K";
    case QuantType::kQ5_K: return "Q5_K";
    case QuantType::kQ6_K: return "Q6_K";
  }
  return "unknown";
}

int64_t quant_block_elements(QuantType type) { return layout_of(type).block; }

int64_t quant_block_bytes(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0: return 18;
    case QuantType::kQ4_1: return 20;
    case QuantType::kQ5_0: return 22;
    case QuantType::kQ5_1: return 24;
    case QuantType::kQ8_0: return 34;
    case QuantType::kQ2_K: return 84;
    case QuantType::kQ3_K: return 110;
    case QuantType::kIQ4_NL: return 18;
    case QuantType::kMXFP4: return 17;
    case QuantType::kIQ4_XS: return 136;
    case QuantType::kQ4_K: return 144;
    case QuantType::kQ5_K: return 176;
    case QuantType::kQ6_K: return 210;
  }
  return 0;
}

QuantPath quant_path() {
  static const QuantPath path = [] {
    const CpuIsa isa = cpu_isa();  // honours CORELLM_ISA: avx2 forces the avx2 path here too
    if (isa == CpuIsa::kAmx && cpu_has_amx_int8()) return QuantPath::kAmx;
    return isa_at_least(isa, CpuIsa::kAvx512) && cpu_has_avx512_vnni() ? QuantPath::kAvx512Vnni : QuantPath::kAvx2;
  }();
  return path;
}

const char* quant_path_name(QuantPath path) {
  switch (path) {
    case QuantPath::kReference: return "reference";
    case QuantPath::kAvx2: return "avx2";
    case QuantPath::kAvx512Vnni: return "avx512vnni";
    case QuantPath::kAmx: return "amx";
  }
  return "unknown";
}

QuantPath quant_path_named(const std::string& name) {
  for (QuantPath p : {QuantPath::kReference, QuantPath::kAvx2, QuantPath::kAvx512Vnni, QuantPath::kAmx}) {
    if (name != quant_path_name(p)) continue;
    CORELLM_CHECK_ARG(p != QuantPath::kAvx512Vnni || cpu_has_avx512_vnni(),
                      "quant_gemm: this CPU cannot run the avx512vnni path");
    CORELLM_CHECK_ARG(p != QuantPath::kAmx || cpu_has_amx_int8(), "quant_gemm: this CPU cannot run the amx path");
    CORELLM_CHECK_ARG(p == QuantPath::kReference || !supported_cpu_isas().empty(),
                      "quant_gemm: this CPU cannot run the ", name, " path");
    return p;
  }
  CORELLM_CHECK_ARG(false, "unknown quant_gemm path '", name, "' (reference, avx2, avx512vnni, amx)");
  return QuantPath::kReference;
}

int64_t quant_gemm_packed_size(QuantType type, int64_t n, int64_t k) {
  check_shape(type, n, k, "quant_gemm_packed_size");
  return num_panels(n) * (k / quant_block_elements(type)) * layout_of(type).bytes;
}

void quant_gemm_pack(QuantType type, const uint8_t* rows, uint8_t* packed, int64_t n, int64_t k,
                     const int32_t* row_order) {
  check_shape(type, n, k, "quant_gemm_pack");
  const Layout L = layout_of(type);
  const int64_t nb = k / L.block, row_bytes = nb * quant_block_bytes(type), panels = num_panels(n);
  if (row_order != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      CORELLM_CHECK_ARG(row_order[i] >= 0 && row_order[i] < n, "quant_gemm_pack: row_order[", i, "] = ",
                        row_order[i], " is outside [0, ", n, ")");
    }
  }
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t p = 0; p < panels; ++p) {
    uint8_t* panel = packed + p * nb * L.bytes;
    std::memset(panel, 0, static_cast<size_t>(nb * L.bytes));
    QuantBlock block;
    for (int c = 0; c < kQuantPanelRows && p * kQuantPanelRows + c < n; ++c) {
      const int64_t i = p * kQuantPanelRows + c, source = row_order ? row_order[i] : i;
      for (int64_t b = 0; b < nb; ++b) {
        quant::decode_file_block(type, rows + source * row_bytes + b * quant_block_bytes(type), &block);
        quant::encode_panel_block(type, block, c, panel + b * L.bytes);
      }
    }
  }
}

void quant_dequantize_rows(QuantType type, const uint8_t* packed, int64_t n, int64_t k, const int32_t* ids,
                           int64_t count, void* out, DType out_dtype) {
  check_shape(type, n, k, "quant_dequantize_rows");
  const Layout L = layout_of(type);
  const int64_t nb = k / L.block;
  for (int64_t r = 0; r < count; ++r) {
    const int32_t id = ids[r];
    CORELLM_CHECK_ARG(id >= 0 && id < n, "token id ", id, " is outside the vocabulary [0, ", n, ")");
    const uint8_t* panel = packed + (id / kQuantPanelRows) * nb * L.bytes;
    QuantBlock block;
    float values[256];
    for (int64_t b = 0; b < nb; ++b) {
      quant::decode_panel_block(type, panel + b * L.bytes, id % kQuantPanelRows, &block);
      dequantize_block(type, block, values);
      for (int e = 0; e < L.block; ++e) {
        const int64_t at = r * k + b * L.block + e;
        if (out_dtype == DType::F32) {
          static_cast<float*>(out)[at] = values[e];
        } else {
          static_cast<uint16_t*>(out)[at] = f32_to_bf16(values[e]);
        }
      }
    }
  }
}

namespace quant {

void quant_gemm_reference(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  const Layout L = layout_of(a.type);
  const int64_t nb = a.k / L.block;
  QuantBlock block;
  for (int64_t p = claims.take(); p >= 0; p = claims.take()) {
    const uint8_t* panel = a.packed + p * nb * L.bytes;
    for (int c = 0; c < kQuantPanelRows && p * kQuantPanelRows + c < a.n; ++c) {
      const int64_t col = p * kQuantPanelRows + c;
      for (int64_t r = claims.r0; r < claims.r1; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          decode_panel_block(a.type, panel + b * L.bytes, c, &block);
          acc = block_dot(a.type, block, x, r, b, acc);
        }
        if (a.bias != nullptr) acc += bf16_to_f32(a.bias[col]);
        if (a.y_dtype == DType::F32) {
          static_cast<float*>(a.y)[r * a.y_stride + col] = acc;
        } else {
          static_cast<uint16_t*>(a.y)[r * a.y_stride + col] = f32_to_bf16(acc);
        }
      }
    }
  }
}

}  // namespace quant

void quant_gemm(const QuantGemmArgs& a, QuantPath path) {
  check_shape(a.type, a.n, a.k, "quant_gemm");
  CORELLM_CHECK_ARG(a.m >= 0, "quant_gemm: m=", a.m);
  if (a.m == 0) return;
  CORELLM_CHECK_ARG(a.x && a.packed && a.y, "quant_gemm: null x, weight or y");
  const quant::QuantizedRows x = quantized_rows_buffer(a.m, a.k);
  void (*run)(const QuantGemmArgs&, const quant::QuantizedRows&, const quant::PanelClaims&) =
      path == QuantPath::kAmx          ? quant::quant_gemm_amx
      : path == QuantPath::kAvx512Vnni ? quant::quant_gemm_avx512vnni
      : path == QuantPath::kAvx2     ? quant::quant_gemm_avx2
                                     : quant::quant_gemm_reference;
  constexpr int64_t kRowChunk = 128;  // rows per pass over the panels: their int8 values stay in L2
  // The whole team where the product is worth waking it (inside a step split's group, the group's
  // one thread), and the panels of each chunk of rows shared by it as the bf16 GEMM shares its own
  // (a thread done with its range takes the other's from the back, rather than waiting for it at
  // the end). SmolLM2's 30 layers of projections in Q4_1 from memory, 64 rows, AMD EPYC Zen 4, 2
  // threads, 12 alternating rounds against the static ranges: 29.18 -> 28.76 ms (faster in 11),
  // with a busy loop taking 15 % of a core beside it 42.8 -> 41.9 ms (9); 1 and 16 rows level.
  const int team = gemm_team(a.m, a.n, a.k);
  std::vector<SharedRanges> chunk_panels = gemm_shared_panels(a.m, kRowChunk, num_panels(a.n), team);
#pragma omp parallel num_threads(team)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.m; ++r) quant::quantize_rows(a.x, a.x_stride, a.x_dtype, r, r + 1, x);
    // The kernels read the arguments per panel: from this thread's copies, not from the calling
    // thread's stack (packed_gemm_vector.h's gemm says why).
    const QuantGemmArgs own = a;
    const quant::QuantizedRows own_x = x;
    const int t = omp_get_thread_num();
    for (size_t c = 0; c < chunk_panels.size(); ++c) {
      const int64_t r0 = static_cast<int64_t>(c) * kRowChunk;
      run(own, own_x, {r0, std::min(own.m, r0 + kRowChunk), &chunk_panels, c, t});
    }
  }
}

}  // namespace corellm
