#include "common/checkpoint_read.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A reader over fixed answers, one per call, recording what it was asked.
struct Answers {
  std::vector<v1::ChunkState> states;
  std::vector<std::pair<int64_t, uint64_t>> asked;  // (offset, capture)
  absl::StatusOr<v1::ChunkState> operator()(int64_t offset, uint64_t capture) {
    asked.emplace_back(offset, capture);
    if (asked.size() > states.size()) return absl::InternalError("asked once too often");
    return states[asked.size() - 1];
  }
};

v1::ChunkState Slice(const std::string& bytes, int64_t size, uint64_t capture) {
  v1::ChunkState state;
  state.set_table_state(bytes);
  state.set_table_state_size(size);
  state.set_capture(capture);
  return state;
}

TEST(ReadSlicedChunkTest, AssemblesTheSlicesOfTheCaptureTheFirstNamed) {
  Answers answers{{Slice("abcd", 10, 7), Slice("efgh", 10, 7), Slice("ij", 10, 7)}, {}};
  auto read = ReadSlicedChunk(3, [&](int64_t offset, uint64_t capture) { return answers(offset, capture); });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->table_state(), "abcdefghij");
  EXPECT_EQ(answers.asked, (std::vector<std::pair<int64_t, uint64_t>>{{0, 0}, {4, 7}, {8, 7}}));
}

TEST(ReadSlicedChunkTest, AChunkWithoutTableStateIsOneCall) {
  Answers answers{{Slice("", 0, 0)}, {}};
  auto read = ReadSlicedChunk(3, [&](int64_t offset, uint64_t capture) { return answers(offset, capture); });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(answers.asked.size(), 1u);
}

TEST(ReadSlicedChunkTest, SlicesThatDoNotAddUpAreDataLoss) {
  const std::vector<std::pair<std::vector<v1::ChunkState>, std::string>> cases = {
      {{Slice("abcd", 10, 7), Slice("", 10, 7)}, "stops at 4 of its 10 bytes"},
      {{Slice("abcd", 10, 7), Slice("efgh", 10, 8)}, "another state"},
      {{Slice("abcd", 10, 7), Slice("efgh", 12, 7)}, "another state"},
      {{Slice("abcd", 10, 7), Slice("efghijk", 10, 7)}, "runs past its 10 bytes"},
      {{Slice("abcd", 3, 7)}, "runs past its 3 bytes"},
  };
  for (const auto& [states, message] : cases) {
    SCOPED_TRACE(message);
    Answers answers{states, {}};
    auto read = ReadSlicedChunk(3, [&](int64_t offset, uint64_t capture) { return answers(offset, capture); });
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(message), std::string::npos) << read.status();
    EXPECT_NE(read.status().message().find("chunk 3"), std::string::npos) << read.status();
  }
}

TEST(ReadSlicedChunkTest, TheReadersErrorsPassThrough) {
  auto read = ReadSlicedChunk(3, [](int64_t, uint64_t) -> absl::StatusOr<v1::ChunkState> {
    return absl::AbortedError("capture dropped");
  });
  EXPECT_EQ(read.status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace fulcrum
