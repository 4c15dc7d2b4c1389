// Memory lent to gRPC without a copy. A push hands gRPC slices over the
// worker's own gradient buffers; gRPC lets go of them when it has written
// them, which for a finished call is at once, but a write stuck on a paused
// peer can hold them for as long as the peer sleeps. Writing the buffers
// while a slice is alive could send the next step's values under the old
// step's sequence number, so their owner asks the loan first: AwaitReturned
// says whether every slice is gone, and Abandon leaves buffers still lent to
// the loan, which frees them when their last slice goes, while the owner
// goes on with fresh ones.
#ifndef FULCRUM_COMMON_SLICE_LOAN_H_
#define FULCRUM_COMMON_SLICE_LOAN_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/time/time.h"

namespace fulcrum {

class SliceLoan {
 public:
  SliceLoan();
  ~SliceLoan();  // buffers abandoned or not, nothing is freed under a live slice
  SliceLoan(const SliceLoan&) = delete;
  SliceLoan& operator=(const SliceLoan&) = delete;

  // Lend, AwaitReturned and Abandon come from the owner's thread; the slices
  // may be let go on any thread.

  // A slice over `size` bytes at `data`, counted until gRPC and every copy of
  // it let go. The memory must stay untouched until then.
  grpc::Slice Lend(const void* data, size_t size);

  // True when no slice lent since the last Abandon is alive, waiting up to
  // `timeout` for that.
  bool AwaitReturned(absl::Duration timeout);

  // Gives the loan `buffers` (moved out, so their memory stays where the
  // slices point) and puts fresh zeroed ones of the same sizes in their
  // place. The old memory is freed when its last slice goes; later slices
  // are counted afresh.
  template <typename T>
  void Abandon(std::vector<std::vector<T>>* buffers) {
    std::vector<std::shared_ptr<void>> kept;
    for (std::vector<T>& buffer : *buffers) {
      const size_t size = buffer.size();
      kept.push_back(std::make_shared<std::vector<T>>(std::move(buffer)));
      buffer = std::vector<T>(size);
    }
    Renew(std::move(kept));
  }

  // Slices alive over memory lent since the last Abandon (for tests).
  int Outstanding();

 private:
  struct Generation;
  // Hands `kept` to the current generation, lets it go and starts a new one.
  void Renew(std::vector<std::shared_ptr<void>> kept);

  Generation* current_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_SLICE_LOAN_H_
