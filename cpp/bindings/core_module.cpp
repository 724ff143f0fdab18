// corellm._core: the pybind11 module of the native core. Each part is bound in its own file (the
// glue.h list); this file makes the module and binds the enums every part uses.
#include <pybind11/pybind11.h>

#include "corellm/request.h"
#include "glue.h"

namespace py = pybind11;
using namespace corellm;

PYBIND11_MODULE(_core, m) {
  m.doc() = "corellm native core: scheduler, KV block pool, prefix-cache hashing, batch builder, CPU kernels, "
            "the native decoder stack, the shared-memory broadcast and all-reduce of tensor-parallel ranks";
  py::enum_<RequestStatus>(m, "RequestStatus")
      .value("WAITING", RequestStatus::WAITING)
      .value("RUNNING", RequestStatus::RUNNING)
      .value("PREEMPTED", RequestStatus::PREEMPTED)
      .value("FINISHED_STOPPED", RequestStatus::FINISHED_STOPPED)
      .value("FINISHED_LENGTH_CAPPED", RequestStatus::FINISHED_LENGTH_CAPPED)
      .value("FINISHED_ABORTED", RequestStatus::FINISHED_ABORTED)
      .value("FINISHED_ERROR", RequestStatus::FINISHED_ERROR)
      .value("FINISHED_REPETITION", RequestStatus::FINISHED_REPETITION);

  py::enum_<FinishReason>(m, "FinishReason")
      .value("NONE", FinishReason::NONE)
      .value("STOP", FinishReason::STOP)
      .value("LENGTH", FinishReason::LENGTH)
      .value("ABORT", FinishReason::ABORT)
      .value("ERROR", FinishReason::ERROR)
      .value("REPETITION", FinishReason::REPETITION)
      .def("__str__", [](FinishReason r) { return std::string(to_string(r)); });
  // The names the API reports (OpenAI's finish_reason), indexed by FinishReason value: None for
  // NONE (not finished). The one mapping; SchedulerUpdate.finish_reasons index it.
  py::list finish_reason_names;
  for (auto r : {FinishReason::NONE, FinishReason::STOP, FinishReason::LENGTH, FinishReason::ABORT,
                 FinishReason::ERROR, FinishReason::REPETITION}) {
    finish_reason_names.append(r == FinishReason::NONE ? py::object(py::none()) : py::str(to_string(r)));
  }
  m.attr("FINISH_REASON_NAMES") = py::tuple(finish_reason_names);

  py::enum_<SchedulingPolicy>(m, "SchedulingPolicy")
      .value("FCFS", SchedulingPolicy::FCFS)
      .value("PRIORITY", SchedulingPolicy::PRIORITY);

  binding::bind_prefix_cache(m);
  binding::bind_scheduler(m);
  binding::bind_batch_builder(m);
  binding::bind_kernels(m);
  binding::bind_model(m);
  binding::bind_shm_broadcast(m);
  binding::bind_shm_all_reduce(m);
}
