// Quoting untrusted text (ids, paths, names from requests) in error messages
// and logs: escaped, so that control characters and terminal escapes never
// reach a terminal or a log unescaped, and bounded in length.
#ifndef FULCRUM_COMMON_QUOTE_H_
#define FULCRUM_COMMON_QUOTE_H_

#include <cstdint>
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

// The terminal cells a code point takes: 2 for East Asian wide and full-width
// characters and emoji (the common blocks of Unicode's East Asian Width W
// and F), 0 for combining marks, else 1.
inline size_t CellsOf(uint32_t c) {
  if ((c >= 0x0300 && c <= 0x036F) || (c >= 0x200B && c <= 0x200F) || (c >= 0xFE00 && c <= 0xFE0F)) return 0;
  const bool wide =
      (c >= 0x1100 && c <= 0x115F) || (c >= 0x2E80 && c <= 0x303E) || (c >= 0x3041 && c <= 0x33FF) ||
      (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xA000 && c <= 0xA4CF) ||
      (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0xFE30 && c <= 0xFE4F) ||
      (c >= 0xFF00 && c <= 0xFF60) || (c >= 0xFFE0 && c <= 0xFFE6) || (c >= 0x1F300 && c <= 0x1F64F) ||
      (c >= 0x1F680 && c <= 0x1F6FF) || (c >= 0x1F900 && c <= 0x1F9FF) || (c >= 0x20000 && c <= 0x3FFFD);
  return wide ? 2 : 1;
}

// `text` (UTF-8, printable) as a column `width` terminal cells wide: cut
// between code points where it is wider (marked with "~"), padded with
// spaces where it is narrower. A byte that is not valid UTF-8 takes a cell.
inline std::string Column(absl::string_view text, size_t width) {
  std::string out;
  size_t cells = 0;
  for (size_t i = 0; i < text.size();) {
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80           ? 1
                          : (lead >> 5) == 0x6  ? 2
                          : (lead >> 4) == 0xE  ? 3
                          : (lead >> 3) == 0x1E ? 4
                                                : 1;
    uint32_t c = length == 1 ? lead : lead & (0x7F >> length);
    size_t n = 1;
    for (; n < length && i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80;
         ++n) {
      c = (c << 6) | (static_cast<unsigned char>(text[i + n]) & 0x3F);
    }
    if (n < length) c = lead, n = 1;  // a sequence cut short: its lead byte alone
    const size_t add = CellsOf(c);
    if (cells + add > width || (cells + add == width && i + n < text.size())) {
      out.push_back('~');  // more follows than fits: the last cell marks the cut
      ++cells;
      break;
    }
    out.append(text.data() + i, n);
    cells += add;
    i += n;
  }
  out.append(width > cells ? width - cells : 0, ' ');
  return out;
}

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_QUOTE_H_
