// The instruction-set path the CPU kernels take: detected once per process from CPUID and the
// OS's saved-state support (and, for AMX, the kernel's permission to use tile data), or forced
// with CORELLM_ISA. One path for the whole process: a row's result then never depends on the
// batch around it (each path computes every row alike; two paths may round differently).
#pragma once

#include <string>
#include <vector>

namespace corellm {

// Best last. kAvx512Bf16: AVX-512 with the bf16 dot product (AMD Zen 4+, Intel Cooper Lake+);
// kAmx: AVX-512-BF16 plus AMX-BF16 tiles (Intel Sapphire Rapids+) for the GEMM.
enum class CpuIsa : int { kAvx512Bf16 = 0, kAmx = 1 };

// The paths this CPU (and OS) can run, best last; empty when it has no AVX-512-BF16.
const std::vector<CpuIsa>& supported_cpu_isas();

// The process's path: CORELLM_ISA if set (InvalidArgument naming the value and the supported
// ones when this CPU cannot run it), else the best supported. InvalidArgument when none is.
CpuIsa cpu_isa();

const char* cpu_isa_name(CpuIsa isa);

// The path of that name ("avx512bf16", "amx"); InvalidArgument naming the known ones otherwise.
CpuIsa cpu_isa_named(const std::string& name);

// The CPU's model name (CPUID brand string), for logs and benchmark tables.
std::string cpu_model_name();

}  // namespace corellm
