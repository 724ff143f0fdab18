// Binds the BatchBuilder: the persistent input batch, whose flat arrays (input ids, positions, slot
// mapping, block table, ...) Python reads as zero-copy NumPy views.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "corellm/batch_builder.h"
#include "glue.h"

namespace corellm::binding {

void bind_batch_builder(py::module_& m) {
  py::class_<BatchBuilder>(m, "BatchBuilder")
      .def(py::init([](int32_t max_num_reqs, int32_t max_model_len, int32_t block_size, int32_t max_num_batched_tokens) {
             BatchBuilderConfig c;
             c.max_num_reqs = max_num_reqs;
             c.max_model_len = max_model_len;
             c.block_size = block_size;
             c.max_num_batched_tokens = max_num_batched_tokens;
             return std::make_unique<BatchBuilder>(c);
           }),
           py::kw_only(), py::arg("max_num_reqs"), py::arg("max_model_len"), py::arg("block_size"),
           py::arg("max_num_batched_tokens"))
      .def_property_readonly("max_num_blocks_per_req", &BatchBuilder::max_num_blocks_per_req)
      .def("update_states", &BatchBuilder::update_states, py::call_guard<py::gil_scoped_release>())
      .def("prepare_inputs", &BatchBuilder::prepare_inputs, py::call_guard<py::gil_scoped_release>())
      .def("record_sampled",
           [](BatchBuilder& b, const SchedulerOutput& output, const py::object& sampled) {
             TokenMatrix m = to_token_matrix(sampled, "sampled_token_ids");
             py::gil_scoped_release release;
             b.record_sampled(output, m.values.data(), m.rows, m.width);
           },
           py::arg("scheduler_output"), py::arg("sampled_token_ids"))
      .def_property_readonly("num_tokens", &BatchBuilder::num_tokens)
      .def_property_readonly("num_reqs", &BatchBuilder::num_reqs)
      .def_property_readonly("max_query_len", &BatchBuilder::max_query_len)
      .def_property_readonly("max_seq_len", &BatchBuilder::max_seq_len)
      .def_property_readonly("num_logits", &BatchBuilder::num_logits)
      .def_property_readonly("input_ids", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.input_ids(), static_cast<size_t>(b.num_tokens()), self); })
      .def_property_readonly("positions", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.positions(), static_cast<size_t>(b.num_tokens()), self); })
      .def_property_readonly("slot_mapping", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.slot_mapping(), static_cast<size_t>(b.num_tokens()), self); })
      .def_property_readonly("query_start_loc", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.query_start_loc(), static_cast<size_t>(b.num_reqs()) + 1, self); })
      .def_property_readonly("seq_lens", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.seq_lens(), static_cast<size_t>(b.num_reqs()), self); })
      .def_property_readonly("logits_indices", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        return view(b.logits_indices(), static_cast<size_t>(b.num_logits()), self); })
      .def_property_readonly("block_table", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        const auto width = static_cast<py::ssize_t>(b.max_num_blocks_per_req());
        return py::array_t<int32_t>({static_cast<py::ssize_t>(b.num_reqs()), width},
                                    {width * static_cast<py::ssize_t>(sizeof(int32_t)), static_cast<py::ssize_t>(sizeof(int32_t))},
                                    b.block_table(), self); })
      .def("row_token_ids", &BatchBuilder::row_token_ids)
      .def("row_block_ids", &BatchBuilder::row_block_ids);
}

}  // namespace corellm::binding
