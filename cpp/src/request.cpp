// Request status names and the status -> finish reason mapping.
#include "corellm/request.h"

namespace corellm {

FinishReason finish_reason_of(RequestStatus status) {
  switch (status) {
    case RequestStatus::FINISHED_STOPPED: return FinishReason::STOP;
    case RequestStatus::FINISHED_LENGTH_CAPPED: return FinishReason::LENGTH;
    case RequestStatus::FINISHED_ABORTED: return FinishReason::ABORT;
    case RequestStatus::FINISHED_ERROR: return FinishReason::ERROR;
    case RequestStatus::FINISHED_REPETITION: return FinishReason::REPETITION;
    default: return FinishReason::NONE;
  }
}

const char* to_string(RequestStatus status) {
  switch (status) {
    case RequestStatus::WAITING: return "WAITING";
    case RequestStatus::RUNNING: return "RUNNING";
    case RequestStatus::PREEMPTED: return "PREEMPTED";
    case RequestStatus::FINISHED_STOPPED: return "FINISHED_STOPPED";
    case RequestStatus::FINISHED_LENGTH_CAPPED: return "FINISHED_LENGTH_CAPPED";
    case RequestStatus::FINISHED_ABORTED: return "FINISHED_ABORTED";
    case RequestStatus::FINISHED_ERROR: return "FINISHED_ERROR";
    case RequestStatus::FINISHED_REPETITION: return "FINISHED_REPETITION";
  }
  return "?";
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::NONE: return "none";
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::ABORT: return "abort";
    case FinishReason::ERROR: return "error";
    case FinishReason::REPETITION: return "repetition";
  }
  return "?";
}

}  // namespace corellm
