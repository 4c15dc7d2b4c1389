// fulcrum-bench: dense push + pull throughput over loopback gRPC against the
// ceiling of the same bytes over one plain loopback TCP connection, and the
// round trip of a small push, measured side by side in one run.
//
// Every measurement runs in a process of its own (this binary started again
// with --case), so that no case inherits another's allocator state, caches
// or thread pools, and the cases alternate: batch b runs them all, starting
// at a different one each batch. Per case the table gives min / median / max
// over the batches and the CPU time (every thread of the process: client,
// servers, the TCP echo peer) per GB moved.
//
// One Fulcrum iteration pushes a full gradient (ASP, applied by SGD on the
// servers) and pulls the full model back through the worker's
// ParameterClient, the N parameter servers running in the case's process on
// 127.0.0.1 (real gRPC over TCP). The TCP case sends the same bytes to an
// echo thread over one connection and reads them back. GB/s counts the bytes
// moved: 2 x model size per iteration. The in-process case runs the same
// iterations through InProcessTransport (the same request bytes handed to the
// services without gRPC or sockets): its CPU per GB is what Fulcrum's own
// code costs (encoding, decoding, validation, the optimizer, reads and
// copies), and the difference to the gRPC case is what the transport costs.
// The gRPC-alone case moves the same bytes in the same requests through gRPC
// with none of Fulcrum's code (RunGrpcFloor): the floor of any data plane
// built on gRPC here.
//
//   fulcrum-bench [--sizes=1,16,64] [--servers=1,2] [--batches=5]
//                 [--seconds=1.5] [--rtt_pushes=3000] [--pin_rtt=0]
#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/memory_budget.h"
#include "common/metrics.h"
#include "common/param_init.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "common/slice_loan.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "server/parameter_service.h"
#include "worker/in_process_transport.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"

ABSL_FLAG(std::vector<std::string>, sizes, std::vector<std::string>({"1", "16", "64"}), "Model sizes in MiB");
ABSL_FLAG(std::vector<std::string>, servers, std::vector<std::string>({"1", "2"}), "Server counts");
ABSL_FLAG(int, batches, 5, "Times every case runs (alternating)");
// Daemon's flag (common/daemon.cc): on runs the cases with Abseil's
// lock-order checks, as Debian's Abseil does by default (common/sync.h).
ABSL_DECLARE_FLAG(bool, mutex_deadlock_detection);
ABSL_FLAG(double, seconds, 1.5, "Timed seconds per case and batch (after one warm-up iteration)");
ABSL_FLAG(int, rtt_pushes, 3000, "Small pushes timed one by one for the round-trip case (0: no such case)");
ABSL_FLAG(int, pin_rtt, 0, "CPU the round-trip case's process is pinned to (-1: not pinned)");
ABSL_FLAG(std::vector<std::string>, sparse, std::vector<std::string>({"10000:64", "100000:16"}),
          "Sparse pull and push cases, KEYS:DIM (distinct keys of rows of DIM floats; empty: none)");
ABSL_FLAG(
    std::vector<std::string>, chunked, std::vector<std::string>({"4096:25"}),
    "Many small chunks, as COUNT:FLOATS (a job cut fine): push + pull of them against the same floats in "
    "one chunk");
ABSL_FLAG(std::string, run_case, "", "Internal: run one case in this process and print its RESULT line");

namespace fulcrum {
namespace {

constexpr int64_t kChunkElems = 65536;  // 256 KiB, the scheduler's default

// CPU seconds of every thread of this process so far.
double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

struct ServerProcess {
  std::unique_ptr<MetricsEndpoint> metrics;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<ParameterServiceImpl> service;
  RunningServer running;
};

// N in-process parameter servers holding one ASP job of `elements` floats
// and, with `table_dim` > 0, a sparse table "embedding" of rows of that many
// floats (Adagrad), 8 buckets a server.
class Fleet {
 public:
  // `chunk_elems`: the floats a chunk holds (the last one may hold fewer).
  Fleet(int servers, int64_t elements, int32_t table_dim = 0, int64_t chunk_elems = kChunkElems) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < servers; ++i) {
      auto server = std::make_unique<ServerProcess>();
      server->metrics = std::move(MetricsEndpoint::Start("127.0.0.1", 0).value());
      server->store = std::make_unique<ParameterStore>();
      server->service = std::make_unique<ParameterServiceImpl>(server->store.get(), server->metrics.get());
      server->running = std::move(StartGrpcServer("127.0.0.1", 0, {server->service.get()}).value());
      servers_.push_back(std::move(server));
      ids.push_back(SplitMix64(i + 1));
    }
    auto chunks = CutIntoChunks({elements}, std::min(chunk_elems, elements));
    auto shard_of = AssignChunksToShards(chunks, servers);
    auto placement = BalancedShardPlacement(servers, ids);
    map_.set_chunk_elems(chunk_elems);
    auto* tensor = map_.add_tensors();
    tensor->set_name("weights");
    tensor->add_shape(elements);
    tensor->set_size(elements);
    std::vector<JobShardConfig> configs(servers);
    for (int s = 0; s < servers; ++s) {
      auto* shard = map_.add_shards();
      shard->set_shard(s);
      shard->set_address(absl::StrCat("127.0.0.1:", servers_[placement[s]]->running.port));
      configs[placement[s]].job_id = "bench";
      configs[placement[s]].synchronous = false;
      configs[placement[s]].lr = 1e-6f;
      configs[placement[s]].num_partitions = 1;
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto* chunk = map_.add_chunks();
      chunk->set_chunk_id(static_cast<int32_t>(i));
      chunk->set_offset(chunks[i].offset);
      chunk->set_length(chunks[i].length);
      chunk->set_shard(shard_of[i]);
      ChunkConfig config;
      config.chunk_id = static_cast<int32_t>(i);
      config.offset = chunks[i].offset;
      config.length = chunks[i].length;
      configs[placement[shard_of[i]]].chunks.push_back(config);
    }
    if (table_dim > 0) AddTable(table_dim, servers, placement, &configs);
    for (int s = 0; s < servers; ++s) {
      if (!configs[s].chunks.empty() || !configs[s].tables.empty()) (void)servers_[s]->store->SetupJob(configs[s]);
    }
  }
  ~Fleet() {
    for (auto& s : servers_) s->running.server->Shutdown();
  }
  const v1::ShardMap& map() const { return map_; }

