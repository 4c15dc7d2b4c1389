// Status propagation helpers. Debian's Abseil (20220623) ships none.
#ifndef FULCRUM_COMMON_STATUS_MACROS_H_
#define FULCRUM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function if `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status fulcrum_status_ = (expr);         \
    if (!fulcrum_status_.ok()) return fulcrum_status_; \
  } while (false)

#define FULCRUM_CONCAT_INNER_(a, b) a##b
#define FULCRUM_CONCAT_(a, b) FULCRUM_CONCAT_INNER_(a, b)

// `ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());`
#define ASSIGN_OR_RETURN(lhs, expr) \
  FULCRUM_ASSIGN_OR_RETURN_IMPL_(FULCRUM_CONCAT_(fulcrum_statusor_, __LINE__), lhs, expr)

// (`lhs` is a declaration: it cannot be parenthesized.)
// NOLINTBEGIN(bugprone-macro-parentheses)
#define FULCRUM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace fulcrum {

// The one greppable way to drop a Status on purpose.
inline void IgnoreError(const absl::Status&) {}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_STATUS_MACROS_H_
