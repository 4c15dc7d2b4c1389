#include "common/quote.h"

#include <string>

#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// A column is as wide as asked in terminal cells whatever the name's
// script: ASCII, two-byte Latin, three-byte CJK (two cells each), emoji
// (four bytes, two cells), combining marks (no cell); a cut falls between
// code points and is marked.
TEST(ColumnTest, PadsAndCutsByTerminalCellsBetweenCodePoints) {
  EXPECT_EQ(Column("abc", 6), "abc   ");
  EXPECT_EQ(Column("", 3), "   ");
  EXPECT_EQ(Column("abcdef", 6), "abcdef") << "exactly full: no cut";
  EXPECT_EQ(Column("abcdefg", 6), "abcde~");
  EXPECT_EQ(Column("caf\xc3\xa9", 6), "caf\xc3\xa9  ") << "é is one cell";
  EXPECT_EQ(Column("\xe6\x97\xa5\xe6\x9c\xac", 6), "\xe6\x97\xa5\xe6\x9c\xac  ")
      << "two CJK characters, four cells";
  EXPECT_EQ(Column("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7", 6), "\xe6\x97\xa5\xe6\x9c\xac~ ")
      << "a wide character that would pass the last cell is cut whole";
  EXPECT_EQ(Column("\xf0\x9f\x9a\x80!", 4), "\xf0\x9f\x9a\x80! ") << "an emoji is two cells";
  EXPECT_EQ(Column("e\xcc\x81", 2), "e\xcc\x81 ") << "a combining accent takes no cell";
  EXPECT_EQ(Column("a\xe6\x97", 4), "a\xe6\x97 ") << "a cut-short sequence: each byte a cell, never dropped";
}

}  // namespace
}  // namespace fulcrum
