// Authorization of every RPC a Fulcrum process serves, failing closed.
//
// One table maps each method ("/fulcrum.v1.JobService/SubmitJob") to the
// callers allowed to call it. StartGrpcServer (common/rpc.h) serves every
// service through a gate built from the table: a method without an entry
// cannot be served at all (start-up fails), and a call from a caller the
// entry does not allow is answered UNAUTHENTICATED (no credential of an
// allowed kind) or PERMISSION_DENIED (a wrong one) before any handler code
// runs. Handlers hold no authorization logic of their own.
//
// The callers, by the credential they present (common/rpc_security.h):
//  - kAnyone: every caller (health and reflection);
//  - kJobClient: `authorization: Bearer TOKEN` matching the scheduler's
//    --token-file (every caller when the scheduler has none);
//  - kClusterMember: `x-fulcrum-cluster-token` matching --cluster-token-file
//    (every caller when the process has none).
// With mTLS on, every caller also needs a certificate signed by the CA; that
// is checked by the transport before any of this.
#ifndef FULCRUM_COMMON_AUTHORIZATION_H_
#define FULCRUM_COMMON_AUTHORIZATION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/rpc_security.h"

namespace fulcrum {

// Full method name -> the CallerKind bits allowed to call it.
const std::map<std::string, uint32_t>& AuthorizationTable();

// The verdict for one call of `method` with the caller's request metadata:
// OK, UNAUTHENTICATED, PERMISSION_DENIED (also for a method the table lacks).
absl::Status AuthorizeCall(absl::string_view method,
                           const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

// Serves `service` (one of fulcrum.v1's, named by its full proto name)
// through the gate: each method runs only for the callers the table allows;
// a request that does not parse is answered INVALID_ARGUMENT naming the
// message type. `service` must outlive the returned one, which is what gets
// registered with the server. FAILED_PRECONDITION when a method of the
// service has no table entry or cannot be gated (async methods).
absl::StatusOr<std::unique_ptr<grpc::Service>> GateService(grpc::Service* service,
                                                            const std::string& service_name);

// The server interceptor that completes the gate for callback-API methods:
// gRPC answers a callback call refused before its handler UNIMPLEMENTED, so
// the gate records its verdict in the call's trailing metadata and this
// interceptor sends that status instead (and strips the record).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewGateStatusInterceptorFactory();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_AUTHORIZATION_H_
