// The three levels of checks used throughout the core: user input, internal invariants, debug-only.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace corellm {

// Bad input from a caller (a configuration value, a request, an array). Maps to Python ValueError.
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A broken internal invariant: a bug in corellm, never the caller's fault. Maps to RuntimeError.
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

}  // namespace corellm

// Level 1: user input, always checked, the message says what was wrong and with which value.
#define CORELLM_CHECK_ARG(cond, ...)                                         \
  do {                                                                       \
    if (!(cond)) throw ::corellm::InvalidArgument(::corellm::concat(__VA_ARGS__)); \
  } while (0)

// Level 2: internal invariant, always checked (cheap checks only), reported as a bug.
#define CORELLM_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw ::corellm::InternalError(::corellm::concat("corellm bug at ", __FILE__, ":", \
                                                       __LINE__, ": (" #cond ") ",        \
                                                       __VA_ARGS__));                     \
  } while (0)

// Level 3: debug-only (expensive or hot-path) invariant, compiled out of release builds.
#ifdef NDEBUG
#define CORELLM_DCHECK(cond, ...) \
  do {                            \
  } while (0)
#else
#define CORELLM_DCHECK(cond, ...) CORELLM_CHECK(cond, __VA_ARGS__)
#endif
