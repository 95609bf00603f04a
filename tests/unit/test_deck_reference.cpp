// reference_markdown() documents every key. (That docs/deck-reference.md is exactly what the
// program renders, with the model layer's choices handed to the schema, is e2e_deck_reference.)
#include <gtest/gtest.h>

#include "shardtrain/deck/deck.h"

namespace deck = shardtrain::deck;

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
