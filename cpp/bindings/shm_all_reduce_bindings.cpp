// Binds ShmAllReduce: the sum of a CPU tensor over the tensor-parallel ranks on this machine, in
// place, through shared memory. The call releases the GIL.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "corellm/shm_all_reduce.h"
#include "glue.h"

namespace corellm::binding {

void bind_shm_all_reduce(py::module_& m) {
  py::class_<ShmAllReduce>(m, "ShmAllReduce",
                           "The sum of a tensor over the ranks of a tensor-parallel group on this machine, "
                           "through shared memory (cpp/include/corellm/shm_all_reduce.h).")
      .def_static("create", &ShmAllReduce::create, py::arg("name"), py::arg("size"), py::arg("buffer_bytes"),
                  "Rank 0's end: a new segment named name ('/corellm-...') for size ranks.")
      .def_static("attach", &ShmAllReduce::attach, py::arg("name"), py::arg("rank"),
                  "Rank `rank` (1 .. size-1) of the segment rank 0 created.")
      .def("unlink_name", &ShmAllReduce::unlink_name, "Removes the name; the mappings stay valid.")
      .def(
          "all_reduce",
          [](ShmAllReduce& a, uintptr_t data, int64_t count, int32_t dtype, double timeout_s) {
            const DType t = dtype_of(dtype);
            py::gil_scoped_release release;
            a.all_reduce_or_throw(ptr<void>(data), count, t, timeout_s);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("timeout_s"),
          "data (the address of count contiguous F32 or BF16 elements) becomes the sum over the ranks; "
          "RuntimeError naming the rank that exited, or the timeout, when one does not arrive.")
      .def_property_readonly("rank", &ShmAllReduce::rank)
      .def_property_readonly("size", &ShmAllReduce::size)
            .def_property_readonly("name", &ShmAllReduce::name);
}

}  // namespace corellm::binding
