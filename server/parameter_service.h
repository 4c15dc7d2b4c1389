// gRPC edge of the parameter server: fulcrum.v1.ParameterService over a
// ParameterStore. Translates messages and statuses; holds no training logic.
#ifndef FULCRUM_SERVER_PARAMETER_SERVICE_H_
#define FULCRUM_SERVER_PARAMETER_SERVICE_H_

#include "common/metrics.h"
#include "fulcrum/v1/parameter.grpc.pb.h"
#include "server/parameter_store.h"

namespace fulcrum {

// Translates the job spec's optimizer and schedule into the store's configs.
JobShardConfig ToJobShardConfig(const v1::SetupJobRequest& request);

class ParameterServiceImpl final : public v1::ParameterService::Service {
 public:
  // `store` and `metrics` must outlive the service.
  ParameterServiceImpl(ParameterStore* store, MetricsEndpoint* metrics);

  grpc::Status SetupJob(grpc::ServerContext* context, const v1::SetupJobRequest* request,
                        v1::SetupJobResponse* response) override;
  grpc::Status DropJob(grpc::ServerContext* context, const v1::DropJobRequest* request,
                       v1::DropJobResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const v1::PushRequest* request,
                    v1::PushResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                    v1::PullResponse* response) override;

 private:
  grpc::Status Finish(const char* method, const absl::Status& status, int64_t received,
                      int64_t sent);

  ParameterStore* store_;
  MetricsEndpoint* metrics_;
  prometheus::Counter* updates_applied_;
  prometheus::Counter* duplicates_;
  prometheus::Gauge* jobs_;
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_PARAMETER_SERVICE_H_
