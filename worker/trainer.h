// Runs one worker's share of one job: loads its data, then steps through
// pull -> forward/backward -> push, reporting progress, and (rank 0)
// evaluates the test set after every epoch. Which rows a partition step
// takes: common/data_partition.h.
#ifndef FULCRUM_WORKER_TRAINER_H_
#define FULCRUM_WORKER_TRAINER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/data_partition.h"
#include "fulcrum/v1/cluster.pb.h"
#include "kernels/backend.h"
#include "kernels/mlp.h"
#include "worker/ctr_data.h"
#include "worker/dataset.h"

namespace fulcrum {

class ParameterClient;
class ParameterTransport;

struct TrainerHooks {
  std::function<void(v1::WorkReport)> report;  // sends a report to the scheduler
  std::function<bool()> should_stop;           // the assignment was withdrawn
  std::function<void(double, int64_t)> observe_step;  // a partition step's seconds and examples (metrics)
  std::function<void(double)> observe_pull;           // seconds a pull took (BSP: includes waiting for the step)
  std::function<void(int64_t)> observe_staleness;     // ASP/SSP: a pull's lead over the slowest partition
  std::function<void(bool)> observe_prefetch;         // BSP: a prefetched pull was used (true) or pulled again
  // After each partition step: the seconds of its forward + backward (on a
  // GPU: the kernels, synchronized) and the backend memory held.
  std::function<void(double, int64_t)> observe_compute;
  // The newest assignment of this job (partitions change as workers come and go).
  std::function<v1::Assignment()> latest_assignment;
  // Waits until the job's membership epoch passes `epoch`, the job is
  // withdrawn, or `timeout`; returns the newest assignment.
  std::function<v1::Assignment(int64_t epoch, absl::Duration timeout)> wait_for_change;
  // A parameter server failed a request: a new shard map may be on its way,
  // so fetch assignments more often for a while (optional).
  std::function<void()> expect_change;
  // The parameter client the job's training uses now (nullptr when it is
  // done with it), so that the caller can Supersede() it the moment a newer
  // shard map (or the end of the job) arrives: requests held by a stopped
  // server are then cancelled rather than waited out (optional).
  std::function<void(ParameterClient*, const std::string& job_id)> watch_client;
};

class TrainingRun;

// The name a job's pushes from this run carry: the worker id plus a random
// run tag. Sequence numbers restart with every run (a worker put back into a
// job, a restarted process under the same id), so deduplication must not
// mix one run's numbers with another's.
std::string WriterId(const std::string& worker_id);

// ASP and SSP (the dense loop and the click models' loop): the steps done
// by each partition `assignment` gives this worker, as this worker counted
// them (`known`) for a partition it kept, else where the assignment says it
// resumes; and the partition furthest behind that is not through
// `total_steps` (-1: every one is).
std::map<int32_t, int64_t> PartitionPositions(const v1::Assignment& assignment,
                                              const std::map<int32_t, int64_t>& known);
int32_t FurthestBehind(const std::map<int32_t, int64_t>& positions, int64_t total_steps);

// Fault injection for tests (fulcrum-worker --exit-mid-push): in the n-th
// partition step this process computes, once the first layer's gradients
// are acknowledged and before any other layer is sent, the process kills
// itself (SIGKILL), as a worker killed halfway through its push dies.
// 0 (the default) = never. Click jobs die between the push of the rows'
// gradients and that of the dense ones.
void SetExitMidPush(int64_t n);
// Counts one partition step against SetExitMidPush's n: whether this is the
// step to die in.
bool ExitMidPushNow();

// How a worker overlaps communication with compute. Neither changes a result:
// BSP parameters come out bit for bit the same either way.
struct TransferOptions {
  // Push each layer's gradients as soon as the backward pass has them, while
  // it computes the layers below (on a device, through CopyToHostAsync);
  // false waits for the whole pass first.
  bool overlap_push = true;
  // BSP: right after pushing a layer in the last partition step of a step,
  // ask for that layer's parameters of the next step (servers answer when
  // the step is complete there), so the pull travels while the layers below
  // are still computed; false pulls the whole model after the pushes.
  bool prefetch_pull = true;
  // Click models compute on the worker's backend when it is a device's (a
  // GPU); on the CPU backend the host's models run them. True runs them
  // through the backend even then: the GPU's path, tested without a GPU.
  bool click_models_on_backend = false;
};

// What the operator lets one job claim on this worker (fulcrum-worker flags).
struct WorkerLimits {
  // Datasets must lie under one of these folders (see CheckUnderRoots); empty: anywhere.
  std::vector<std::string> data_roots;
  // A job's datasets may take at most this many bytes; 0: no limit.
  int64_t memory_budget_bytes = 0;
};

class Trainer {
 public:
  // Parameters travel by `transport` (not owned; it outlives the trainer),
  // or over gRPC when it is nullptr.
  Trainer(std::string worker_id, kernels::Backend* backend, TrainerHooks hooks, TransferOptions transfer = {},
          WorkerLimits limits = {}, ParameterTransport* transport = nullptr);

  // Loads the datasets named by the assignment's spec. Errors name the path;
  // PERMISSION_DENIED for a path outside the data roots, RESOURCE_EXHAUSTED
  // (naming the bytes) for data beyond the memory budget or an allocation
  // that fails.
  absl::Status Load(const v1::Assignment& assignment);
  // The READY report for the loaded data.
  v1::WorkReport ReadyReport() const;
  // Trains until the job is through (reporting DONE for its partitions) and
  // then until it ends. CANCELLED if should_stop() fired first.
  absl::Status Train(const v1::Assignment& assignment);

 private:
  friend class TrainingRun;

// The name a job's pushes from this run carry: the worker id plus a random
// run tag. Sequence numbers restart with every run (a worker put back into a
// job, a restarted process under the same id), so deduplication must not
// mix one run's numbers with another's.
std::string WriterId(const std::string& worker_id);
  absl::Status Evaluate(const std::vector<const float*>& params, kernels::Mlp* model,
                        kernels::BatchStats* stats);
  // Copies the batch's rows into batch_x_ / batch_y_ (sized by the caller).
  void GatherBatch(const std::vector<int64_t>& perm, int64_t first, int batch);

  const std::string worker_id_;
  kernels::Backend* backend_;
  TrainerHooks hooks_;
  const TransferOptions transfer_;
  const WorkerLimits limits_;
  ParameterTransport* const transport_;
  std::string job_id_;
  std::shared_ptr<const Dataset> train_;
  std::shared_ptr<const Dataset> test_;
  // A click model's job (worker/ctr_trainer.h) and its data.
  bool click_ = false;
  v1::JobSpec click_spec_;
  ClickData click_data_;
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_y_;
  // The test set in backend memory (rank 0), uploaded on first evaluation.
  kernels::Buffer test_x_buffer_;
  kernels::Buffer test_y_buffer_;
  const float* test_x_ = nullptr;
  const int32_t* test_y_ = nullptr;
};

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_TRAINER_H_