  void AddTable(int32_t dim, int servers, const std::vector<size_t>& placement, std::vector<JobShardConfig>* configs) {
    SparseTableSetup setup;
    setup.config.name = "embedding";
    setup.config.dim = dim;
    setup.config.optimizer.kind = SparseOptimizerKind::kAdagrad;
    setup.config.init = InitKind::kUniform;
    setup.config.init_scale = 0.01f;
    setup.bucket_shards = AssignBucketsToShards(8 * servers, servers);
    v1::TableLayout* table = map_.add_tables();
    table->set_name("embedding");
    table->set_dim(dim);
    table->set_buckets(8 * servers);
    for (int32_t shard : setup.bucket_shards) table->add_bucket_shards(shard);
    for (int s = 0; s < servers; ++s) {
      JobShardConfig& config = (*configs)[placement[s]];
      config.tables = {setup};
      config.table_shards.insert(s);
    }
  }
  // Makes `transport` hand each server's calls to its service directly.
  void Serve(InProcessTransport* transport) {
    for (const auto& server : servers_) {
      transport->Serve(absl::StrCat("127.0.0.1:", server->running.port), server->service.get());
    }
  }

 private:
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  v1::ShardMap map_;
};

// A throughput case's outcome: bytes moved, wall and CPU seconds.
struct Moved {
  int64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;
};

// Runs `iteration` (moving `bytes_per_iteration`) once to warm up, then for
// at least `seconds` and 3 iterations.
template <typename Iteration>
absl::StatusOr<Moved> TimeIterations(int64_t bytes_per_iteration, Iteration iteration) {
  if (absl::Status warm = iteration(); !warm.ok()) return warm;
  const double seconds = absl::GetFlag(FLAGS_seconds);
  Moved moved;
  const double cpu_start = CpuSeconds();
  const absl::Time start = absl::Now();
  int64_t iterations = 0;
  while (iterations < 3 || absl::ToDoubleSeconds(absl::Now() - start) < seconds) {
    if (absl::Status status = iteration(); !status.ok()) return status;
    ++iterations;
  }
  moved.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  moved.cpu_seconds = CpuSeconds() - cpu_start;
  moved.bytes = iterations * bytes_per_iteration;
  return moved;
}

// `what`: "fulcrum" (push then pull), "push" or "pull" (one of them only),
// or "inproc" (push then pull without gRPC); the model cut into chunks of
// `chunk_elems` floats.
absl::StatusOr<Moved> RunFulcrum(const std::string& what, int64_t bytes, int servers,
                                 int64_t chunk_elems = kChunkElems) {
  Fleet fleet(servers, bytes / 4, /*table_dim=*/0, chunk_elems);
  InProcessTransport in_process;
  fleet.Serve(&in_process);
  ParameterClient client(fleet.map(), "bench", "bench-worker", nullptr, v1::WIRE_FP32,
                         what == "inproc" ? &in_process : nullptr);
  auto grads = client.MakeBuffers();
  for (auto& g : grads) std::fill(g.begin(), g.end(), 1e-3f);
  auto params = client.MakeBuffers();
  std::vector<int> tensors(grads.size());
  std::iota(tensors.begin(), tensors.end(), 0);
  SliceLoan loan;  // pushes lend the gradients to gRPC, as the trainer's do
  int64_t seq = 0;
  const bool both = what == "fulcrum" || what == "inproc";
  return TimeIterations(both ? 2 * bytes : bytes, [&]() -> absl::Status {
    ++seq;
    if (what != "pull") {
      std::unique_ptr<ParameterClient::PushStream> push =
          client.StartPush(seq, 0, seq, absl::Seconds(60), /*examples=*/0, /*examples_digest=*/0, &loan);
      push->Send(tensors, grads);
      RETURN_IF_ERROR(push->Finish());
      push.reset();
      if (!loan.AwaitReturned(absl::Seconds(60))) return absl::DeadlineExceededError("gRPC kept the gradients");
    }
    return what == "push" ? absl::OkStatus() : client.Pull(0, absl::Seconds(60), &params);
  });
}

