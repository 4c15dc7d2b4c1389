// The checks job spec validation is written with (scheduler/job_spec.cc and
// scheduler/job_spec_click.cc): each rejection is INVALID_ARGUMENT naming
// the field as users write it, the rule and the value given.

#ifndef FULCRUM_SCHEDULER_JOB_SPEC_CHECKS_H_
#define FULCRUM_SCHEDULER_JOB_SPEC_CHECKS_H_

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace job_spec_checks {

inline absl::Status Invalid(const std::string& field, const std::string& rule, const std::string& got) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: ", field, " ", rule, " (got ", got, ")"));
}

// `value` in [lo, hi].
template <typename T>
absl::Status CheckRange(const std::string& field, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "]"), absl::StrCat(value));
}

// `value` finite and between lo and hi, each bound open or closed.
inline absl::Status CheckFloat(const std::string& field, double value, double lo, double hi, bool lo_open,
                               bool hi_open) {
  const bool ok =
      std::isfinite(value) && (lo_open ? value > lo : value >= lo) && (hi_open ? value < hi : value <= hi);
  if (ok) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]"),
                 absl::StrCat(value));
}

}  // namespace job_spec_checks
}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_JOB_SPEC_CHECKS_H_
