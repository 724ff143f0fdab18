// Binds ShmBroadcast: the writer's and the readers' ends of a shared-memory message ring. The waits
// release the GIL.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "corellm/shm_broadcast.h"
#include "glue.h"

namespace corellm::binding {

void bind_shm_broadcast(py::module_& m) {
  py::class_<ShmBroadcast>(m, "ShmBroadcast",
                           "Messages from one writer to num_readers readers on this machine through a ring of "
                           "slots in POSIX shared memory (cpp/include/corellm/shm_broadcast.h).")
      .def_static("create", &ShmBroadcast::create, py::arg("name"), py::arg("num_readers"), py::arg("num_slots"),
                  py::arg("slot_bytes"), "The writer's end: a new segment named name ('/corellm-...').")
      .def_static("attach", &ShmBroadcast::attach, py::arg("name"), py::arg("reader"),
                  "Reader `reader` of the segment a writer created.")
      .def("unlink_name", &ShmBroadcast::unlink_name, "Removes the name; the mappings stay valid.")
      .def(
          "publish",
          [](ShmBroadcast& b, const py::buffer& data, double timeout_s) {
            py::buffer_info info = data.request();
            CORELLM_CHECK_ARG(PyBuffer_IsContiguous(info.view(), 'C'), "publish: the message must be contiguous");
            const auto size = static_cast<size_t>(info.size * info.itemsize);
            py::gil_scoped_release release;
            return b.publish(info.ptr, size, timeout_s);
          },
          py::arg("data"), py::arg("timeout_s"),
          "True once the readers can see the message; False if a reader has not taken the message in "
          "the slot within timeout_s.")
      .def(
          "receive",
          [](ShmBroadcast& b, double timeout_s) -> py::object {
            std::vector<uint8_t> out;
            bool got = false;
            {
              py::gil_scoped_release release;
              got = b.receive(out, timeout_s);
            }
            if (!got) return py::none();
            return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
          },
          py::arg("timeout_s"), "The next message's bytes, or None if none came within timeout_s.")
      .def_property_readonly("slot_capacity", &ShmBroadcast::slot_capacity)
      .def_property_readonly("num_readers", &ShmBroadcast::num_readers)
      .def_property_readonly("name", &ShmBroadcast::name);
}

}  // namespace corellm::binding