// The floor of any data plane over gRPC on this machine: the same bytes
// through the same gRPC stack, with none of Fulcrum's code, protobuf or
// copies. A generic callback service on 127.0.0.1 drops what a push brings
// and answers a pull with slices over one prepared buffer; the client sends
// requests of ParameterClient::kMaxBatchBytes all at once over a channel made
// as the worker's are, pushes (from slices over one buffer) and then pulls.
class FloorService final : public grpc::CallbackGenericService {
 public:
  explicit FloorService(int64_t answer_bytes) : answer_(static_cast<size_t>(answer_bytes), 1) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    const bool pull = context->method() == "/floor/Pull";
    grpc::Slice slice(answer_.data(), pull ? answer_.size() : 0, grpc::Slice::STATIC_SLICE);
    return new Exchange(grpc::ByteBuffer(&slice, 1));
  }

 private:
  // One call: reads the request, drops it, writes the answer and finishes.
  class Exchange final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Exchange(grpc::ByteBuffer answer) : answer_(std::move(answer)) { StartRead(&request_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no request"));
      request_.Clear();
      StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer request_;
    grpc::ByteBuffer answer_;
  };

  std::vector<char> answer_;
};

// A FloorService on 127.0.0.1 and a generic stub to it over a channel made
// as the worker's are.
class FloorServer {
 public:
  explicit FloorServer(int64_t answer_bytes) : service_(answer_bytes) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ != nullptr && port_ != 0) {
      stub_ = std::make_unique<grpc::GenericStub>(MakeChannel(absl::StrCat("127.0.0.1:", port_)));
    }
  }
  ~FloorServer() {
    if (server_ != nullptr) server_->Shutdown();
  }
  // Null when the server did not start.
  grpc::GenericStub* stub() { return stub_.get(); }

 private:
  FloorService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

// `calls` requests of `method` at once through `stub`, each carrying
// `request`; waits for all and returns the first failure.
absl::Status ExchangeAll(grpc::GenericStub* stub, const std::string& method, const grpc::ByteBuffer& request,
                         int64_t calls) {
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::ByteBuffer> responses(static_cast<size_t>(calls));
  Mutex mu;
  int64_t pending = calls;
  grpc::Status failed;
  for (int64_t i = 0; i < calls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(contexts.back().get(), 60);
    stub->UnaryCall(contexts.back().get(), method, grpc::StubOptions(), &request, &responses[i],
                    [&](grpc::Status status) {
                      MutexLock lock(&mu);
                      if (!status.ok()) failed = status;
                      --pending;
                    });
  }
  MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &pending));
  return FromGrpcStatus(failed);
}

