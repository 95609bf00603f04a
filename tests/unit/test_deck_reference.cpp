// docs/deck-reference.md must be exactly what reference_markdown() renders from the schema.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "shardtrain/deck/deck.h"

namespace deck = shardtrain::deck;

TEST(DeckReference, CommittedDocMatchesTheSchema) {
  const std::string path = std::string(SHARDTRAIN_SOURCE_DIR) + "/docs/deck-reference.md";
  const std::string rendered = deck::reference_markdown();
  if (const char* update = std::getenv("SHARDTRAIN_UPDATE_DOCS"); update && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << rendered;
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream committed;
  committed << in.rdbuf();
  EXPECT_TRUE(committed.str() == rendered)
      << path << " is out of date with src/deck/schema.cpp. Regenerate it with\n"
      << "  SHARDTRAIN_UPDATE_DOCS=1 <build>/bin/test_deck --gtest_filter=DeckReference.*\n"
      << "or\n  <build>/bin/shardtrain deck reference -o docs/deck-reference.md\nand commit the result.";
}

TEST(DeckReference, DocumentsEveryKeyWithItsDefault) {
  const std::string md = deck::reference_markdown();
  for (const auto& s : deck::sections()) EXPECT_NE(md.find("## [" + s.name + "]"), std::string::npos);
  for (const auto& k : deck::schema()) {
    std::string name = k.key.substr(k.key.find('.') + 1);
    EXPECT_NE(md.find("| `" + name + "` | " + deck::to_string(k.type) + " |"), std::string::npos) << k.key;
  }
  EXPECT_NE(md.find("| `timeout_s` | float | `600.0` | (0, 1e+06] | s |"), std::string::npos);
  EXPECT_NE(md.find("| full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2 |"), std::string::npos);
}
