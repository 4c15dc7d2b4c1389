// Reading a libFuzzer input as a sequence of commands: one byte choosing the
// command, a 16-bit length, that many bytes of its argument (a serialized
// request, which the harness parses; bytes that do not parse are dropped,
// as gRPC drops them before any handler).
#ifndef FULCRUM_TESTS_FUZZ_FUZZ_INPUT_H_
#define FULCRUM_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace fulcrum {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next command, or false at the end.
  bool Next(uint8_t* command, std::string* argument) {
    if (pos_ + 3 > size_) return false;
    *command = data_[pos_];
    size_t length = data_[pos_ + 1] | (size_t{data_[pos_ + 2]} << 8);
    pos_ += 3;
    length = std::min(length, size_ - pos_);
    argument->assign(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_TESTS_FUZZ_FUZZ_INPUT_H_