absl::StatusOr<Moved> RunGrpcFloor(int64_t bytes) {
  const int64_t piece = std::min<int64_t>(bytes, ParameterClient::kMaxBatchBytes);
  const int calls = static_cast<int>((bytes + piece - 1) / piece);
  FloorServer floor(piece);
  grpc::GenericStub* stub = floor.stub();
  if (stub == nullptr) return absl::UnavailableError("cannot listen on loopback");
  std::vector<char> pushed(static_cast<size_t>(piece), 1);
  auto exchange = [&](const std::string& method, const grpc::ByteBuffer& request) {
    return ExchangeAll(stub, method, request, calls);
  };
  grpc::Slice push_slice(pushed.data(), pushed.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer push_request(&push_slice, 1);
  grpc::Slice pull_slice(std::string(16, 'p'));
  const grpc::ByteBuffer pull_request(&pull_slice, 1);
  return TimeIterations(2 * calls * piece, [&]() -> absl::Status {
    RETURN_IF_ERROR(exchange("/floor/Push", push_request));
    return exchange("/floor/Pull", pull_request);
  });
}

// The round trip of a 1 KiB request through gRPC alone (FloorServer), one at
// a time: the floor under Fulcrum's small-push round trip.
absl::StatusOr<std::vector<double>> GrpcRoundTrips(int calls) {
  FloorServer floor(0);
  grpc::GenericStub* stub = floor.stub();
  if (stub == nullptr) return absl::UnavailableError("cannot listen on loopback");
  grpc::Slice slice(std::string(1024, 'g'));
  const grpc::ByteBuffer request(&slice, 1);
  std::vector<double> micros;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    grpc::ByteBuffer response;
    absl::Notification done;
    grpc::Status status;
    stub->UnaryCall(&context, "/floor/Push", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    RETURN_IF_ERROR(FromGrpcStatus(status));
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return micros;
}

bool ReadFull(int fd, char* buffer, int64_t n) {
  while (n > 0) {
    const ssize_t got = read(fd, buffer, static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
    if (got <= 0) return false;
    buffer += got;
    n -= got;
  }
  return true;
}

bool WriteFull(int fd, const char* buffer, int64_t n) {
  while (n > 0) {
    const ssize_t put = write(fd, buffer, static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
    if (put <= 0) return false;
    buffer += put;
    n -= put;
  }
  return true;
}

// Sparse pull or push (`what`: "sparse-pull", "sparse-push") of `keys`
// distinct keys of a table of rows of `dim` floats on `servers` servers,
// over gRPC, as a worker sends them (SparseClient): the keys' rows exist
// (one push creates them first). An iteration moves the keys and their rows.
// With `in_process`, without gRPC: the requests' bytes handed to the
// services (InProcessTransport), so the time is Fulcrum's own code.
absl::StatusOr<Moved> RunSparse(const std::string& what, int64_t keys, int32_t dim, int servers,
                                bool in_process) {
  Fleet fleet(servers, 1024, dim);
  InProcessTransport transport;
  fleet.Serve(&transport);
  SparseClient client(fleet.map(), "bench", "bench-worker", in_process ? &transport : nullptr);
  std::vector<std::vector<uint64_t>> ids(1);
  for (int64_t k = 0; k < keys; ++k) ids[0].push_back(SplitMix64(static_cast<uint64_t>(k) + 77));
  std::vector<std::vector<float>> grads = {std::vector<float>(static_cast<size_t>(keys) * dim, 1e-3f)};
  std::vector<std::vector<float>> rows;
  int64_t step = 0;
  RETURN_IF_ERROR(client.Push(0, step++, ids, grads, absl::Seconds(30)));
  const int64_t bytes = keys * (8 + 4 * int64_t{dim});
  if (what == "sparse-pull") {
    return TimeIterations(bytes, [&] { return client.Pull(ids, &rows, absl::Seconds(30)); });
  }
  return TimeIterations(bytes, [&] { return client.Push(0, step++, ids, grads, absl::Seconds(30)); });
}

// gRPC alone moving `bytes` one way, as a sparse push (`push`) or pull
// sends them: in requests (or answers) of at most
// SparseClient::kMaxRequestBytes, all at once, to a FloorService that drops
// what it gets and answers a pull from a prepared buffer.
absl::StatusOr<Moved> RunGrpcOneWay(int64_t bytes, bool push) {
  const int64_t calls = (bytes + SparseClient::kMaxRequestBytes - 1) / SparseClient::kMaxRequestBytes;
  const int64_t piece = (bytes + calls - 1) / calls;
  FloorServer floor(push ? 0 : piece);
  grpc::GenericStub* stub = floor.stub();
  if (stub == nullptr) return absl::UnavailableError("cannot listen on loopback");
  std::vector<char> pushed(static_cast<size_t>(push ? piece : 16), 1);
  grpc::Slice slice(pushed.data(), pushed.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer request(&slice, 1);
  const std::string method = push ? "/floor/Push" : "/floor/Pull";
  return TimeIterations(calls * piece, [&] { return ExchangeAll(stub, method, request, calls); });
}

// The ceiling: the same bytes to an echo peer over one loopback TCP
// connection and back.
absl::StatusOr<Moved> RunTcp(int64_t bytes) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return absl::UnavailableError("cannot listen on loopback");
  }
  std::thread echo([listener, bytes] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    std::vector<char> buffer(bytes);
    while (ReadFull(fd, buffer.data(), bytes) && WriteFull(fd, buffer.data(), bytes)) {
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    shutdown(listener, SHUT_RDWR);
    echo.join();
    close(listener);
    if (fd >= 0) close(fd);
    return absl::UnavailableError("cannot connect over loopback");
  }
  std::vector<char> out(bytes, 1), in(bytes);
  auto moved = TimeIterations(2 * bytes, [&]() -> absl::Status {
    // A writer thread so that neither side blocks on a full socket buffer.
    bool wrote = false;
    std::thread writer([&] { wrote = WriteFull(fd, out.data(), bytes); });
    const bool read_back = ReadFull(fd, in.data(), bytes);
    writer.join();
    return wrote && read_back ? absl::OkStatus() : absl::UnavailableError("loopback echo broke");
  });
  shutdown(fd, SHUT_RDWR);
  close(fd);
  echo.join();
  close(listener);
  return moved;
}

// Round trips of a small push (one 1 KiB chunk, ASP, one server), one at a
// time, or with `grpc_alone` of a 1 KiB request through gRPC alone:
// microseconds p50 / p99 after a tenth as many to warm up.
absl::StatusOr<std::pair<double, double>> RunRoundTrips(int pushes, bool grpc_alone) {
  std::vector<double> micros;
  if (grpc_alone) {
    ASSIGN_OR_RETURN(micros, GrpcRoundTrips(pushes + pushes / 10));
  } else {
    Fleet fleet(1, 256);
    ParameterClient client(fleet.map(), "bench", "bench-worker");
    auto grads = client.MakeBuffers();
    for (auto& g : grads) std::fill(g.begin(), g.end(), 1e-3f);
    for (int i = 0; i < pushes + pushes / 10; ++i) {
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(client.Push(i + 1, 0, i + 1, grads, absl::Seconds(10)));
      micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
  }
  micros.erase(micros.begin(), micros.begin() + pushes / 10);  // the warm-up
  std::sort(micros.begin(), micros.end());
  return std::make_pair(micros[micros.size() / 2], micros[micros.size() * 99 / 100]);
}

// Runs --run_case in this process: "tcp:<MiB>", "grpc:<MiB>", "fulcrum:<MiB>:<servers>",
// "inproc:<MiB>:<servers>" (also "push:..." and "pull:...", one direction
// only) or "rtt". Prints "RESULT <bytes> <seconds> <cpu seconds>" ("RESULT <p50 us>
// <p99 us>" for rtt).
int RunCase(const std::string& spec) {
  KeepFreedMemoryForReuse();  // as every daemon does (Daemon::Init)
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int64_t mib = 0;
  int servers = 0;
  if (parts[0] == "rtt" || parts[0] == "rtt-grpc") {
    const int cpu = absl::GetFlag(FLAGS_pin_rtt);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0) std::fprintf(stderr, "cannot pin to CPU %d\n", cpu);
    }
    auto rtt = RunRoundTrips(absl::GetFlag(FLAGS_rtt_pushes), parts[0] == "rtt-grpc");
    if (!rtt.ok()) {
      std::fprintf(stderr, "%s\n", rtt.status().ToString().c_str());
      return 1;
    }
    std::printf("RESULT %.3f %.3f\n", rtt->first, rtt->second);
    return 0;
  }
  if (parts[0] == "chunked" || parts[0] == "chunked-whole") {
    int64_t count = 0, floats = 0;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[1], &count) || !absl::SimpleAtoi(parts[2], &floats) ||
        !absl::SimpleAtoi(parts[3], &servers) || count <= 0 || floats <= 0) {
      std::fprintf(stderr, "bad --run_case %s\n", spec.c_str());
      return 2;
    }
    // "chunked": `count` chunks of `floats`; "chunked-whole": the same
    // floats in one chunk.
    auto moved =
        RunFulcrum("fulcrum", 4 * count * floats, servers, parts[0] == "chunked" ? floats : count * floats);
    if (!moved.ok()) {
      std::fprintf(stderr, "%s\n", moved.status().ToString().c_str());
      return 1;
    }
    std::printf("RESULT %lld %.6f %.6f\n", static_cast<long long>(moved->bytes), moved->seconds,
                moved->cpu_seconds);
    return 0;
  }
  if (parts[0] == "sparse-pull" || parts[0] == "sparse-push" || parts[0] == "sparse-pull-inproc" ||
      parts[0] == "sparse-push-inproc" || parts[0] == "tcp-bytes" || parts[0] == "grpc-push" ||
      parts[0] == "grpc-pull") {
    int64_t keys = 0, bytes = 0;
    int32_t dim = 0;
    const bool sparse = absl::StartsWith(parts[0], "sparse-");
    if (sparse ? (parts.size() != 4 || !absl::SimpleAtoi(parts[1], &keys) || !absl::SimpleAtoi(parts[2], &dim) ||
                  !absl::SimpleAtoi(parts[3], &servers))
               : (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &bytes))) {
      std::fprintf(stderr, "bad --run_case %s\n", spec.c_str());
      return 2;
    }
    const bool in_process = absl::EndsWith(parts[0], "-inproc");
    auto moved = sparse ? RunSparse(in_process ? parts[0].substr(0, parts[0].size() - 7) : parts[0], keys,
                                    dim, servers, in_process)
                 : parts[0] == "tcp-bytes" ? RunTcp(bytes)
                                           : RunGrpcOneWay(bytes, parts[0] == "grpc-push");
    if (!moved.ok()) {
      std::fprintf(stderr, "%s\n", moved.status().ToString().c_str());
      return 1;
    }
    std::printf("RESULT %lld %.6f %.6f\n", static_cast<long long>(moved->bytes), moved->seconds, moved->cpu_seconds);
    return 0;
  }
  const bool sizes_only = parts[0] == "tcp" || parts[0] == "grpc";
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &mib) ||
      (!sizes_only && (parts.size() != 3 || !absl::SimpleAtoi(parts[2], &servers)))) {
    std::fprintf(stderr, "bad --run_case %s\n", spec.c_str());
    return 2;
  }
  auto moved = parts[0] == "tcp"    ? RunTcp(mib << 20)
               : parts[0] == "grpc" ? RunGrpcFloor(mib << 20)
                                    : RunFulcrum(parts[0], mib << 20, servers);
  if (!moved.ok()) {
    std::fprintf(stderr, "%s\n", moved.status().ToString().c_str());
    return 1;
  }
  std::printf("RESULT %lld %.6f %.6f\n", static_cast<long long>(moved->bytes), moved->seconds, moved->cpu_seconds);
  return 0;
}

