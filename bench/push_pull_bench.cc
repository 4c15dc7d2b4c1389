// fulcrum-bench: dense push + pull throughput over loopback gRPC against the
// ceiling of the same bytes over one plain loopback TCP connection, measured
// side by side in one run.
//
// For each model size (1, 16, 64 MiB) and server count (1, 2, 4), N
// parameter servers run in this process on 127.0.0.1 (real gRPC over TCP);
// one iteration pushes a full gradient (ASP, applied by SGD on the servers)
// and pulls the full model back, through the worker's ParameterClient. The
// TCP baseline sends the same bytes to an echo peer and reads them back.
// Throughput counts bytes moved (push + pull = 2 x model size).
//
//   fulcrum-bench [--benchmark_min_time=2] [any Google Benchmark flag]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"
#include "common/param_init.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "server/parameter_service.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

constexpr int64_t kChunkElems = 65536;  // 256 KiB, the scheduler's default

struct ServerProcess {
  std::unique_ptr<MetricsEndpoint> metrics;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<ParameterServiceImpl> service;
  RunningServer running;
};

// N in-process parameter servers holding one job of `elements` floats.
class Fleet {
 public:
  Fleet(int servers, int64_t elements) {
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
    auto chunks = CutIntoChunks({elements}, kChunkElems);
    auto shard_of = AssignChunksToShards(chunks, servers);
    auto placement = BalancedShardPlacement(servers, ids);
    map_.set_chunk_elems(kChunkElems);
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
    for (int s = 0; s < servers; ++s) {
      if (!configs[s].chunks.empty()) (void)servers_[s]->store->SetupJob(configs[s]);
    }
  }
  ~Fleet() {
    for (auto& s : servers_) s->running.server->Shutdown();
  }
  const v1::ShardMap& map() const { return map_; }

 private:
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  v1::ShardMap map_;
};

void BM_FulcrumPushPull(benchmark::State& state) {
  const int64_t bytes = state.range(0) << 20;
  const int servers = static_cast<int>(state.range(1));
  Fleet fleet(servers, bytes / 4);
  ParameterClient client(fleet.map(), "bench", "bench-worker");
  auto grads = client.MakeBuffers();
  for (auto& g : grads) std::fill(g.begin(), g.end(), 1e-3f);
  auto params = client.MakeBuffers();
  int64_t seq = 0;
  for (auto _ : state) {
    ++seq;
    absl::Status push = client.Push(seq, 0, seq, grads, absl::Seconds(60));
    absl::Status pull = client.Pull(0, absl::Seconds(60), &params);
    if (!push.ok() || !pull.ok()) {
      state.SkipWithError((push.ok() ? pull : push).ToString().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

// Reads exactly n bytes.
bool ReadFull(int fd, char* buffer, int64_t n) {
  while (n > 0) {
    ssize_t got = read(fd, buffer, static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
    if (got <= 0) return false;
    buffer += got;
    n -= got;
  }
  return true;
}

bool WriteFull(int fd, const char* buffer, int64_t n) {
  while (n > 0) {
    ssize_t put = write(fd, buffer, static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
    if (put <= 0) return false;
    buffer += put;
    n -= put;
  }
  return true;
}

// The ceiling: the same bytes to an echo peer over one loopback TCP connection.
void BM_RawTcpEcho(benchmark::State& state) {
  const int64_t bytes = state.range(0) << 20;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    state.SkipWithError("cannot listen on loopback");
    close(listener);
    return;
  }
  std::thread echo([listener, bytes] {
    int fd = accept(listener, nullptr, nullptr);
    std::vector<char> buffer(bytes);
    while (ReadFull(fd, buffer.data(), bytes) && WriteFull(fd, buffer.data(), bytes)) {
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    state.SkipWithError("cannot connect over loopback");
    shutdown(listener, SHUT_RDWR);
    echo.join();
    close(listener);
    close(fd);
    return;
  }
  std::vector<char> out(bytes, 1), in(bytes);
  for (auto _ : state) {
    // A writer thread so that neither side blocks on a full socket buffer.
    std::thread writer([&] { WriteFull(fd, out.data(), bytes); });
    ReadFull(fd, in.data(), bytes);
    writer.join();
  }
  shutdown(fd, SHUT_RDWR);
  close(fd);
  echo.join();
  close(listener);
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

// Collects results to print Fulcrum as a ratio of the TCP ceiling.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      rates_[run.benchmark_name()] = it->second.value / 1e9;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    printf("\nDense push+pull throughput vs. plain loopback TCP (same bytes, same run)\n");
    printf("%-10s %-8s %14s %14s %8s\n", "model", "servers", "fulcrum GB/s", "tcp GB/s", "ratio");
    for (const auto& [name, rate] : rates_) {
      if (name.rfind("BM_FulcrumPushPull/", 0) != 0) continue;
      // BM_FulcrumPushPull/<MiB>/<servers>/...
      std::vector<std::string> parts = absl::StrSplit(name, '/');
      std::string tcp = absl::StrCat("BM_RawTcpEcho/", parts[1], "/");
      double ceiling = 0;
      for (const auto& [n, r] : rates_) {
        if (n.rfind(tcp, 0) == 0) ceiling = r;
      }
      printf("%-10s %-8s %14.3f %14.3f %8.2f\n", absl::StrCat(parts[1], " MiB").c_str(), parts[2].c_str(), rate,
             ceiling, ceiling > 0 ? rate / ceiling : 0.0);
    }
  }

 private:
  std::map<std::string, double> rates_;
};

BENCHMARK(BM_RawTcpEcho)->Arg(1)->Arg(16)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FulcrumPushPull)
    ->ArgsProduct({{1, 16, 64}, {1, 2, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fulcrum

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  benchmark::Initialize(&argc, argv);
  fulcrum::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
