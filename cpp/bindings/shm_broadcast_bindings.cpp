// Binds ShmBroadcast: the writer's and the readers' ends of a shared-memory message ring. The waits
// release the GIL.
#include <pybind11/numpy.h>
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
          [](ShmBroadcast& b, const py::object& data, double timeout_s) {
            // One buffer, or a list / tuple of them: the message is their bytes one after the other.
            std::vector<py::buffer_info> infos;
            auto add = [&](const py::handle& h) {
              py::buffer_info info = py::reinterpret_borrow<py::buffer>(h).request();
              CORELLM_CHECK_ARG(PyBuffer_IsContiguous(info.view(), 'C'), "publish: each part must be contiguous");
              infos.push_back(std::move(info));
            };
            if (py::isinstance<py::list>(data) || py::isinstance<py::tuple>(data)) {
              for (const py::handle& h : data) add(h);
            } else {
              add(data);
            }
            std::vector<ShmBroadcast::Part> parts;
            for (const py::buffer_info& info : infos) {
              parts.push_back({info.ptr, static_cast<size_t>(info.size * info.itemsize)});
            }
            py::gil_scoped_release release;
            return b.publish(parts, timeout_s);
          },
          py::arg("data"), py::arg("timeout_s"),
          "True once the readers can see the message (a buffer, or a list of buffers sent as one); False "
          "if a reader has not taken the message in the slot within timeout_s.")
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
            auto* owned = new std::vector<uint8_t>(std::move(out));  // the array's memory, no copy
            py::capsule release(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
            return py::array_t<uint8_t>(static_cast<py::ssize_t>(owned->size()), owned->data(), release);
          },
          py::arg("timeout_s"), "The next message's bytes as a writable uint8 array, or None if none came "
          "within timeout_s.")
      .def_property_readonly("slot_capacity", &ShmBroadcast::slot_capacity)
      .def_property_readonly("num_readers", &ShmBroadcast::num_readers)
      .def_property_readonly("name", &ShmBroadcast::name);
}

}  // namespace corellm::binding