// Starts this binary with --run_case=`spec` and returns the numbers of its
// RESULT line.
absl::StatusOr<std::vector<double>> RunChild(const std::string& self, const std::string& spec) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const std::vector<std::string> args = {
      self,
      absl::StrCat("--run_case=", spec),
      absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds)),
      absl::StrCat("--rtt_pushes=", absl::GetFlag(FLAGS_rtt_pushes)),
      absl::StrCat("--pin_rtt=", absl::GetFlag(FLAGS_pin_rtt)),
      absl::StrCat("--mutex_deadlock_detection=", absl::GetFlag(FLAGS_mutex_deadlock_detection))};
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = read(out[0], buffer, sizeof(buffer))) > 0;) text.append(buffer, static_cast<size_t>(got));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "RESULT ")) continue;
    std::vector<double> numbers;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      double value = 0;
      if (!absl::SimpleAtod(word, &value)) return absl::InternalError(absl::StrCat("bad RESULT line: ", line));
      numbers.push_back(value);
    }
    return numbers;
  }
  return absl::InternalError(absl::StrCat("case ", spec, " printed no result (exit status ", status, ")"));
}

struct Samples {
  std::vector<double> rates;        // GB/s
  std::vector<double> cpu_per_gb;   // CPU seconds per GB moved
  std::vector<double> p50, p99;     // rtt, microseconds
};

