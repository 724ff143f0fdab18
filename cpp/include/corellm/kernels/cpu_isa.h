// The instruction-set path the CPU kernels take: detected once per process from CPUID and the
// OS's saved-state support (and, for AMX, the kernel's permission to use tile data), or forced
// with CORELLM_ISA. One path for the whole process: a row's result then never depends on the
// batch around it (each path computes every row alike; two paths may round differently).
#pragma once

#include <string>
#include <vector>

namespace corellm {

// Best last; each path's CPU has every instruction of the paths before it.
//   kAvx2: AVX2 + FMA (x86-64-v3: Haswell, Zen 1 and later), the baseline every kernel is
//     compiled for; bf16 widened to fp32 for the dot products.
//   kAvx512: AVX-512 F/BW/VL/DQ (Skylake-SP, Ice Lake), same arithmetic on 16 lanes.
//   kAvx512Bf16: AVX-512 with the bf16 dot product (AMD Zen 4+, Intel Cooper Lake+), also used
//     by attention on bf16 caches.
//   kAmx: AVX-512-BF16 plus AMX-BF16 tiles (Intel Sapphire Rapids+) for the GEMM.
enum class CpuIsa : int { kAvx2 = 0, kAvx512 = 1, kAvx512Bf16 = 2, kAmx = 3 };

// True when path `isa` includes the instructions of path `level` (they are ordered).
inline bool isa_at_least(CpuIsa isa, CpuIsa level) { return static_cast<int>(isa) >= static_cast<int>(level); }

// The paths this CPU (and OS) can run, best last; empty when it lacks AVX2 + FMA, the baseline
// (then the kernels cannot run at all: the library is compiled for it).
const std::vector<CpuIsa>& supported_cpu_isas();

// The process's path: CORELLM_ISA if set (InvalidArgument naming the value and the supported
// ones when this CPU cannot run it), else the best supported. InvalidArgument when none is.
CpuIsa cpu_isa();

const char* cpu_isa_name(CpuIsa isa);

// AVX-512-VNNI (vpdpbusd, the int8 dot product of quant_gemm.h): on top of the avx512 path, in
// every CPU of the avx512bf16 and amx paths, and in Cascade Lake / Ice Lake before them.
bool cpu_has_avx512_vnni();

// AMX-INT8 (TDPBSUD, quant_gemm.h's amx path), with the tile-data permission the amx path holds.
bool cpu_has_amx_int8();

// An AMD CPU (CPUID vendor "AuthenticAMD"): where a weight panel read once is fetched with the
// non-temporal hint (next_panel.h), measured faster there; other vendors keep the L2 hint until
// measured on them.
bool cpu_is_amd();

// InvalidArgument "<what>: this CPU cannot run the <isa> path" unless it can (a test or benchmark
// asking a kernel for a path by name).
void check_cpu_runs(CpuIsa isa, const char* what);

// The path of that name ("avx2", "avx512", "avx512bf16", "amx"); InvalidArgument naming the known ones otherwise.
CpuIsa cpu_isa_named(const std::string& name);

// The CPU's model name (CPUID brand string), for logs and benchmark tables.
std::string cpu_model_name();

}  // namespace corellm
