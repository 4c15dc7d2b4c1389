// gRPC edge helpers: the one place absl::Status <-> grpc::Status is translated,
// and the server boilerplate every process shares (health, reflection, port 0).
#ifndef FULCRUM_COMMON_RPC_H_
#define FULCRUM_COMMON_RPC_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/call_watch.h"
#include "fulcrum/v1/cluster.grpc.pb.h"
#include "fulcrum/v1/job.grpc.pb.h"
#include "fulcrum/v1/parameter.grpc.pb.h"

namespace fulcrum {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Largest message any Fulcrum process accepts or sends. Payloads are split
// into chunks well below it; anything bigger is rejected by gRPC with
// RESOURCE_EXHAUSTED before it reaches our code.
constexpr int kMaxMessageBytes = 8 << 20;

// How a RESOURCE_EXHAUSTED answer of a server that is busy, not out of a
// budget, begins: the caller may send the request again after a backoff
// (a Pull or SparsePull past ParameterServiceImpl::kMaxPullBytesInFlight, a
// push whose backup was busy).
constexpr char kServerBusy[] = "server busy";
// gRPC's own refusal of a call when the server's threads are all taken
// (ServerLimits::max_threads): busy too.
constexpr char kGrpcThreadsExhausted[] = "Server Threadpool Exhausted";
// Whether `status` is one of these refusals.
bool IsServerBusy(const absl::Status& status);
// What a caller that sent a refused request again until its deadline
// answers when the server was still busy then: DEADLINE_EXCEEDED with the
// refusal's message, a slow step to the training loops (never a failure of
// the job's data, as RESOURCE_EXHAUSTED is).
absl::Status BusyUntilTheDeadline(const absl::Status& refusal);
// How long a caller waits before it sends a busy server's refusals again:
// kFirstBusyBackoff, doubled each time up to kMaxBusyBackoff.
constexpr absl::Duration kFirstBusyBackoff = absl::Milliseconds(2);
constexpr absl::Duration kMaxBusyBackoff = absl::Milliseconds(200);
// The waits of one caller that sends a busy server's refusals again: each
// up to half as long again at random, so that callers refused together do
// not all come back together.
class BusyBackoff {
 public:
  // The next wait, and doubles the one after.
  absl::Duration Next();
  // Sleeps the next wait and returns true, or returns false at once when
  // that wait would end at or past `deadline`.
  bool WaitBefore(absl::Time deadline);

 private:
  absl::Duration base_ = kFirstBusyBackoff;
};
// Largest whole state of one chunk (values, optimizer slots, BSP buffers and
// previous values) a server takes: CopyChunk and ReadCheckpoint send it as
// one message, with room left for the watermarks and framing. The scheduler
// cuts a job's chunks small enough (ChunkElemsFor).
constexpr int64_t kMaxChunkStateBytes = 7 << 20;

// A fulcrum.v1 service to serve, with its full proto name (the
// authorization gate looks its methods up in the table by it).
struct ServedService {
  ServedService(v1::JobService::Service* s) : service(s), name(v1::JobService::service_full_name()) {}  // NOLINT
  ServedService(v1::ClusterService::Service* s)  // NOLINT
      : service(s), name(v1::ClusterService::service_full_name()) {}
  ServedService(v1::ParameterService::Service* s)  // NOLINT
      : service(s), name(v1::ParameterService::service_full_name()) {}
  grpc::Service* service;
  std::string name;
};

// What one server lets its callers claim of gRPC itself.
struct ServerLimits {
  // Threads of gRPC's sync API, each held by one call in progress (a
  // "streamed unary" method's from the moment its call starts, before its
  // request has arrived: Push, Replicate, SparsePush, SparseReplicate).
  // Past it a call is refused at once, RESOURCE_EXHAUSTED
  // kGrpcThreadsExhausted, which callers of the data path send again as
  // busy. Without it, calls that never send their request each held a
  // thread until their deadline, which a caller need not set.
  int max_threads = 1024;
  // Calls open at once on one connection (HTTP/2 streams); a client's
  // further calls wait for one to end.
  int max_streams_per_connection = 1024;
  // gRPC reflection's streams open at once (each a sync call that holds a
  // thread while it waits for its next request, open to anyone): one past
  // them is cancelled at once.
  int max_reflection_streams = 8;
  // How long an answer may take to be sent once its call's status is (a
  // unary call's answer goes with it): past it the call is cancelled
  // (CallWatch). A caller that does not read its answers (a one-byte
  // HTTP/2 window is enough) otherwise held a sync call's thread, or a
  // pull's bytes, until a deadline it need not set, and the threads' bound
  // with them: every sync call of the server refused, heartbeats and work
  // reports included. Reflection's own replies before its status are not
  // watched: its bound (above) is all that holds them.
  absl::Duration answer_wait = CallWatch::kDefaultAnswerWait;
};

struct RunningServer {
  // The gated services (common/authorization.h) the server serves; they
  // must outlive it, so they are declared first (destroyed last).
  std::vector<std::unique_ptr<grpc::Service>> gated;
  // Cancels the calls whose answers are not read within limits.answer_wait.
  std::shared_ptr<CallWatch> answers;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

class MetricsEndpoint;

// fulcrum_grpc_calls_cancelled_total{waiting_for}: the calls a server's
// CallWatch for `waiting_for` ("answer", "request") cancelled.
prometheus::Counter& CallsCancelled(prometheus::Registry* registry, const std::string& waiting_for);

// Builds and starts a gRPC server on host:port (port 0 picks a free one)
// serving `services` through the authorization gate (common/authorization.h),
// grpc.health.v1.Health (SERVING) and reflection. With
// `metrics`, every RPC is counted and timed into its registry
// (grpc_server_*, see common/grpc_metrics.h). It uses the process's
// transport security (common/rpc_security.h) unless `plaintext` (a health
// port for probes when TLS is on), and holds its callers to `limits`.
absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<ServedService>& services,
                                              MetricsEndpoint* metrics = nullptr, bool plaintext = false,
                                              const ServerLimits& limits = ServerLimits());

// A channel with Fulcrum's message limits, the process's transport security
// and its credentials on every call.

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets a deadline `seconds` from now on `context`.
void SetDeadline(grpc::ClientContext* context, double seconds);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_RPC_H_