double At(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(std::lround(q * static_cast<double>(values.size() - 1)))];
}

std::string MinMedMax(const std::vector<double>& v, int decimals) {
  return absl::StrFormat("%.*f / %.*f / %.*f", decimals, At(v, 0), decimals, At(v, 0.5), decimals, At(v, 1));
}

int Run(const std::string& self) {
  std::vector<std::string> cases;
  std::vector<int64_t> sizes;
  std::vector<int> server_counts;
  for (const std::string& s : absl::GetFlag(FLAGS_sizes)) {
    int64_t mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib <= 0 || mib > 1024) {
      std::fprintf(stderr, "bad --sizes entry %s\n", s.c_str());
      return 2;
    }
    sizes.push_back(mib);
  }
  for (const std::string& s : absl::GetFlag(FLAGS_servers)) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0 || n > 16) {
      std::fprintf(stderr, "bad --servers entry %s\n", s.c_str());
      return 2;
    }
    server_counts.push_back(n);
  }
  for (int64_t mib : sizes) {
    cases.push_back(absl::StrCat("tcp:", mib));
    cases.push_back(absl::StrCat("grpc:", mib));
    for (int n : server_counts) {
      cases.push_back(absl::StrCat("fulcrum:", mib, ":", n));
      cases.push_back(absl::StrCat("inproc:", mib, ":", n));
    }
  }
  if (absl::GetFlag(FLAGS_rtt_pushes) > 0) {
    cases.push_back("rtt");
    cases.push_back("rtt-grpc");
  }
  std::vector<std::pair<int64_t, int32_t>> sparse;  // (keys, dim)
  for (const std::string& s : absl::GetFlag(FLAGS_sparse)) {
    std::vector<std::string> kd = absl::StrSplit(s, ':');
    int64_t keys = 0;
    int32_t dim = 0;
    if (kd.size() != 2 || !absl::SimpleAtoi(kd[0], &keys) || !absl::SimpleAtoi(kd[1], &dim) || keys <= 0 ||
        keys > 10000000 || dim <= 0 || dim > 1024) {
      std::fprintf(stderr, "bad --sparse entry %s\n", s.c_str());
      return 2;
    }
    sparse.emplace_back(keys, dim);
    cases.push_back(absl::StrCat("tcp-bytes:", keys * (8 + 4 * int64_t{dim})));
    cases.push_back(absl::StrCat("grpc-push:", keys * (8 + 4 * int64_t{dim})));
    cases.push_back(absl::StrCat("grpc-pull:", keys * (8 + 4 * int64_t{dim})));
    for (int n : server_counts) {
      for (const char* what : {"sparse-pull", "sparse-push", "sparse-pull-inproc", "sparse-push-inproc"}) {
        cases.push_back(absl::StrCat(what, ":", keys, ":", dim, ":", n));
      }
    }
  }
  std::vector<std::pair<int64_t, int64_t>> chunked;  // (chunks, floats each)
  for (const std::string& s : absl::GetFlag(FLAGS_chunked)) {
    std::vector<std::string> cf = absl::StrSplit(s, ':');
    int64_t count = 0, floats = 0;
    if (cf.size() != 2 || !absl::SimpleAtoi(cf[0], &count) || !absl::SimpleAtoi(cf[1], &floats) ||
        count <= 0 || count > 8192 || floats <= 0 || count * floats > (int64_t{1} << 24)) {
      std::fprintf(stderr, "bad --chunked entry %s (COUNT in [1, 8192], COUNT x FLOATS at most 2^24)\n",
                   s.c_str());
      return 2;
    }
    chunked.emplace_back(count, floats);
    for (int n : server_counts) {
      cases.push_back(absl::StrCat("chunked:", count, ":", floats, ":", n));
      cases.push_back(absl::StrCat("chunked-whole:", count, ":", floats, ":", n));
    }
  }
  std::map<std::string, Samples> samples;
  const int batches = absl::GetFlag(FLAGS_batches);
  for (int b = 0; b < batches; ++b) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const std::string& spec = cases[(k + static_cast<size_t>(b)) % cases.size()];  // rotate: alternate
      auto numbers = RunChild(self, spec);
      if (!numbers.ok()) {
        std::fprintf(stderr, "%s\n", numbers.status().ToString().c_str());
        return 1;
      }
      Samples& s = samples[spec];
      if (absl::StartsWith(spec, "rtt")) {
        s.p50.push_back((*numbers)[0]);
        s.p99.push_back((*numbers)[1]);
      } else {
        const double gb = (*numbers)[0] / 1e9;
        s.rates.push_back(gb / (*numbers)[1]);
        s.cpu_per_gb.push_back((*numbers)[2] / gb);
      }
      std::fprintf(stderr, "batch %d: %s done\n", b + 1, spec.c_str());
    }
  }
  std::printf("\nDense push + pull vs. plain loopback TCP, the same bytes (%d batches, each case in its own process,"
              " alternating; GB/s min / median / max)\n\n",
              batches);
  std::printf("| model | servers | Fulcrum GB/s | TCP GB/s | Fulcrum / TCP (goal >= 0.80) | CPU s/GB Fulcrum | CPU s/GB TCP "
              "| CPU ratio (goal <= 1.5) | CPU s/GB without gRPC | gRPC alone: GB/s, CPU s/GB, CPU ratio |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  int goals_missed = 0;
  for (int64_t mib : sizes) {
    const Samples& tcp = samples[absl::StrCat("tcp:", mib)];
    const Samples& floor = samples[absl::StrCat("grpc:", mib)];
    for (int n : server_counts) {
      const Samples& f = samples[absl::StrCat("fulcrum:", mib, ":", n)];
      const Samples& in_process = samples[absl::StrCat("inproc:", mib, ":", n)];
      const double ratio = At(f.rates, 0.5) / std::max(At(tcp.rates, 0.5), 1e-12);
      const double cpu_ratio = At(f.cpu_per_gb, 0.5) / std::max(At(tcp.cpu_per_gb, 0.5), 1e-12);
      goals_missed += (ratio < 0.8 ? 1 : 0) + (cpu_ratio > 1.5 ? 1 : 0);
      std::printf("| %lld MiB | %d | %s | %s | %.2f %s | %.3f | %.3f | %.2f %s | %.3f | %.2f, %.3f, %.2f |\n",
                  static_cast<long long>(mib), n, MinMedMax(f.rates, 2).c_str(), MinMedMax(tcp.rates, 2).c_str(),
                  ratio, ratio >= 0.8 ? "met" : "missed", At(f.cpu_per_gb, 0.5), At(tcp.cpu_per_gb, 0.5), cpu_ratio,
                  cpu_ratio <= 1.5 ? "met" : "missed", At(in_process.cpu_per_gb, 0.5), At(floor.rates, 0.5),
                  At(floor.cpu_per_gb, 0.5), At(floor.cpu_per_gb, 0.5) / std::max(At(tcp.cpu_per_gb, 0.5), 1e-12));
    }
  }
  if (samples.count("rtt") != 0) {
    const Samples& rtt = samples["rtt"];
    const Samples& grpc_rtt = samples["rtt-grpc"];
    const double p50 = At(rtt.p50, 0.5), p99 = At(rtt.p99, 0.5);
    std::printf("\nSmall push round trip (1 KiB, one server, %d pushes one at a time, %s): p50 %s us, p99 %s us"
                " (medians over batches: p50 %.1f us, goal <= 60 %s; p99 / p50 %.2f, goal <= 2 %s); gRPC alone, "
                "the same 1 KiB requests: p50 %s us, p99 %s us\n",
                absl::GetFlag(FLAGS_rtt_pushes),
                absl::GetFlag(FLAGS_pin_rtt) >= 0 ? absl::StrCat("pinned to CPU ", absl::GetFlag(FLAGS_pin_rtt)).c_str()
                                                  : "not pinned",
                MinMedMax(rtt.p50, 1).c_str(), MinMedMax(rtt.p99, 1).c_str(), p50,
                p50 <= 60 ? "met" : "missed", p99 / std::max(p50, 1e-9), p99 <= 2 * p50 ? "met" : "missed",
                MinMedMax(grpc_rtt.p50, 1).c_str(), MinMedMax(grpc_rtt.p99, 1).c_str());
    goals_missed += (p50 > 60 ? 1 : 0) + (p99 > 2 * p50 ? 1 : 0);
  }
  if (!sparse.empty()) {
    std::printf(
        "\nSparse pull and push over gRPC (SparseClient, keys whose rows exist, Adagrad), against the same "
        "bytes (keys + rows) moved one way over loopback TCP (half an echo's round trip) and through gRPC "
        "alone, in requests as large; in process: the same calls without gRPC (Fulcrum's own time); "
        "milliseconds an operation, min / median / max:\n\n"
        "| keys x floats | servers | pull ms | push ms | in process: pull ms | in process: push ms | gRPC "
        "alone, one way: answers ms | requests ms | TCP, one way ms | pull / TCP | push / TCP | pull / gRPC "
        "alone | push / gRPC alone |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const auto& [keys, dim] : sparse) {
    const double bytes = static_cast<double>(keys * (8 + 4 * int64_t{dim}));
    // Milliseconds an operation from GB/s samples (for the TCP echo, whose
    // rate counts the bytes both ways: the time one way).
    auto ms = [bytes](const std::vector<double>& rates) {
      std::vector<double> out;
      for (double rate : rates) out.push_back(bytes / (rate * 1e9) * 1e3);
      return out;
    };
    const int64_t moved = keys * (8 + 4 * int64_t{dim});
    const std::vector<double> tcp = ms(samples[absl::StrCat("tcp-bytes:", moved)].rates);
    const std::vector<double> grpc_pull = ms(samples[absl::StrCat("grpc-pull:", moved)].rates);
    const std::vector<double> grpc_push = ms(samples[absl::StrCat("grpc-push:", moved)].rates);
    for (int n : server_counts) {
      // (A lambda may not name a structured binding in C++17: the case's
      // name is made here.)
      const std::string of_case = absl::StrCat(":", keys, ":", dim, ":", n);
      auto sparse_ms = [&](const char* what) { return ms(samples[absl::StrCat(what, of_case)].rates); };
      const std::vector<double> pull = sparse_ms("sparse-pull"), push = sparse_ms("sparse-push");
      std::printf("| %lld x %d | %d | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f |\n",
                  static_cast<long long>(keys), dim, n, MinMedMax(pull, 3).c_str(),
                  MinMedMax(push, 3).c_str(), MinMedMax(sparse_ms("sparse-pull-inproc"), 3).c_str(),
                  MinMedMax(sparse_ms("sparse-push-inproc"), 3).c_str(), MinMedMax(grpc_pull, 3).c_str(),
                  MinMedMax(grpc_push, 3).c_str(), MinMedMax(tcp, 3).c_str(),
                  At(pull, 0.5) / std::max(At(tcp, 0.5), 1e-12),
                  At(push, 0.5) / std::max(At(tcp, 0.5), 1e-12),
                  At(pull, 0.5) / std::max(At(grpc_pull, 0.5), 1e-12),
                  At(push, 0.5) / std::max(At(grpc_push, 0.5), 1e-12));
    }
  }
  if (!chunked.empty()) {
    std::printf(
        "\nA model cut into many small chunks against the same floats in one chunk (push + pull over gRPC, "
        "ASP); microseconds an iteration, min / median / max:\n\n"
        "| chunks x floats | servers | many chunks us | one chunk us | ratio | us a chunk beyond one chunk "
        "|\n"
        "|---|---|---|---|---|---|\n");
  }
  for (const auto& [count, floats] : chunked) {
    const double bytes = 2.0 * 4.0 * static_cast<double>(count * floats);  // pushed and pulled
    auto us = [bytes](const std::vector<double>& rates) {
      std::vector<double> out;
      for (double rate : rates) out.push_back(bytes / (rate * 1e9) * 1e6);
      return out;
    };
    for (int n : server_counts) {
      const std::vector<double> many =
          us(samples[absl::StrCat("chunked:", count, ":", floats, ":", n)].rates);
      const std::vector<double> one =
          us(samples[absl::StrCat("chunked-whole:", count, ":", floats, ":", n)].rates);
      std::printf("| %lld x %lld | %d | %s | %s | %.2f | %.2f |\n", static_cast<long long>(count),
                  static_cast<long long>(floats), n, MinMedMax(many, 0).c_str(), MinMedMax(one, 0).c_str(),
                  At(many, 0.5) / std::max(At(one, 0.5), 1e-12),
                  (At(many, 0.5) - At(one, 0.5)) / static_cast<double>(std::max<int64_t>(count - 1, 1)));
    }
  }
  std::printf("\ngoals missed: %d\n", goals_missed);
  return 0;
}

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  fulcrum::ParseFlags(argc, argv,
                      "fulcrum-bench [--sizes=1,16,64] [--servers=1,2] [--batches=5] [--seconds=1.5] "
                      "[--rtt_pushes=3000] [--pin_rtt=0] [--sparse=10000:64,100000:16] [--chunked=4096:25] "
                      "[--mutex_deadlock_detection]");
  fulcrum::SetMutexDeadlockDetection(absl::GetFlag(FLAGS_mutex_deadlock_detection));
  const std::string spec = absl::GetFlag(FLAGS_run_case);
  if (!spec.empty()) return fulcrum::RunCase(spec);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::fprintf(stderr, "cannot find this binary (/proc/self/exe)\n");
    return 1;
  }
  self[n] = '\0';
  return fulcrum::Run(self);
}
