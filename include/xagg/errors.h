// Errors of libxagg and of the baselines' clients, also thrown by the socket
// helpers they share (src/common/inet.h).
#pragma once

#include <stdexcept>

namespace xagg {

// Bad configuration or a refused join.
struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// Transport failures and errors reported by the aggregator.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A deadline that passed: a connection or join, or an operation, whose
// message names the job, the operation (counted from 0 in call order), the
// chunks still missing and the ranks the aggregator still waits for. The job is unusable after it:
// the ranks may no longer agree on its chunks' tags and remembered exponents
// (docs/protocol.md section 4), so every later operation fails with CommError.
struct TimeoutError : CommError {
  using CommError::CommError;
};

}  // namespace xagg
