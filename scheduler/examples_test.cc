// Every example job spec under examples/ parses (client/spec_file.h, as
// `fulcrum submit -f` reads it) and passes the scheduler's validation with
// its defaults applied: what the README tells a user to run is a valid job.
#include <filesystem>
#include <string>
#include <vector>

#include "client/spec_file.h"
#include "gtest/gtest.h"
#include "scheduler/job_spec.h"

namespace fulcrum {
namespace {

TEST(ExamplesTest, EveryExampleSpecParsesAndValidates) {
  std::vector<std::string> specs;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FULCRUM_SOURCE_DIR) + "/examples")) {
    if (entry.path().extension() == ".yaml") specs.push_back(entry.path().string());
  }
  ASSERT_GE(specs.size(), 4u) << "examples/ holds the README's job specs";
  for (const std::string& path : specs) {
    SCOPED_TRACE(path);
    absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ApplyJobSpecDefaults(&*spec);
    const absl::Status valid = ValidateJobSpec(*spec);
    EXPECT_TRUE(valid.ok()) << valid;
  }
}

}  // namespace
}  // namespace fulcrum
