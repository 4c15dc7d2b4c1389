// Quoting untrusted text (ids, paths, names from requests) in error messages
// and logs: escaped, so that control characters and terminal escapes never
// reach a terminal or a log unescaped, and bounded in length.
#ifndef FULCRUM_COMMON_QUOTE_H_
#define FULCRUM_COMMON_QUOTE_H_

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fulcrum {

// "text" with C escapes; longer text is cut at `max_bytes` and marked.
inline std::string Quote(absl::string_view text, size_t max_bytes = 128) {
  if (text.size() <= max_bytes) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, max_bytes)), "\"... (", text.size(), " bytes)");
}

// `text` with ASCII control characters (and DEL) escaped, cut at
// `max_bytes` (marked): for untrusted text shown to people (a worker's
// failure reason, a server's error message).
inline std::string Printable(absl::string_view text, size_t max_bytes = 4096) {
  std::string out;
  const bool cut = text.size() > max_bytes;
  for (unsigned char c : text.substr(0, max_bytes)) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(&c), 1)));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (cut) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

// Whether every byte is printable (no ASCII control characters or DEL);
// UTF-8 sequences pass.
inline bool IsPrintable(absl::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

// The number of Unicode code points of UTF-8 text (continuation bytes do not count).
inline size_t Utf8Length(absl::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_QUOTE_H_
