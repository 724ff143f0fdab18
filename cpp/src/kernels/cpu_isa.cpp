// CPU feature detection for the kernels' run-time dispatch (cpu_isa.h).
//
// AVX-512-BF16: CPUID.(7,1).EAX[5] with AVX-512 F/BW/VL (CPUID.(7,0).EBX[16,30,31]) and the OS
// saving the opmask and ZMM state (XCR0 bits 5-7, with SSE/AVX bits 1-2). AMX-BF16:
// CPUID.(7,0).EDX[22] and AMX-TILE EDX[24], XCR0 bits 17-18, and Linux's permission for this
// process to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM, once; a process that never asks
// faults on its first tile load).
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

bool has_avx512_bf16() {
  if (!bit(cpuid(1, 0).ecx, 27)) return false;  // OSXSAVE: xgetbv is allowed
  const uint64_t saved = xcr0();
  if ((saved & 0xE6) != 0xE6) return false;  // SSE, AVX, opmask, ZMM0-15 high, ZMM16-31
  const Cpuid f7 = cpuid(7, 0);
  if (!(bit(f7.ebx, 16) && bit(f7.ebx, 30) && bit(f7.ebx, 31))) return false;  // AVX-512 F, BW, VL
  return bit(cpuid(7, 1).eax, 5);                                               // AVX512_BF16
}

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

std::vector<CpuIsa> detect() {
  std::vector<CpuIsa> isas;
  if (!has_avx512_bf16()) return isas;
  isas.push_back(CpuIsa::kAvx512Bf16);
  if (has_amx_bf16()) isas.push_back(CpuIsa::kAmx);
  return isas;
}

constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

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
                      ": unknown instruction-set path (the paths are avx512bf16 and amx; this CPU runs ",
                      supported_names(), ")");
    CORELLM_CHECK_ARG(std::find(isas.begin(), isas.end(), *isa) != isas.end(), "CORELLM_ISA=", forced,
                      ": this CPU (", cpu_model_name(), ") runs ", supported_names());
    return *isa;
  }
  CORELLM_CHECK_ARG(!isas.empty(), "corellm's CPU kernels need AVX-512-BF16, which this CPU (", cpu_model_name(),
                    ") lacks");
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

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16: return "avx512bf16";
    case CpuIsa::kAmx: return "amx";
  }
  return "unknown";
}

CpuIsa cpu_isa_named(const std::string& name) {
  const std::optional<CpuIsa> isa = isa_of_name(name);
  CORELLM_CHECK_ARG(isa.has_value(), "unknown instruction-set path '", name, "' (the paths are avx512bf16 and amx)");
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
