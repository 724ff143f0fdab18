// Binds the scheduler and the structures it exchanges: SchedulerConfig, SchedulerOutput (with its
// new / cached request data), SchedulerUpdate and SchedulerStats, and Scheduler itself. A request's
// Python EngineCoreRequest rides along as its payload.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <string>

#include "corellm/ngram_proposer.h"
#include "corellm/scheduler.h"
#include "corellm/scheduler_output.h"
#include "corellm/scheduler_update.h"
#include "glue.h"

namespace corellm::binding {
namespace {

// The Python object a request carries through the core (its EngineCoreRequest, which the model
// runner receives with the scheduled request). The core may drop the last reference while the GIL
// is released, so the destructor takes the GIL.
struct PyPayload final : RequestPayload {
  py::object obj;
  explicit PyPayload(py::object o) : obj(std::move(o)) {}
  ~PyPayload() override {
    if (!Py_IsInitialized()) {
      obj.release();  // interpreter gone: leak rather than touch it
      return;
    }
    py::gil_scoped_acquire gil;
    obj = py::object();
  }
};

py::object payload_object(const std::shared_ptr<RequestPayload>& payload) {
  if (!payload) return py::none();
  return static_cast<const PyPayload&>(*payload).obj;
}

// A snapshot of one request's scheduler state (copied: the request may be freed later).
py::dict request_info(const Request& r) {
  py::dict d;
  d["request_id"] = *r.request_id;
  d["status"] = r.status;
  d["token_ids"] = r.token_ids;
  d["num_prompt_tokens"] = r.num_prompt_tokens;
  d["num_computed_tokens"] = r.num_computed_tokens;
  d["num_cached_tokens"] = r.num_cached_tokens;
  d["block_ids"] = r.block_ids;
  d["batch_row"] = r.batch_row;
  d["num_preemptions"] = r.num_preemptions;
  d["draft_token_ids"] = r.draft_token_ids;
  d["draft_acceptance_rate"] = r.draft_acceptance.acceptance_rate();
  return d;
}

}  // namespace

void bind_scheduler(py::module_& m) {
  m.def("propose_ngram_drafts",
        [](const py::object& token_ids, int32_t prompt_lookup_min, int32_t prompt_lookup_max, int32_t max_drafts) {
          auto tokens = to_int32_vector(token_ids, "token_ids", 0);
          NgramParams params{prompt_lookup_min, prompt_lookup_max};
          params.validate();
          CORELLM_CHECK_ARG(max_drafts >= 0, "max_drafts must be >= 0, got ", max_drafts);
          std::vector<int32_t> drafts(static_cast<size_t>(max_drafts)), z;
          const int32_t n = propose_ngram_drafts(tokens.data(), static_cast<int32_t>(tokens.size()), params,
                                                 max_drafts, drafts.data(), z);
          drafts.resize(static_cast<size_t>(n));
          return drafts;
        },
        py::arg("token_ids"), py::kw_only(), py::arg("prompt_lookup_min"), py::arg("prompt_lookup_max"),
        py::arg("max_drafts"),
        "The n-gram proposer's drafts for one token sequence (the scheduler's own, exposed for tests).");

  py::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(py::init([](int32_t max_num_seqs, int32_t max_num_batched_tokens, int32_t max_model_len,
                       int32_t block_size, int32_t num_blocks, int32_t long_prefill_token_threshold,
                       bool enable_prefix_caching, bool enable_chunked_prefill, SchedulingPolicy scheduling_policy,
                       int32_t num_speculative_tokens, int32_t prompt_lookup_min, int32_t prompt_lookup_max,
                       int32_t num_lookahead_tokens, int32_t max_num_encoder_input_tokens,
                       int32_t encoder_cache_size) {
             SchedulerConfig c;
             c.max_num_seqs = max_num_seqs;
             c.max_num_batched_tokens = max_num_batched_tokens;
             c.max_model_len = max_model_len;
             c.block_size = block_size;
             c.num_blocks = num_blocks;
             c.long_prefill_token_threshold = long_prefill_token_threshold;
             c.enable_prefix_caching = enable_prefix_caching;
             c.enable_chunked_prefill = enable_chunked_prefill;
             c.scheduling_policy = scheduling_policy;
             c.num_speculative_tokens = num_speculative_tokens;
             c.prompt_lookup_min = prompt_lookup_min;
             c.prompt_lookup_max = prompt_lookup_max;
             c.num_lookahead_tokens = num_lookahead_tokens;
             c.max_num_encoder_input_tokens = max_num_encoder_input_tokens;
             c.encoder_cache_size = encoder_cache_size;
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_num_seqs") = 256, py::arg("max_num_batched_tokens") = 2048,
           py::arg("max_model_len") = 2048, py::arg("block_size") = 16, py::arg("num_blocks"),
           py::arg("long_prefill_token_threshold") = 0, py::arg("enable_prefix_caching") = true,
           py::arg("enable_chunked_prefill") = true, py::arg("scheduling_policy") = SchedulingPolicy::FCFS,
           py::arg("num_speculative_tokens") = 0, py::arg("prompt_lookup_min") = 0, py::arg("prompt_lookup_max") = 0,
           py::arg("num_lookahead_tokens") = 0, py::arg("max_num_encoder_input_tokens") = 0,
           py::arg("encoder_cache_size") = 0)
      .def_readonly("max_num_seqs", &SchedulerConfig::max_num_seqs)
      .def_readonly("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
      .def_readonly("max_model_len", &SchedulerConfig::max_model_len)
      .def_readonly("block_size", &SchedulerConfig::block_size)
      .def_readonly("num_blocks", &SchedulerConfig::num_blocks)
      .def_readonly("long_prefill_token_threshold", &SchedulerConfig::long_prefill_token_threshold)
      .def_readonly("enable_prefix_caching", &SchedulerConfig::enable_prefix_caching)
      .def_readonly("enable_chunked_prefill", &SchedulerConfig::enable_chunked_prefill)
      .def_readonly("scheduling_policy", &SchedulerConfig::scheduling_policy)
      .def_readonly("num_speculative_tokens", &SchedulerConfig::num_speculative_tokens)
      .def_readonly("prompt_lookup_min", &SchedulerConfig::prompt_lookup_min)
      .def_readonly("prompt_lookup_max", &SchedulerConfig::prompt_lookup_max)
      .def_readonly("num_lookahead_tokens", &SchedulerConfig::num_lookahead_tokens)
      .def_readonly("max_num_encoder_input_tokens", &SchedulerConfig::max_num_encoder_input_tokens)
      .def_readonly("encoder_cache_size", &SchedulerConfig::encoder_cache_size);

  py::class_<NewRequestData>(m, "NewRequestData")
      .def_readonly("req_id", &NewRequestData::req_id)
      .def_readonly("token_ids", &NewRequestData::token_ids)
      .def_readonly("num_prompt_tokens", &NewRequestData::num_prompt_tokens)
      .def_readonly("block_ids", &NewRequestData::block_ids)
      .def_readonly("num_computed_tokens", &NewRequestData::num_computed_tokens)
      .def_readonly("batch_row", &NewRequestData::batch_row)
      .def_property_readonly("payload", [](const NewRequestData& d) { return payload_object(d.payload); });

  py::class_<CachedRequestData>(m, "CachedRequestData")
      .def_property_readonly("req_ids", [](const CachedRequestData& d) { return id_list(d.req_ids); })
      .def_readonly("new_block_ids", &CachedRequestData::new_block_ids)
      .def_readonly("num_computed_tokens", &CachedRequestData::num_computed_tokens)
      .def_readonly("batch_rows", &CachedRequestData::batch_rows);

  py::class_<SchedulerOutput, std::shared_ptr<SchedulerOutput>>(m, "SchedulerOutput")
      .def_readonly("step_id", &SchedulerOutput::step_id)
      .def_readonly("scheduled_new_reqs", &SchedulerOutput::scheduled_new_reqs)
      .def_readonly("scheduled_cached_reqs", &SchedulerOutput::scheduled_cached_reqs)
      .def_readonly("encoder_hashes", &SchedulerOutput::encoder_hashes)
      .def_readonly("freed_encoder_hashes", &SchedulerOutput::freed_encoder_hashes)
      .def_property_readonly("req_ids", [](const SchedulerOutput& o) { return id_list(o.req_ids); })
      .def_property_readonly("num_scheduled_tokens", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.num_scheduled_tokens.data(), o.num_scheduled_tokens.size(), self); })
      .def_property_readonly("num_computed_tokens", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.num_computed_tokens.data(), o.num_computed_tokens.size(), self); })
      .def_property_readonly("batch_rows", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.batch_rows.data(), o.batch_rows.size(), self); })
      .def_property_readonly("samples_token", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.samples_token.data(), o.samples_token.size(), self).attr("view")("bool"); })
      .def_property_readonly("uses_grammar", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.uses_grammar.data(), o.uses_grammar.size(), self).attr("view")("bool"); })
      .def_property_readonly("num_draft_tokens", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.num_draft_tokens.data(), o.num_draft_tokens.size(), self); })
      .def_property_readonly("draft_token_ids", [](py::object self) {
        auto& o = self.cast<const SchedulerOutput&>();
        return view(o.draft_token_ids.data(), o.draft_token_ids.size(), self); })
      .def_readonly("total_num_scheduled_tokens", &SchedulerOutput::total_num_scheduled_tokens)
      .def_readonly("finished_req_ids", &SchedulerOutput::finished_req_ids)
      .def_readonly("preempted_req_ids", &SchedulerOutput::preempted_req_ids)
      .def_property_readonly("num_reqs", &SchedulerOutput::num_reqs)
      .def("__len__", &SchedulerOutput::num_reqs);

  py::class_<SchedulerStats>(m, "SchedulerStats")
      .def(py::init<>())  // all zero: an engine that has not stepped yet
      .def_readonly("num_running", &SchedulerStats::num_running)
      .def_readonly("num_waiting", &SchedulerStats::num_waiting)
      .def_readonly("kv_cache_usage", &SchedulerStats::kv_cache_usage)
      .def_readonly("prefix_cache_queries", &SchedulerStats::prefix_cache_queries)
      .def_readonly("prefix_cache_hits", &SchedulerStats::prefix_cache_hits)
      .def_readonly("num_preemptions", &SchedulerStats::num_preemptions)
      .def_readonly("num_free_blocks", &SchedulerStats::num_free_blocks);

  py::class_<SpecDecodingStats>(m, "SpecDecodingStats")
      .def(py::init<>())
      .def_readonly("num_drafts", &SpecDecodingStats::num_drafts)
      .def_readonly("num_draft_tokens", &SpecDecodingStats::num_draft_tokens)
      .def_readonly("num_accepted_tokens", &SpecDecodingStats::num_accepted_tokens)
      .def_readonly("num_draft_tokens_per_pos", &SpecDecodingStats::num_draft_tokens_per_pos)
      .def_readonly("num_accepted_tokens_per_pos", &SpecDecodingStats::num_accepted_tokens_per_pos);

  py::class_<SchedulerUpdate>(m, "SchedulerUpdate")
      .def_readonly("step_id", &SchedulerUpdate::step_id)
      .def_property_readonly("req_ids", [](const SchedulerUpdate& o) { return id_list(o.req_ids); })
      .def_property_readonly("num_new_tokens", [](py::object self) {
        auto& o = self.cast<const SchedulerUpdate&>();
        return view(o.num_new_tokens.data(), o.num_new_tokens.size(), self); })
      .def_property_readonly("new_token_ids", [](py::object self) {
        auto& o = self.cast<const SchedulerUpdate&>();
        return view(o.new_token_ids.data(), o.new_token_ids.size(), self); })
      .def_property_readonly("finish_reasons", [](py::object self) {
        auto& o = self.cast<const SchedulerUpdate&>();
        return view(o.finish_reasons.data(), o.finish_reasons.size(), self); })
      .def_property_readonly("stop_reasons", [](py::object self) {
        auto& o = self.cast<const SchedulerUpdate&>();
        return view(o.stop_reasons.data(), o.stop_reasons.size(), self); })
      .def_property_readonly("num_cached_tokens", [](py::object self) {
        auto& o = self.cast<const SchedulerUpdate&>();
        return view(o.num_cached_tokens.data(), o.num_cached_tokens.size(), self); })
      .def_readonly("scheduler_stats", &SchedulerUpdate::scheduler_stats)
      .def_readonly("spec_decoding_stats", &SchedulerUpdate::spec_decoding_stats)
      .def("__len__", &SchedulerUpdate::size);

  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init([](const SchedulerConfig& config, std::shared_ptr<PrefixHasher> hasher) {
             return std::make_unique<Scheduler>(config, std::move(hasher));
           }),
           py::arg("config"), py::arg("hasher") = nullptr)
      .def_property_readonly("config", &Scheduler::config)
      .def("add_request",
           [](Scheduler& s, std::string request_id, const py::object& prompt_token_ids, int32_t max_tokens,
              int32_t min_tokens, bool ignore_eos, int32_t eos_token_id, const py::object& stop_token_ids,
              const py::object& repetition_detection, int32_t priority, double arrival_time, std::string cache_salt,
              const py::list& mm_ranges, bool use_structured_output, const py::object& prediction_token_ids,
              py::object payload) {
             EngineCoreRequest request;
             request.request_id = std::move(request_id);
             request.prompt_token_ids = to_int32_vector(prompt_token_ids, "prompt_token_ids", 0);
             request.max_tokens = max_tokens;
             request.min_tokens = min_tokens;
             request.ignore_eos = ignore_eos;
             request.eos_token_id = eos_token_id;
             request.stop_token_ids = to_int32_vector(stop_token_ids, "stop_token_ids", 0);
             if (!repetition_detection.is_none()) {  // (max_pattern_size, min_pattern_size, min_count)
               const auto rule = repetition_detection.cast<py::tuple>();
               CORELLM_CHECK_ARG(rule.size() == 3,
                                 "repetition_detection is (max_pattern_size, min_pattern_size, min_count)");
               request.repetition_detection = {rule[0].cast<int32_t>(), rule[1].cast<int32_t>(),
                                               rule[2].cast<int32_t>()};
             }
             request.priority = priority;
             request.arrival_time = arrival_time;
             request.cache_salt = std::move(cache_salt);
             for (const py::handle item : mm_ranges) {  // (offset, length, hash)
               const auto range = item.cast<py::tuple>();
               CORELLM_CHECK_ARG(range.size() == 3, "mm_ranges: each entry is (offset, length, hash)");
               request.mm_ranges.push_back(
                   {range[0].cast<int32_t>(), range[1].cast<int32_t>(), range[2].cast<std::string>()});
             }
             request.use_structured_output = use_structured_output;
             request.prediction_token_ids = to_int32_vector(prediction_token_ids, "prediction_token_ids", 0);
             if (!payload.is_none()) request.payload = std::make_shared<PyPayload>(std::move(payload));
             s.add_request(std::move(request));
           },
           py::arg("request_id"), py::arg("prompt_token_ids"), py::kw_only(), py::arg("max_tokens"),
           py::arg("min_tokens") = 0, py::arg("ignore_eos") = false, py::arg("eos_token_id") = -1,
           py::arg("stop_token_ids") = py::tuple(), py::arg("repetition_detection") = py::none(),
           py::arg("priority") = 0,
           py::arg("arrival_time") = 0.0, py::arg("cache_salt") = "", py::arg("mm_ranges") = py::list(),
           py::arg("use_structured_output") = false, py::arg("prediction_token_ids") = py::tuple(),
           py::arg("payload") = py::none())
      .def("schedule", &Scheduler::schedule, py::call_guard<py::gil_scoped_release>())
      .def("update_from_output",
           [](Scheduler& s, const SchedulerOutput& output, const py::object& sampled) {
             TokenMatrix m = to_token_matrix(sampled, "sampled_token_ids");
             py::gil_scoped_release release;
             return s.update_from_output(output, m.values.data(), m.rows, m.width);
           },
           py::arg("scheduler_output"), py::arg("sampled_token_ids"))
      .def("set_draft_token_ids",
           [](Scheduler& s, const std::string& request_id, const py::object& draft_token_ids) {
             auto ids = to_int32_vector(draft_token_ids, "draft_token_ids", 0);
             s.set_draft_token_ids(request_id, ids.data(), ids.size());
           },
           py::arg("request_id"), py::arg("draft_token_ids"))
      .def("set_step_cost", &Scheduler::set_step_cost, py::arg("fixed_seconds"), py::arg("per_token_seconds"))
      .def("finish_requests", &Scheduler::finish_requests, py::arg("request_ids"), py::arg("status"),
           py::call_guard<py::gil_scoped_release>())
      .def("has_unfinished_requests", &Scheduler::has_unfinished_requests)
      .def_property_readonly("num_unfinished_requests", &Scheduler::num_unfinished_requests)
      .def_property_readonly("num_waiting", &Scheduler::num_waiting)
      .def_property_readonly("num_running", &Scheduler::num_running)
      .def_property_readonly("num_free_blocks", [](const Scheduler& s) { return s.kv_cache_manager().num_free_blocks(); })
      .def_property_readonly("num_blocks", [](const Scheduler& s) { return s.kv_cache_manager().num_blocks(); })
      .def("stats", &Scheduler::stats)
      .def("get_request", [](const Scheduler& s, const std::string& id) -> py::object {
             const Request* r = s.find_request(id);
             return r ? py::object(request_info(*r)) : py::none(); })
      .def("reset_prefix_cache", &Scheduler::reset_prefix_cache)
      .def("check_integrity", &Scheduler::check_integrity);
}

}  // namespace corellm::binding
