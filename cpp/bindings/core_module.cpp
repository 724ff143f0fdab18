// corellm._core: the pybind11 binding of the native core (the only file that includes pybind11).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>

#include "corellm/batch_builder.h"
#include "corellm/block_pool.h"
#include "corellm/check.h"
#include "corellm/scheduler_update.h"
#include "corellm/kv_cache_manager.h"
#include "corellm/prefix_hash.h"
#include "corellm/request.h"
#include "corellm/scheduler.h"
#include "corellm/scheduler_output.h"

namespace py = pybind11;
using namespace corellm;

void bind_kernels(py::module_& m);  // kernel_bindings.cpp

namespace {

// The Python object a request carries through the core (its sampling parameters). The core may
// drop the last reference while the GIL is released, so the destructor takes the GIL.
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

// A 1-D array of integer ids from any sequence: a list, a NumPy array of any integer dtype.
// Rejects non-integers and values outside [min_value, int32 max] with a ValueError naming `what`.
std::vector<int32_t> to_int32_vector(const py::handle& obj, const char* what, int64_t min_value) {
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

// A NumPy view of `n` int32 values owned by `owner` (kept alive by the view): no copy.
template <class T>
py::array_t<T> view(const T* data, size_t n, py::handle owner) {
  return py::array_t<T>({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(sizeof(T))}, data, owner);
}

py::list id_list(const std::vector<RequestId>& ids) {
  py::list out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = py::str(*ids[i]);
  return out;
}

py::bytes hash_bytes(const BlockHash& h) {
  return py::bytes(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
}

BlockHash hash_from_bytes(const py::bytes& b) {
  std::string s = b;
  CORELLM_CHECK_ARG(s.size() == 32, "a block hash is 32 bytes, got ", s.size());
  BlockHash h;
  std::memcpy(h.bytes.data(), s.data(), 32);
  return h;
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
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "corellm native core: scheduler, KV block pool, prefix-cache hashing, batch builder, CPU kernels";
  bind_kernels(m);

  py::enum_<RequestStatus>(m, "RequestStatus")
      .value("WAITING", RequestStatus::WAITING)
      .value("RUNNING", RequestStatus::RUNNING)
      .value("PREEMPTED", RequestStatus::PREEMPTED)
      .value("FINISHED_STOPPED", RequestStatus::FINISHED_STOPPED)
      .value("FINISHED_LENGTH_CAPPED", RequestStatus::FINISHED_LENGTH_CAPPED)
      .value("FINISHED_ABORTED", RequestStatus::FINISHED_ABORTED)
      .value("FINISHED_ERROR", RequestStatus::FINISHED_ERROR);

  py::enum_<FinishReason>(m, "FinishReason")
      .value("NONE", FinishReason::NONE)
      .value("STOP", FinishReason::STOP)
      .value("LENGTH", FinishReason::LENGTH)
      .value("ABORT", FinishReason::ABORT)
      .value("ERROR", FinishReason::ERROR)
      .def("__str__", [](FinishReason r) { return std::string(to_string(r)); });
  // The names the API reports (OpenAI's finish_reason), indexed by FinishReason value: None for
  // NONE (not finished). The one mapping; SchedulerUpdate.finish_reasons index it.
  py::list finish_reason_names;
  for (auto r : {FinishReason::NONE, FinishReason::STOP, FinishReason::LENGTH, FinishReason::ABORT,
                 FinishReason::ERROR}) {
    finish_reason_names.append(r == FinishReason::NONE ? py::object(py::none()) : py::str(to_string(r)));
  }
  m.attr("FINISH_REASON_NAMES") = py::tuple(finish_reason_names);

  py::enum_<SchedulingPolicy>(m, "SchedulingPolicy")
      .value("FCFS", SchedulingPolicy::FCFS)
      .value("PRIORITY", SchedulingPolicy::PRIORITY);

  // ---------------------------------------------------------------- prefix hashing
  py::class_<PrefixHasher, std::shared_ptr<PrefixHasher>>(m, "PrefixHasher")
      .def(py::init<>())
      .def(py::init([](const py::bytes& root) { return std::make_shared<PrefixHasher>(hash_from_bytes(root)); }),
           py::arg("root"))
      .def_property_readonly("root", [](const PrefixHasher& h) { return hash_bytes(h.root()); })
      .def("hash_block",
           [](const PrefixHasher& h, const py::bytes& parent, const py::object& tokens, const std::string& extra) {
             auto ids = to_int32_vector(tokens, "token_ids", std::numeric_limits<int32_t>::min());
             return hash_bytes(h.hash_block(hash_from_bytes(parent), ids.data(), ids.size(), extra));
           },
           py::arg("parent"), py::arg("token_ids"), py::arg("extra_keys") = "");

  // ---------------------------------------------------------------- block pool
  py::class_<BlockPool>(m, "BlockPool")
      .def(py::init<int32_t, bool>(), py::arg("num_blocks"), py::arg("enable_caching") = true)
      .def_property_readonly("num_blocks", &BlockPool::num_blocks)
      .def_property_readonly("num_free_blocks", &BlockPool::num_free_blocks)
      .def_property_readonly("usage", &BlockPool::usage)
      .def("get_new_blocks",
           [](BlockPool& p, int32_t n) -> py::object {
             CORELLM_CHECK_ARG(n >= 0, "n must be >= 0, got ", n);
             std::vector<int32_t> out;
             if (!p.get_new_blocks(n, out)) return py::none();
             return py::cast(out);
           },
           py::arg("n"), "n fresh blocks (ref count 1), or None when fewer are free")
      .def("touch", [](BlockPool& p, const py::object& ids) {
             auto v = to_int32_vector(ids, "block_ids", 0);
             for (int32_t id : v) p.block(id);  // range check
             p.touch(v.data(), v.size()); })
      .def("free_blocks", [](BlockPool& p, const py::object& ids) {
             auto v = to_int32_vector(ids, "block_ids", 0);
             for (int32_t id : v) CORELLM_CHECK_ARG(p.block(id).ref_cnt > 0, "block ", id, " is not in use");
             p.free_blocks(v.data(), v.size()); })
      .def("cache_block", [](BlockPool& p, int32_t id, const py::bytes& h) {
             CORELLM_CHECK_ARG(p.block(id).ref_cnt > 0, "block ", id, " is not in use");
             p.cache_block(id, hash_from_bytes(h)); })
      .def("get_cached_block", [](const BlockPool& p, const py::bytes& h) { return p.get_cached_block(hash_from_bytes(h)); })
      .def("ref_cnt", [](const BlockPool& p, int32_t id) { return p.block(id).ref_cnt; })
      .def("reset_prefix_cache", &BlockPool::reset_prefix_cache)
      .def("check_integrity", [](const BlockPool& p) { p.check_integrity({}); });

  // ---------------------------------------------------------------- scheduler config and output
  py::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(py::init([](int32_t max_num_seqs, int32_t max_num_batched_tokens, int32_t max_model_len,
                       int32_t block_size, int32_t num_blocks, int32_t long_prefill_token_threshold,
                       bool enable_prefix_caching, bool enable_chunked_prefill, SchedulingPolicy scheduling_policy) {
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
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("max_num_seqs") = 256, py::arg("max_num_batched_tokens") = 2048,
           py::arg("max_model_len") = 2048, py::arg("block_size") = 16, py::arg("num_blocks"),
           py::arg("long_prefill_token_threshold") = 0, py::arg("enable_prefix_caching") = true,
           py::arg("enable_chunked_prefill") = true, py::arg("scheduling_policy") = SchedulingPolicy::FCFS)
      .def_readonly("max_num_seqs", &SchedulerConfig::max_num_seqs)
      .def_readonly("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
      .def_readonly("max_model_len", &SchedulerConfig::max_model_len)
      .def_readonly("block_size", &SchedulerConfig::block_size)
      .def_readonly("num_blocks", &SchedulerConfig::num_blocks)
      .def_readonly("long_prefill_token_threshold", &SchedulerConfig::long_prefill_token_threshold)
      .def_readonly("enable_prefix_caching", &SchedulerConfig::enable_prefix_caching)
      .def_readonly("enable_chunked_prefill", &SchedulerConfig::enable_chunked_prefill)
      .def_readonly("scheduling_policy", &SchedulerConfig::scheduling_policy);

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

  py::class_<SchedulerUpdate>(m, "SchedulerUpdate")
      .def_readonly("step_id", &SchedulerUpdate::step_id)
      .def_property_readonly("req_ids", [](const SchedulerUpdate& o) { return id_list(o.req_ids); })
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
      .def("__len__", &SchedulerUpdate::size);

  // ---------------------------------------------------------------- scheduler
  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init([](const SchedulerConfig& config, std::shared_ptr<PrefixHasher> hasher) {
             return std::make_unique<Scheduler>(config, std::move(hasher));
           }),
           py::arg("config"), py::arg("hasher") = nullptr)
      .def_property_readonly("config", &Scheduler::config)
      .def("add_request",
           [](Scheduler& s, std::string request_id, const py::object& prompt_token_ids, int32_t max_tokens,
              int32_t min_tokens, bool ignore_eos, int32_t eos_token_id, const py::object& stop_token_ids,
              int32_t priority, double arrival_time, std::string cache_salt, py::object payload) {
             EngineCoreRequest request;
             request.request_id = std::move(request_id);
             request.prompt_token_ids = to_int32_vector(prompt_token_ids, "prompt_token_ids", 0);
             request.max_tokens = max_tokens;
             request.min_tokens = min_tokens;
             request.ignore_eos = ignore_eos;
             request.eos_token_id = eos_token_id;
             request.stop_token_ids = to_int32_vector(stop_token_ids, "stop_token_ids", 0);
             request.priority = priority;
             request.arrival_time = arrival_time;
             request.cache_salt = std::move(cache_salt);
             if (!payload.is_none()) request.payload = std::make_shared<PyPayload>(std::move(payload));
             s.add_request(std::move(request));
           },
           py::arg("request_id"), py::arg("prompt_token_ids"), py::kw_only(), py::arg("max_tokens"),
           py::arg("min_tokens") = 0, py::arg("ignore_eos") = false, py::arg("eos_token_id") = -1,
           py::arg("stop_token_ids") = py::tuple(), py::arg("priority") = 0,
           py::arg("arrival_time") = 0.0, py::arg("cache_salt") = "", py::arg("payload") = py::none())
      .def("schedule", &Scheduler::schedule, py::call_guard<py::gil_scoped_release>())
      .def("update_from_output",
           [](Scheduler& s, const SchedulerOutput& output, const py::object& sampled) {
             auto ids = to_int32_vector(sampled, "sampled_token_ids", -1);
             py::gil_scoped_release release;
             return s.update_from_output(output, ids.data(), ids.size());
           },
           py::arg("scheduler_output"), py::arg("sampled_token_ids"))
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

  // ---------------------------------------------------------------- batch builder
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
             auto ids = to_int32_vector(sampled, "sampled_token_ids", -1);
             py::gil_scoped_release release;
             b.record_sampled(output, ids.data(), ids.size());
           })
      .def_property_readonly("num_tokens", &BatchBuilder::num_tokens)
      .def_property_readonly("num_reqs", &BatchBuilder::num_reqs)
      .def_property_readonly("max_query_len", &BatchBuilder::max_query_len)
      .def_property_readonly("max_seq_len", &BatchBuilder::max_seq_len)
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
        return view(b.logits_indices(), static_cast<size_t>(b.num_reqs()), self); })
      .def_property_readonly("block_table", [](py::object self) {
        auto& b = self.cast<BatchBuilder&>();
        const auto width = static_cast<py::ssize_t>(b.max_num_blocks_per_req());
        return py::array_t<int32_t>({static_cast<py::ssize_t>(b.num_reqs()), width},
                                    {width * static_cast<py::ssize_t>(sizeof(int32_t)), static_cast<py::ssize_t>(sizeof(int32_t))},
                                    b.block_table(), self); })
      .def("row_token_ids", &BatchBuilder::row_token_ids)
      .def("row_block_ids", &BatchBuilder::row_block_ids);
}
