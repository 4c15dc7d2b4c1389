// Compressed pushes (JobSpec.compression) stay within a message whatever
// the ratio: top-k sends 8 bytes a kept value (its index and value), twice
// float32's at topkRatio 1, so the scheduler cuts such a job's chunks and
// the worker batches them at their encoded size. A real parameter service
// in this process applies what arrives.
#include <memory>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/rpc.h"
#include "common/test_metrics.h"
#include "gtest/gtest.h"
#include "kernels/model_from_spec.h"
#include "scheduler/admission.h"
#include "scheduler/job_spec.h"
#include "scheduler/placement.h"
#include "server/parameter_service.h"
#include "server/parameter_store.h"
#include "worker/gradient_compressor.h"
#include "worker/in_process_transport.h"
#include "worker/parameter_client.h"

namespace fulcrum {
namespace {

constexpr char kTopKJob[] = "job-topk";
constexpr int kTopKFeatures = 1024;
constexpr int kTopKClasses = 1024;  // a weight of 2^20 values: one chunk of the largest --chunk-bytes

v1::JobSpec TopKSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind(v1::ModelSpec::SOFTMAX_REGRESSION);
  v1::DataSpec* data = spec.mutable_data();
  data->set_dataset(v1::DataSpec::SYNTHETIC);
  data->set_synthetic_examples(100);
  data->set_synthetic_features(kTopKFeatures);
  data->set_synthetic_classes(kTopKClasses);
  data->set_batch_size(10);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.5f);
  spec.set_mode(v1::ASP);
  spec.set_num_workers(1);
  spec.mutable_compression()->set_kind(v1::CompressionSpec::TOPK);
  spec.mutable_compression()->set_topk_ratio(1.0);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(CompressedPushTest, TopKOfEveryValueStaysWithinAMessageAndArrivesWhole) {
  const v1::JobSpec spec = TopKSpec();
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const ModelLayout layout = LayoutFor(spec, kTopKFeatures, kTopKClasses);
  // --chunk-bytes at its largest (4 MiB: 2^20 floats), and at its default.
  for (const int64_t chunk_bytes : {int64_t{4} << 20, int64_t{256} << 10}) {
    SCOPED_TRACE(chunk_bytes);
    const int64_t chunk_elems = ChunkElemsFor(ClaimsOf(spec), chunk_bytes / 4);
    // A chunk's 8 bytes a value fit the bound on a chunk's message.
    EXPECT_LE(chunk_elems * 8, kMaxChunkStateBytes);
    ParameterStore store;
    ParameterServiceImpl service(&store, SharedTestMetrics());
    InProcessTransport transport;
    transport.Serve("in-process:0", &service);
    const v1::ShardMap map = PlanShardMap(layout.tensors, {{"server-0", "in-process:0"}}, /*num_shards=*/0,
                                          /*replicas=*/1, chunk_elems, /*version=*/1);
    v1::SetupJobRequest setup;
    setup.set_job_id(kTopKJob);
    *setup.mutable_spec() = spec;
    setup.set_num_partitions(1);
    setup.set_total_steps(10);
    *setup.mutable_shard_map() = map;
    setup.set_server_id("server-0");
    for (const v1::ChunkLocation& chunk : map.chunks()) AddChunkSetup(chunk, layout, &setup);
    v1::SetupJobResponse setup_response;
    const grpc::Status set_up = service.SetupJob(nullptr, &setup, &setup_response);
    ASSERT_TRUE(set_up.ok()) << set_up.error_message();

    ParameterClient client(map, kTopKJob, "w0", nullptr, v1::WIRE_FP32, &transport);
    std::vector<int64_t> sizes;
    for (const auto& tensor : layout.tensors) sizes.push_back(tensor.size);
    const std::unique_ptr<GradientCompressor> compressor = GradientCompressor::For(spec.compression(), sizes);
    client.set_compressor(compressor.get());
    std::vector<std::vector<float>> before = client.MakeBuffers();
    ParameterClient::Versions versions;
    ASSERT_TRUE(client.Pull(0, absl::Seconds(30), &before, &versions).ok());
    std::vector<std::vector<float>> grads = client.MakeBuffers();
    for (auto& grad : grads) {
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 17) - 8.0f;
    }
    transport.set_keep(
        [](ParameterTransport::Method method) { return method == ParameterTransport::Method::kPush; });
    const absl::Status pushed = client.Push(/*seq=*/1, /*partition=*/0, /*step=*/0, grads, absl::Seconds(30));
    transport.set_keep(nullptr);
    ASSERT_TRUE(pushed.ok()) << pushed;
    const std::vector<InProcessTransport::Kept> kept = transport.TakeKept();
    ASSERT_GE(kept.size(), 2u) << "the weight's 8 MiB of pairs in one request";
    for (const InProcessTransport::Kept& request : kept) {
      // A batch of chunks within kMaxBatchBytes, or one chunk alone, at
      // their encoded size; the other fields take a few hundred bytes.
      EXPECT_LE(
          request.sent.size(),
          static_cast<size_t>(std::max<int64_t>(ParameterClient::kMaxBatchBytes, chunk_elems * 8) + 4096));
      EXPECT_LT(request.sent.size(), static_cast<size_t>(kMaxMessageBytes));
    }
    // Every value arrived: SGD moved each parameter by lr times its gradient.
    std::vector<std::vector<float>> after = client.MakeBuffers();
    ASSERT_TRUE(client.Pull(1, absl::Seconds(30), &after, &versions).ok());
    for (size_t t = 0; t < after.size(); ++t) {
      for (size_t i = 0; i < after[t].size(); ++i) {
        ASSERT_FLOAT_EQ(after[t][i], before[t][i] - 0.5f * grads[t][i]) << "tensor " << t << " value " << i;
      }
    }
  }
}

}  // namespace
}  // namespace fulcrum
