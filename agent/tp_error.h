// The one adapter from TensorPipe's errors to absl::Status.
//
// Every failure TensorPipe reports on a pipe, listener or context (a closed connection, EOF, a
// system call's errno, a closed context) means the bytes did not get through: UNAVAILABLE, the
// code a caller may retry on. A LogicError (TensorPipe caught a misuse) is INTERNAL.
//
// Thread safety: stateless.

#ifndef TPD_AGENT_TP_ERROR_H_
#define TPD_AGENT_TP_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tensorpipe {
class Error;
}  // namespace tensorpipe

namespace tpd::agent {

// OK for no error; else "<what>: <TensorPipe's description>" with the code above, e.g.
// UNAVAILABLE "pipe to node-b (uv://10.0.0.2:29500) failed: eof".
absl::Status TensorPipeErrorToStatus(const tensorpipe::Error& error, absl::string_view what);

}  // namespace tpd::agent

#endif  // TPD_AGENT_TP_ERROR_H_
