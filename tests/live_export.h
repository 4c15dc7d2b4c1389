// A job's parameters as `fulcrum export JOB` writes them, for the
// multi-process tests that compare whole models (tables included).
#ifndef FULCRUM_TESTS_LIVE_EXPORT_H_
#define FULCRUM_TESTS_LIVE_EXPORT_H_

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "client/safetensors.h"
#include "tests/cluster_fixture.h"

namespace fulcrum {

// Every tensor of a job's live export (`fulcrum export JOB`): the dense
// tensors and each table's ids and rows, by name.
inline std::map<std::string, SafetensorsTensor> LiveExport(const std::string& job_id, const std::string& scheduler) {
  std::map<std::string, SafetensorsTensor> named;
  const std::string file = MakeTempDir() + "/live.safetensors";
  auto [rc, out] = RunCli(absl::StrCat("export ", job_id, " -o ", file, " --scheduler ", scheduler));
  EXPECT_EQ(rc, 0) << out;
  auto tensors = ReadSafetensorsFile(file);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  if (!tensors.ok()) return named;
  for (SafetensorsTensor& t : *tensors) named[t.name] = std::move(t);
  return named;
}

inline void ExpectSameExport(const std::map<std::string, SafetensorsTensor>& expected,
                      const std::map<std::string, SafetensorsTensor>& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    SCOPED_TRACE(name);
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end());
    EXPECT_EQ(it->second.shape, tensor.shape);
    EXPECT_EQ(it->second.u64, tensor.u64);
    ASSERT_EQ(it->second.data.size(), tensor.data.size());
    if (tensor.data.empty()) continue;  // ids: no floats (and memcmp takes no null pointer)
    EXPECT_EQ(0, std::memcmp(it->second.data.data(), tensor.data.data(), tensor.data.size() * sizeof(float)))
        << DescribeDifference(tensor.data, it->second.data);
  }
}

}  // namespace fulcrum

#endif  // FULCRUM_TESTS_LIVE_EXPORT_H_
