// pickle_scan_test.cpp — the opcode scan that bounds an untrusted pickle before Python unpickles
// it (bind/pickle_scan.h): well-formed pickles of every protocol pass with their counts, a memo
// index out of order, too many marks, stack values or items per opcode are refused, and a
// truncated or foreign file is reported as malformed, never read past its end.
#include <gtest/gtest.h>

#include <string>

#include "bind/pickle_scan.h"

namespace amem {
namespace {

PickleScan scan(const std::string& bytes, PickleLimits limits = {}) {
  return scan_pickle(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), limits);
}

// {"a": [1, "xy"], "b": <the same list>} as pickle.dumps(..., protocol=4) writes it.
const std::string kShared("\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01" "a\x94]\x94(K\x01\x8c\x02xy\x94"
                          "e\x8c\x01" "b\x94h\x02u.", 37);

TEST(PickleScan, AcceptsAWellFormedPickleAndCountsIt) {
  PickleScan s = scan(kShared);
  EXPECT_TRUE(s.parsed);
  EXPECT_FALSE(s.refused);
  EXPECT_EQ(s.memo_puts, 5u);
  EXPECT_EQ(s.memo_gets, 1u);  // the shared list
  EXPECT_EQ(s.max_marks, 2u);
}

TEST(PickleScan, AcceptsProtocolZeroText) {
  PickleScan s = scan("(lp0\nI1\naS'x'\np1\nag0\na.");  // [1, 'x', <itself>]
  EXPECT_TRUE(s.parsed) << s.problem;
  EXPECT_EQ(s.memo_gets, 1u);
}

TEST(PickleScan, RefusesAMemoIndexOutOfOrder) {
  PickleScan s = scan(std::string("\x80\x04]r\x00\x00\x00\x10.", 9));  // memo index 2^28: a 4 GB memo
  EXPECT_TRUE(s.refused);
  EXPECT_NE(s.problem.find("memo index 268435456"), std::string::npos) << s.problem;
  EXPECT_EQ(s.offset, 3u);
  EXPECT_TRUE(scan("(lp99999\n.").refused);  // protocol 0's PUT too
}

TEST(PickleScan, RefusesTooManyMarksStackValuesOrItems) {
  PickleLimits limits{4, 8, 3};
  EXPECT_TRUE(scan(std::string(5, '(') + ".", limits).refused);
  EXPECT_TRUE(scan(std::string(9, ']') + ".", limits).refused);
  PickleScan s = scan("]((K\x01K\x02K\x03K\x04" "e.", limits);  // APPENDS of 4 items
  EXPECT_TRUE(s.refused);
  EXPECT_NE(s.problem.find("4 items"), std::string::npos) << s.problem;
}

TEST(PickleScan, ReportsTruncatedAndForeignFilesAsMalformed) {
  for (size_t cut = 0; cut < kShared.size(); ++cut) {
    PickleScan s = scan(kShared.substr(0, cut));
    EXPECT_FALSE(s.parsed) << cut;
    EXPECT_FALSE(s.refused) << cut;
    EXPECT_LE(s.offset, cut);
  }
  PickleScan s = scan("not a pickle");
  EXPECT_FALSE(s.parsed);
  EXPECT_NE(s.problem.find("byte 0x6e is not a pickle opcode"), std::string::npos) << s.problem;
  EXPECT_FALSE(scan(std::string("\x80\x04X\xff\xff\xff\x7f", 8)).parsed);  // a length past the end
  EXPECT_FALSE(scan("a.").parsed);                                        // APPEND on an empty stack
}

}  // namespace
}  // namespace amem
