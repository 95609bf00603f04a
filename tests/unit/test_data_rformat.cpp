// Tests of the R serialization / lazy-load readers and of the Austen extraction.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/r_lazyload.h"
#include "shardtrain/data/r_serialize.h"
#include "shardtrain/data/zlib_inflate.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;

namespace {
// Builds XDR serialization streams by hand.
struct Xdr {
  std::string s = std::string("X\n");
  Xdr() { i(3).i(0x40200).i(0x30500).i(5); s += "UTF-8"; }
  Xdr& i(std::int32_t v) {
    auto u = static_cast<std::uint32_t>(v);
    for (int k = 3; k >= 0; --k) s.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
    return *this;
  }
  Xdr& chars(const std::string& c, int levels = 0x40) { i((levels << 12) | 9).i(static_cast<int>(c.size())); s += c; return *this; }
  Xdr& na() { return i(9).i(-1); }
};
std::string zlib_compress(const std::string& in) {
  uLongf n = compressBound(in.size());
  std::string out(n, '\0');
  EXPECT_EQ(compress(reinterpret_cast<Bytef*>(&out[0]), &n, reinterpret_cast<const Bytef*>(in.data()), in.size()), Z_OK);
  out.resize(n);
  return out;
}
}  // namespace

TEST(RSerialize, CharacterVectorWithNaAndLatin1) {
  Xdr x;
  x.i(16).i(3).chars("Emma Woodhouse").na().chars("caf\xe9", 0x04);  // 0x04: LATIN1 level
  RValue v = parse_r_serialized(x.s, "test");
  ASSERT_EQ(v.type, RValue::Type::String);
  ASSERT_EQ(v.strings.size(), 3u);
  EXPECT_EQ(*v.strings[0], "Emma Woodhouse");
  EXPECT_FALSE(v.strings[1].has_value());
  EXPECT_EQ(*v.strings[2], "caf\xc3\xa9");  // converted to UTF-8
}

TEST(RSerialize, NamedListWithAttributesAndSymbolReference) {
  // list(a = 1:2, b = c(TRUE, NA)) with names; then a second object referring to symbol "names".
  Xdr x;
  x.i(19 | (1 << 9)).i(2);
  x.i(13).i(2).i(1).i(2);
  x.i(10).i(2).i(1).i(INT32_MIN);
  x.i(2 | (1 << 10)).i(1).chars("names").i(16).i(2).chars("a").chars("b").i(254);
  RValue v = parse_r_serialized(x.s, "test");
  ASSERT_EQ(v.type, RValue::Type::List);
  ASSERT_NE(v.element("a"), nullptr);
  EXPECT_EQ(v.element("a")->ints, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(v.element("b")->type, RValue::Type::Logical);
  EXPECT_EQ(v.element("b")->ints[1], INT32_MIN);
  EXPECT_EQ(v.element("c"), nullptr);

  // Pairlist of two nodes tagged with the same symbol: the second tag is a REFSXP (index 1).
  Xdr y;
  y.i(2 | (1 << 10)).i(1).chars("x").i(14).i(1).i(0x3FF00000).i(0);
  y.i(2 | (1 << 10)).i((1 << 8) | 255).i(24).i(3);
  y.s += "abc";
  y.i(254);
  RValue p = parse_r_serialized(y.s, "test");
  ASSERT_EQ(p.type, RValue::Type::Pairlist);
  EXPECT_EQ(p.tags, (std::vector<std::string>{"x", "x"}));
  EXPECT_DOUBLE_EQ(p.elements[0].reals[0], 1.0);
  EXPECT_EQ(p.elements[1].bytes[0], "abc");
}

TEST(RSerialize, BadInputIsUserErrorWithOffset) {
  Xdr x;
  x.i(16).i(5).chars("only one");
  try {
    parse_r_serialized(x.s, "'f.rdb' block at offset 7");
    FAIL() << "truncated vector accepted";
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("f.rdb"), std::string::npos) << m;
    EXPECT_NE(m.find("byte"), std::string::npos) << m;
  }
  Xdr c;
  c.i(3);  // CLOSXP
  EXPECT_THROW(parse_r_serialized(c.s, "t"), UserError);
  EXPECT_THROW(parse_r_serialized("RDX2\n", "t"), UserError);
}

TEST(Zlib, RoundTripAndCorruption) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "It is a truth universally acknowledged " + std::to_string(i) + "\n";
  std::string z = zlib_compress(text);
  EXPECT_EQ(inflate_any(z, static_cast<long long>(text.size()), "t"), text);
  EXPECT_EQ(inflate_any(z, -1, "t"), text);
  EXPECT_THROW(inflate_any(z, 5, "t"), UserError);                   // wrong declared size
  EXPECT_THROW(inflate_any(z.substr(0, z.size() / 2), -1, "t"), UserError);  // truncated
}

TEST(RLazyLoad, WrittenDatabaseRoundTrips) {
  // A one-variable database written the way R does: rdb block = BE length + zlib(serialized).
  auto dir = std::filesystem::temp_directory_path() / ("st_rdb_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Xdr obj;
  obj.i(16).i(2).chars("line one").chars("line two");
  std::string z = zlib_compress(obj.s);
  std::string block;
  for (int k = 3; k >= 0; --k) block.push_back(static_cast<char>((obj.s.size() >> (8 * k)) & 0xFF));
  block += z;
  write_file((dir / "Rdata.rdb").string(), block.data(), block.size());
  // Index: list(variables = list(book = c(0L, len)), compressed = TRUE)
  Xdr idx;
  idx.i(19 | (1 << 9)).i(2);
  idx.i(19 | (1 << 9)).i(1).i(13).i(2).i(0).i(static_cast<int>(block.size()));
  idx.i(2 | (1 << 10)).i(1).chars("names").i(16).i(1).chars("book").i(254);
  idx.i(10).i(1).i(1);
  idx.i(2 | (1 << 10)).i((1 << 8) | 255).i(16).i(2).chars("variables").chars("compressed").i(254);
  std::string gz = zlib_compress(idx.s);
  write_file((dir / "Rdata.rdx").string(), gz.data(), gz.size());
  RLazyLoadDb db((dir / "Rdata.rdx").string());
  ASSERT_EQ(db.names(), std::vector<std::string>{"book"});
  auto docs = read_austen((dir / "Rdata.rdx").string());
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "line one\nline two\n");
  EXPECT_THROW(db.fetch("nope"), UserError);
  // Truncated .rdb: the block runs past the end.
  write_file((dir / "Rdata.rdb").string(), block.data(), block.size() / 2);
  EXPECT_THROW(db.fetch("book"), UserError);
  std::filesystem::remove_all(dir);
}

TEST(Austen, RealPackageHasSixNovels) {
  std::string rdx = austen_rdx_path(default_data_dir());
  if (!file_exists(rdx)) GTEST_SKIP() << rdx << " absent: run scripts/fetch-data";
  auto docs = read_austen(rdx);
  ASSERT_EQ(docs.size(), 6u);
  std::size_t total = 0;
  for (auto& d : docs) total += d.text.size();
  EXPECT_EQ(docs[0].name, "emma");
  EXPECT_EQ(docs[0].text.substr(0, 5), "EMMA\n");
  EXPECT_GT(total, 3'500'000u);
  EXPECT_LT(total, 5'000'000u);
  EXPECT_NE(docs[4].text.find("It is a truth universally acknowledged"), std::string::npos);
  std::printf("austen: %zu bytes in %zu novels\n", total, docs.size());
}
