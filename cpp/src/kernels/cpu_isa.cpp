// CPU feature detection for the kernels' run-time dispatch (cpu_isa.h). Compiled for plain
// x86-64 (CMakeLists.txt): it must run, and say what is missing, on a CPU below the baseline.
//
// AVX2 + FMA (x86-64-v3): CPUID.1:ECX FMA[12], MOVBE[22], OSXSAVE[27], AVX[28], F16C[29];
// CPUID.7:EBX BMI1[3], AVX2[5], BMI2[8]; CPUID.80000001h:ECX LZCNT[5]; the OS saving SSE and AVX
// state (XCR0 bits 1-2). AVX-512: CPUID.7:EBX F[16], DQ[17], BW[30], VL[31] and the opmask and
// ZMM state (XCR0 bits 5-7). AVX-512-BF16: CPUID.(7,1):EAX[5]. AVX-512-VNNI
// (the int8 dot products of quant_gemm.h): CPUID.7:ECX[11]. AMX-INT8: CPUID.7:EDX[25]. AMX-BF16: CPUID.7:EDX[22] and
// AMX-TILE EDX[24], XCR0 bits 17-18, and Linux's permission for this process to use tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, once; a process that never asks faults on its first tile load).
#include "corellm/kernels/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "corellm/check.h"

namespace corellm {

namespace {

struct Cpuid {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Cpuid cpuid(unsigned leaf, unsigned subleaf) {
  Cpuid r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) r = Cpuid{};
  return r;
}

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int b) { return (reg >> b) & 1u; }

bool has_avx2_fma() {
  const Cpuid f1 = cpuid(1, 0);
  if (!(bit(f1.ecx, 12) && bit(f1.ecx, 22) && bit(f1.ecx, 27) && bit(f1.ecx, 28) && bit(f1.ecx, 29))) return false;
  if ((xcr0() & 0x6) != 0x6) return false;  // SSE, AVX
  const Cpuid f7 = cpuid(7, 0);
  if (!(bit(f7.ebx, 3) && bit(f7.ebx, 5) && bit(f7.ebx, 8))) return false;  // BMI1, AVX2, BMI2
  return cpuid(0x80000000u, 0).eax >= 0x80000001u && bit(cpuid(0x80000001u, 0).ecx, 5);  // LZCNT
}

bool has_avx512() {
  if ((xcr0() & 0xE0) != 0xE0) return false;  // opmask, ZMM0-15 high halves, ZMM16-31
  const Cpuid f7 = cpuid(7, 0);
  return bit(f7.ebx, 16) && bit(f7.ebx, 17) && bit(f7.ebx, 30) && bit(f7.ebx, 31);  // F, DQ, BW, VL
}

bool has_avx512_bf16() { return bit(cpuid(7, 1).eax, 5); }

bool has_avx512_vnni() { return has_avx2_fma() && has_avx512() && bit(cpuid(7, 0).ecx, 11); }

bool request_tile_data_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool has_amx_bf16() {
  const Cpuid f7 = cpuid(7, 0);
  if (!(bit(f7.edx, 22) && bit(f7.edx, 24))) return false;  // AMX-BF16, AMX-TILE
  if ((xcr0() & (3ull << 17)) != (3ull << 17)) return false;  // XTILECFG, XTILEDATA
  return request_tile_data_permission();
}

// Each level only on top of the one before it (the kernels of a path use the paths below).
std::vector<CpuIsa> detect() {
  std::vector<CpuIsa> isas;
  if (!has_avx2_fma()) return isas;
  isas.push_back(CpuIsa::kAvx2);
  if (!has_avx512()) return isas;
  isas.push_back(CpuIsa::kAvx512);
  if (!has_avx512_bf16()) return isas;
  isas.push_back(CpuIsa::kAvx512Bf16);
  if (has_amx_bf16()) isas.push_back(CpuIsa::kAmx);
  return isas;
}

constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};
constexpr const char* kAllNames = "avx2, avx512, avx512bf16 and amx";

// The path of that name, if it is one.
std::optional<CpuIsa> isa_of_name(const std::string& name) {
  for (CpuIsa isa : kAllIsas) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  return std::nullopt;
}

std::string supported_names() {
  std::string names;
  for (CpuIsa isa : supported_cpu_isas()) names += std::string(names.empty() ? "" : ", ") + cpu_isa_name(isa);
  return names.empty() ? "none" : names;
}

CpuIsa choose() {
  const std::vector<CpuIsa>& isas = supported_cpu_isas();
  const char* forced = std::getenv("CORELLM_ISA");
  if (forced != nullptr && *forced != '\0') {
    const std::optional<CpuIsa> isa = isa_of_name(forced);
    CORELLM_CHECK_ARG(isa.has_value(), "CORELLM_ISA=", forced,
                      ": unknown instruction-set path (the paths are ", kAllNames, "; this CPU runs ",
                      supported_names(), ")");
    CORELLM_CHECK_ARG(std::find(isas.begin(), isas.end(), *isa) != isas.end(), "CORELLM_ISA=", forced,
                      ": this CPU (", cpu_model_name(), ") runs ", supported_names());
    return *isa;
  }
  CORELLM_CHECK_ARG(!isas.empty(), "corellm's CPU kernels need AVX2 and FMA (x86-64-v3), which this CPU (",
                    cpu_model_name(), ") lacks");
  return isas.back();
}

}  // namespace

const std::vector<CpuIsa>& supported_cpu_isas() {
  static const std::vector<CpuIsa> isas = detect();
  return isas;
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = choose();  // a throw leaves it unset: the next call throws again
  return isa;
}

bool cpu_has_avx512_vnni() {
  static const bool vnni = has_avx512_vnni();
  return vnni;
}

bool cpu_has_amx_int8() {
  static const bool amx_int8 = [] {
    const std::vector<CpuIsa>& isas = supported_cpu_isas();  // kAmx: tiles usable, permission granted
    return std::find(isas.begin(), isas.end(), CpuIsa::kAmx) != isas.end() && bit(cpuid(7, 0).edx, 25);
  }();
  return amx_int8;
}

bool cpu_is_amd() {
  static const bool amd = [] {
    const Cpuid r = cpuid(0, 0);  // the vendor string: ebx, edx, ecx
    char vendor[13] = {};
    std::memcpy(vendor, &r.ebx, 4);
    std::memcpy(vendor + 4, &r.edx, 4);
    std::memcpy(vendor + 8, &r.ecx, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0;
  }();
  return amd;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512bf16";
    case CpuIsa::kAmx: return "amx";
  }
  return "unknown";
}

void check_cpu_runs(CpuIsa isa, const char* what) {
  const std::vector<CpuIsa>& runnable = supported_cpu_isas();
  CORELLM_CHECK_ARG(std::find(runnable.begin(), runnable.end(), isa) != runnable.end(), what,
                    ": this CPU cannot run the ", cpu_isa_name(isa), " path");
}

CpuIsa cpu_isa_named(const std::string& name) {
  const std::optional<CpuIsa> isa = isa_of_name(name);
  CORELLM_CHECK_ARG(isa.has_value(), "unknown instruction-set path '", name, "' (the paths are ", kAllNames, ")");
  return *isa;
}

std::string cpu_model_name() {
  if (cpuid(0x80000000u, 0).eax < 0x80000004u) return "unknown CPU";
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const Cpuid r = cpuid(0x80000002u + i, 0);
    std::memcpy(brand + 16 * i, &r, 16);
  }
  std::string name(brand);
  const size_t first = name.find_first_not_of(' ');
  return first == std::string::npos ? "unknown CPU" : name.substr(first);
}

}  // namespace corellm
