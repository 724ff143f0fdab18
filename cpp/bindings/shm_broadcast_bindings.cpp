// Binds ShmBroadcast: the writer's and the readers' ends of a shared-memory message ring. The waits
// release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "corellm/shm_broadcast.h"
#include "glue.h"

namespace corellm::binding {

namespace {

// One buffer, or a list / tuple of them, as the parts of a message: their bytes one after the
// other. A buffer is C-contiguous, or 2-D with contiguous rows (the first columns of an array).
// int32_items: each buffer must hold int32 values. `held` keeps the buffers until the copy.
std::vector<ShmBroadcast::Part> message_parts(const py::handle& data, bool int32_items,
                                              std::vector<py::buffer_info>& held) {
  std::vector<ShmBroadcast::Part> parts;
  auto add = [&](const py::handle& h) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(h).request();
    CORELLM_CHECK_ARG(!int32_items || info.item_type_is_equivalent_to<int32_t>(), "publish_values: a part holds '",
                      info.format, "' items, not int32");
    const auto item = static_cast<size_t>(info.itemsize);
    if (PyBuffer_IsContiguous(info.view(), 'C')) {
      parts.push_back({info.ptr, static_cast<size_t>(info.size) * item});
    } else {
      CORELLM_CHECK_ARG(info.ndim == 2 && info.strides[1] == info.itemsize && info.strides[0] > 0,
                        "publish: each part must be contiguous, or 2-D with contiguous rows");
      parts.push_back({info.ptr, static_cast<size_t>(info.shape[1]) * item, static_cast<size_t>(info.shape[0]),
                       static_cast<size_t>(info.strides[0])});
    }
    held.push_back(std::move(info));
  };
  if (py::isinstance<py::list>(data) || py::isinstance<py::tuple>(data)) {
    for (const py::handle& h : data) add(h);
  } else {
    add(data);
  }
  return parts;
}

// A header-and-values message (publish_values / receive_values), in a slot:
//   int64 count (the int32 values that follow the header), int64 elsewhere (1: they travel another
//   way, not in this slot), int64 header length, the header's int64 values, the int32 values.
constexpr size_t kValuesPrefix = 3;

}  // namespace

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
            std::vector<py::buffer_info> held;
            std::vector<ShmBroadcast::Part> parts = message_parts(data, /*int32_items=*/false, held);
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
      .def(
          "publish_values",
          [](ShmBroadcast& b, const std::vector<int64_t>& header, const py::object& values,
             double timeout_s) -> py::object {
            std::vector<py::buffer_info> held;
            std::vector<ShmBroadcast::Part> parts = message_parts(values, /*int32_items=*/true, held);
            size_t bytes = 0;
            for (const ShmBroadcast::Part& p : parts) bytes += p.size();
            const size_t head_bytes = (kValuesPrefix + header.size()) * sizeof(int64_t);
            const bool fits = head_bytes + bytes <= b.slot_capacity();
            const int64_t prefix[kValuesPrefix] = {static_cast<int64_t>(bytes / sizeof(int32_t)), fits ? 0 : 1,
                                                   static_cast<int64_t>(header.size())};
            parts.insert(parts.begin(), {{prefix, sizeof(prefix)},
                                         {header.data(), header.size() * sizeof(int64_t)}});
            if (!fits) parts.resize(2);
            bool published = false;
            {
              py::gil_scoped_release release;
              published = b.publish(parts, timeout_s);
            }
            if (!published) return py::none();
            return py::bool_(fits);
          },
          py::arg("header"), py::arg("values"), py::arg("timeout_s"),
          "A message of int64 header values and int32 values (an int32 buffer, or a list of them, "
          "each contiguous or 2-D with contiguous rows, sent one after the other). True: all of it is in the "
          "ring; False: the values do not fit a slot — the header went alone, marked so, and the caller "
          "sends the values another way; None: a reader had not taken the slot's previous message within "
          "timeout_s (nothing was published).")
      .def(
          "receive_values_in_place",
          [](py::object self, double timeout_s) -> py::object {
            auto& b = self.cast<ShmBroadcast&>();
            std::optional<ShmBroadcast::View> message;
            {
              py::gil_scoped_release release;
              message = b.receive_in_place(timeout_s);
            }
            if (!message) return py::none();
            const auto* prefix = reinterpret_cast<const int64_t*>(message->data);
            CORELLM_CHECK(message->size >= kValuesPrefix * sizeof(int64_t), "receive_values: a message of ",
                          message->size, " bytes has no header");
            const auto count = static_cast<size_t>(prefix[0]), header_len = static_cast<size_t>(prefix[2]);
            const size_t head_bytes = (kValuesPrefix + header_len) * sizeof(int64_t);
            const bool here = prefix[1] == 0;
            CORELLM_CHECK(message->size == head_bytes + (here ? count * sizeof(int32_t) : 0), "receive_values: a ",
                          message->size, "-byte message does not hold its header and ", count, " values");
            py::list header;
            for (size_t i = 0; i < header_len; ++i) header.append(prefix[kValuesPrefix + i]);
            py::object values = py::none();
            if (here) {  // a view of the slot (kept mapped by `self`); writable only so that torch.from_numpy
                         // takes it without a warning: nothing writes it
              auto* data = const_cast<uint8_t*>(message->data + head_bytes);
              values = py::array_t<int32_t>(static_cast<py::ssize_t>(count), reinterpret_cast<int32_t*>(data), self);
            }
            return py::make_tuple(header, values, count);
          },
          py::arg("timeout_s"),
          "The next publish_values message, where it lies in the ring: (header, values, count) — the header's "
          "values as a list, the values as an int32 array valid until this reader's next receive (None when "
          "they travel another way), their count; None if no message came within timeout_s.")
      .def_property_readonly("slot_capacity", &ShmBroadcast::slot_capacity)
      .def_property_readonly("num_readers", &ShmBroadcast::num_readers)
      .def_property_readonly("name", &ShmBroadcast::name);
}

}  // namespace corellm::binding
