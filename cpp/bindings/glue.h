// The binding's glue, shared by the files of corellm._core's binding (never by the core itself):
// raw addresses to typed pointers, dtype tags, integer arrays from Python, zero-copy NumPy views,
// and address-valued struct fields.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/dtype.h"
#include "corellm/kernels/paged_attention.h"
#include "corellm/request.h"

namespace corellm::binding {

namespace py = pybind11;

// A tensor's data_ptr() as the pointer a kernel takes (0: null).
template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// The dtype tag of a CPU kernel call, checked.
inline DType dtype_of(int32_t tag) {
  CORELLM_CHECK_ARG(tag == static_cast<int32_t>(DType::F32) || tag == static_cast<int32_t>(DType::BF16),
                    "unknown dtype tag ", tag, " (the CPU kernels take F32 or BF16)");
  return static_cast<DType>(tag);
}

// The KV cache element tag of a CPU kernel call (paged_attention.h's KVCacheElement), checked.
inline KVCacheElement kv_element_of(int32_t tag) {
  CORELLM_CHECK_ARG(tag >= static_cast<int32_t>(KVCacheElement::kModelDType) &&
                        tag <= static_cast<int32_t>(KVCacheElement::kFp8E5M2),
                    "unknown KV cache element tag ", tag, " (KV_MODEL_DTYPE, KV_FP8_E4M3 or KV_FP8_E5M2)");
  return static_cast<KVCacheElement>(tag);
}

// A pointer field of a bound struct, read and written from Python as an address (an int; 0 for
// null): named fields instead of long positional lists of addresses.
template <class C, class P>
void def_address(py::class_<C>& cls, const char* name, P* C::*member, const char* doc = "") {
  cls.def_property(
      name, [member](const C& c) { return reinterpret_cast<uintptr_t>(c.*member); },
      [member](C& c, uintptr_t address) { c.*member = reinterpret_cast<P*>(address); }, doc);
}

// A 1-D array of integer ids from any sequence: a list, a NumPy array of any integer dtype.
// Rejects non-integers and values outside [min_value, int32 max] with a ValueError naming `what`.
inline std::vector<int32_t> to_int32_vector(const py::handle& obj, const char* what, int64_t min_value) {
  py::array arr = py::array::ensure(obj);
  CORELLM_CHECK_ARG(arr, what, " must be a sequence of integers");
  CORELLM_CHECK_ARG(arr.ndim() == 1, what, " must be 1-D, got ", arr.ndim(), " dimensions");
  if (arr.size() == 0) return {};
  const char kind = arr.dtype().kind();
  CORELLM_CHECK_ARG(kind == 'i' || kind == 'u', what, " must hold integers, got dtype ",
                    std::string(py::str(arr.dtype())));
  auto values = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  std::vector<int32_t> out(static_cast<size_t>(values.size()));
  const int64_t* data = values.data();
  for (size_t i = 0; i < out.size(); ++i) {
    CORELLM_CHECK_ARG(data[i] >= min_value && data[i] <= std::numeric_limits<int32_t>::max(), what,
                      "[", i, "] = ", data[i], " is out of range");
    out[i] = static_cast<int32_t>(data[i]);
  }
  return out;
}

// Per-request token ids, one row each, -1 after a row's last: a 2-D integer array [rows, width],
// or a 1-D one (width 1: one token per request). Values must be in [-1, int32 max].
struct TokenMatrix {
  std::vector<int32_t> values;  // [rows * width]
  size_t rows = 0;
  size_t width = 1;
};

inline TokenMatrix to_token_matrix(const py::handle& obj, const char* what) {
  py::array arr = py::array::ensure(obj);
  CORELLM_CHECK_ARG(arr, what, " must be an array of integers");
  CORELLM_CHECK_ARG(arr.ndim() == 1 || arr.ndim() == 2, what, " must be 1-D or 2-D, got ", arr.ndim(),
                    " dimensions");
  TokenMatrix m;
  m.rows = static_cast<size_t>(arr.shape(0));
  m.width = arr.ndim() == 2 ? static_cast<size_t>(arr.shape(1)) : 1;
  m.values = to_int32_vector(arr.attr("reshape")(-1), what, -1);
  return m;
}

// A NumPy view of `n` values owned by `owner` (kept alive by the view): no copy.
template <class T>
py::array_t<T> view(const T* data, size_t n, py::handle owner) {
  return py::array_t<T>({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(sizeof(T))}, data, owner);
}

inline py::list id_list(const std::vector<RequestId>& ids) {
  py::list out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = py::str(*ids[i]);
  return out;
}

// Each part of the binding, in its own file; core_module.cpp calls them in this order.
void bind_prefix_cache(py::module_& m);    // prefix_cache_bindings.cpp: PrefixHasher, BlockPool
void bind_scheduler(py::module_& m);       // scheduler_bindings.cpp: config, output, update, Scheduler
void bind_batch_builder(py::module_& m);   // batch_builder_bindings.cpp
void bind_kernels(py::module_& m);         // kernel_bindings.cpp: corellm._core.kernels
void bind_model(py::module_& m);           // model_bindings.cpp: corellm._core.model
void bind_shm_broadcast(py::module_& m);   // shm_broadcast_bindings.cpp: ShmBroadcast
void bind_shm_all_reduce(py::module_& m);  // shm_all_reduce_bindings.cpp: ShmAllReduce

}  // namespace corellm::binding
