// HfBpeTokenizer at run time: added tokens -> normalizer -> pre-tokenizer steps -> BPE of each
// pre-token (with a per-thread cache) -> ids, in the order the tokenizers library runs them.
#include <algorithm>
#include <cstring>
#include <queue>

#include "hf_tokenizer_spec.h"
#include "shardtrain/data/pretokenize.h"
#include "shardtrain/data/unicode_class.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {
using Spec = HfBpeTokenizer::Spec;
constexpr std::size_t kMaxCachedWord = 256;   // longer pre-tokens are not cached
constexpr std::size_t kMaxCache = 1 << 19;    // entries; the cache is cleared past this

// Pre-token -> ids, per thread: an open-addressing index over two flat arrays (the words'
// bytes, their ids). One or two cache lines per lookup wherever the heap put things (a
// node-based map's nodes land among the fragments the tokenizer.json parse left).
class WordCache {
 public:
  WordCache() { slots_.assign(1 << 12, Slot{}); }
  bool find(std::string_view w, std::uint64_t h, const std::int32_t*& ids, std::uint32_t& n) const {
    for (std::size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return false;
      if (s.hash == h && s.key_len == w.size() && std::memcmp(keys_.data() + s.key_off, w.data(), w.size()) == 0) {
        ids = ids_.data() + s.ids_off;
        n = s.ids_len;
        return true;
      }
    }
  }
  void insert(std::string_view w, std::uint64_t h, const std::vector<std::int32_t>& ids) {
    if (count_ >= kMaxCache) clear();
    if (2 * (count_ + 1) > slots_.size()) grow();
    Slot s{h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(w.size()),
           static_cast<std::uint32_t>(ids_.size()), static_cast<std::uint32_t>(ids.size())};
    keys_.insert(keys_.end(), w.begin(), w.end());
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    place(s);
    ++count_;
  }
  // Never 0 (0 marks an empty slot).
  static std::uint64_t hash(std::string_view w) { return std::hash<std::string_view>()(w) | 1; }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  void place(const Slot& s) {
    std::size_t i = s.hash & (slots_.size() - 1);
    while (slots_[i].hash != 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2, Slot{});
    old.swap(slots_);
    for (const auto& s : old)
      if (s.hash) place(s);
  }
  void clear() {
    slots_.assign(1 << 12, Slot{});
    keys_.clear();
    ids_.clear();
    count_ = 0;
  }
  std::vector<Slot> slots_;
  std::vector<char> keys_;
  std::vector<std::int32_t> ids_;
  std::size_t count_ = 0;
};
constexpr std::int32_t kShortWord = 48;       // symbols; longer words use the heap
}  // namespace

struct HfBpeTokenizer::State {
  std::vector<std::unique_ptr<SplitRegex::Matcher>> matchers;  // per pre-tokenizer step
  std::vector<std::string> bufs;                               // per step: a rewritten piece
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> pieces;  // per step
  std::vector<std::vector<bool>> is_delim;                     // per step
  std::string normalized, scratch;
  WordCache cache;
  struct Symbol {
    std::int32_t id, prev, next;
    bool alive;
  };
  struct Cand {
    std::int32_t rank, pos, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Symbol> sym;
  std::vector<Cand> heap;
  std::vector<std::int32_t> word_ids, short_word;

  explicit State(const Spec& s) {
    for (const auto& p : s.pre)
      matchers.push_back(p.re ? std::make_unique<SplitRegex::Matcher>(p.re) : nullptr);
    bufs.resize(s.pre.size());
    pieces.resize(s.pre.size());
    is_delim.resize(s.pre.size());
  }
};

HfBpeTokenizer::HfBpeTokenizer(const HfTokenizerFiles& files, const TokenizerOptions& options)
    : HfBpeTokenizer(load_hf_tokenizer(files, options)) {}
HfBpeTokenizer::HfBpeTokenizer(std::shared_ptr<const Spec> spec)
    : spec_(std::move(spec)), st_(std::make_unique<State>(*spec_)) {}
HfBpeTokenizer::~HfBpeTokenizer() = default;

std::unique_ptr<Tokenizer> HfBpeTokenizer::for_thread() const {
  return std::unique_ptr<Tokenizer>(new HfBpeTokenizer(spec_));
}

std::int64_t HfBpeTokenizer::vocab_size() const { return static_cast<std::int64_t>(spec_->id_bytes.size()); }
std::string HfBpeTokenizer::name() const { return spec_->name; }
std::int32_t HfBpeTokenizer::eot_id() const { return spec_->eos; }
std::int32_t HfBpeTokenizer::bos_id() const { return spec_->bos; }
std::int32_t HfBpeTokenizer::eos_id() const { return spec_->eos; }
std::vector<std::int32_t> HfBpeTokenizer::prefix_ids() const { return spec_->prefix; }
std::vector<std::int32_t> HfBpeTokenizer::suffix_ids() const { return spec_->suffix; }

std::int32_t HfBpeTokenizer::token_id(std::string_view token) const {
  auto it = spec_->added_ids.find(std::string(token));
  if (it != spec_->added_ids.end()) return it->second;
  auto v = spec_->vocab_spelling.find(std::string(token));
  return v == spec_->vocab_spelling.end() ? -1 : v->second;
}

std::vector<std::int32_t> HfBpeTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids;
  encode_append(text, ids);
  return ids;
}

void HfBpeTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) {
  spec_->added.split(text, [&](std::string_view piece, std::size_t offset, std::int32_t id) {
    if (id >= 0) out.push_back(id);
    else encode_segment(piece, offset, out);
  });
}

// One stretch of text between added tokens: normalize, then pre-tokenize from step 0.
void HfBpeTokenizer::encode_segment(std::string_view text, std::size_t offset, std::vector<std::int32_t>& out) {
  if (spec_->normalizer.empty()) return pretokenize(0, text, offset == 0, out);
  std::string& s = st_->normalized;
  s.assign(text);
  for (const auto& n : spec_->normalizer) {
    switch (n.kind) {
      case Spec::NormStep::Prepend:
        if (!s.empty()) s.insert(0, n.a);
        break;
      case Spec::NormStep::Replace: {
        std::string& r = st_->scratch;
        r.clear();
        std::size_t p = 0;
        for (std::size_t q; (q = s.find(n.a, p)) != std::string::npos; p = q + n.a.size()) r.append(s, p, q - p).append(n.b);
        r.append(s, p, std::string::npos);
        s.swap(r);
        break;
      }
      case Spec::NormStep::Unicode:
        unicode_normalize(n.a, s, st_->scratch);
        s.swap(st_->scratch);
        break;
    }
  }
  // Normalizing may grow the text; the copy keeps `s` stable while later steps use scratch.
  std::string normalized;
  normalized.swap(s);
  pretokenize(0, normalized, offset == 0, out);
  s.swap(normalized);
}

void HfBpeTokenizer::pretokenize(std::size_t step, std::string_view piece, bool at_start, std::vector<std::int32_t>& out) {
  if (piece.empty()) return;
  if (step == spec_->pre.size()) return model_word(piece, out);
  const auto& p = spec_->pre[step];
  auto& buf = st_->bufs[step];
  std::string_view text = piece;
  if (p.kind == Spec::PreStep::ByteLevel) {
    if (p.add_prefix_space && piece.front() != ' ') {
      buf.assign(1, ' ').append(piece);
      text = buf;
    }
  } else if (p.kind == Spec::PreStep::Metaspace) {
    buf.clear();
    const bool prepend = p.prepend == Spec::PreStep::Always || (p.prepend == Spec::PreStep::First && at_start);
    for (char ch : piece) {
      if (ch == ' ') buf += p.replacement;
      else buf += ch;
    }
    if (prepend && buf.compare(0, p.replacement.size(), p.replacement) != 0) buf.insert(0, p.replacement);
    text = buf;
    if (!p.split) return pretokenize(step + 1, text, at_start, out);
  }
  if (p.scanner != Spec::PreStep::NoScanner) {
    for (std::size_t x = 0; x < text.size();) {
      const std::size_t len = p.scanner == Spec::PreStep::Gpt2Scanner ? pretoken_length(text, x)
                                                                      : llama3_pretoken_length(text, x, p.max_digits);
      pretokenize(step + 1, text.substr(x, len), at_start && x == 0, out);
      x += len;
    }
    return;
  }
  // Split into delimiters and the rest.
  auto& seg = st_->pieces[step];
  auto& delim = st_->is_delim[step];
  seg.clear();
  delim.clear();
  std::size_t pos = 0, b = 0, e = 0;
  auto add = [&](std::size_t x, std::size_t y, bool d) {
    seg.emplace_back(x, y);
    delim.push_back(d);
  };
  if (p.kind == Spec::PreStep::Metaspace) {
    for (std::size_t q; (q = text.find(p.replacement, pos)) != std::string_view::npos; pos = q + p.replacement.size()) {
      if (q > pos) add(pos, q, false);
      add(q, q + p.replacement.size(), true);
    }
  } else if (p.re) {
    while (st_->matchers[step]->find(text, pos, b, e)) {
      if (b > pos) add(pos, b, p.invert);
      add(b, e, !p.invert);
      pos = e;
    }
  } else {
    return pretokenize(step + 1, text, at_start, out);
  }
  if (pos < text.size()) add(pos, text.size(), p.kind == Spec::PreStep::Metaspace ? false : p.invert);
  const SplitBehavior behavior = p.kind == Spec::PreStep::Metaspace ? SplitBehavior::MergedWithNext : p.behavior;
  // Apply the behavior in place (as the library's split does), then recurse into each piece.
  std::size_t n = 0;
  switch (behavior) {
    case SplitBehavior::Isolated:
      n = seg.size();
      break;
    case SplitBehavior::Removed:
      for (std::size_t i = 0; i < seg.size(); ++i)
        if (!delim[i]) seg[n++] = seg[i];
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_delim = false;
      for (std::size_t i = 0; i < seg.size(); ++i) {
        if (delim[i] && !prev_delim && n > 0) seg[n - 1].second = seg[i].second;
        else seg[n++] = seg[i];
        prev_delim = delim[i];
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      // Right to left: a delimiter joins the piece after it.
      std::vector<std::pair<std::size_t, std::size_t>> r;
      bool prev_delim = false;
      for (std::size_t i = seg.size(); i-- > 0;) {
        if (delim[i] && !prev_delim && !r.empty()) r.back().first = seg[i].first;
        else r.push_back(seg[i]);
        prev_delim = delim[i];
      }
      std::reverse(r.begin(), r.end());
      n = r.size();
      for (std::size_t i = 0; i < n; ++i) seg[i] = r[i];
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_delim = false;
      for (std::size_t i = 0; i < seg.size(); ++i) {
        if (delim[i] && prev_delim && n > 0) seg[n - 1].second = seg[i].second;
        else seg[n++] = seg[i];
        prev_delim = delim[i];
      }
      break;
    }
  }
  // Deeper steps use their own buffers, but recursion into this same step cannot happen, so
  // `seg` stays valid: copy it only when a later step could reuse it (never: steps are ordered).
  for (std::size_t i = 0; i < n; ++i) {
    auto [x, y] = st_->pieces[step][i];
    pretokenize(step + 1, text.substr(x, y - x), at_start && x == 0, out);
  }
}

// The model on one pre-token: whole-word lookup (ignore_merges), the cache, or BPE; a long
// SentencePiece-style word in the pieces no merge can cross (Spec::piece_boundary).
void HfBpeTokenizer::model_word(std::string_view word, std::vector<std::int32_t>& out) {
  const Spec& s = *spec_;
  if (!s.piece_boundary.empty() && word.size() > kMaxCachedWord / 4) {
    const std::string& b = s.piece_boundary;
    std::size_t start = 0;
    for (std::size_t p = word.find(b, 1); p != std::string_view::npos; p = word.find(b, p + b.size())) {
      if (p >= start + b.size() && word.compare(p - b.size(), b.size(), b) == 0) continue;  // inside a run
      if (p > start) {
        model_piece(word.substr(start, p - start), out);
        start = p;
      }
    }
    model_piece(word.substr(start), out);
    return;
  }
  model_piece(word, out);
}

void HfBpeTokenizer::model_piece(std::string_view word, std::vector<std::int32_t>& out) {
  const Spec& s = *spec_;
  if (word.size() == 1 && s.byte_level) {
    out.push_back(s.byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kMaxCachedWord) return bpe(word, out);
  const std::uint64_t h = WordCache::hash(word);
  const std::int32_t* hit;
  std::uint32_t n;
  if (st_->cache.find(word, h, hit, n)) {
    out.insert(out.end(), hit, hit + n);
    return;
  }
  auto& ids = st_->word_ids;
  ids.clear();
  bool whole = false;
  if (s.ignore_merges) {
    auto it = s.vocab.find(std::string(word));
    if (it != s.vocab.end()) {
      ids.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) bpe(word, ids);
  st_->cache.insert(word, h, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

// BPE of one word (the library's Word::merge_all): merges applied lowest rank first, leftmost
// first among equal ranks, with a heap of candidate pairs checked when popped.
void HfBpeTokenizer::bpe(std::string_view word, std::vector<std::int32_t>& out) {
  const Spec& s = *spec_;
  auto& sym = st_->sym;
  sym.clear();
  bool last_unk = false;
  auto push = [&](std::int32_t id) {
    sym.push_back({id, static_cast<std::int32_t>(sym.size()) - 1, static_cast<std::int32_t>(sym.size()) + 1, true});
  };
  if (s.byte_level) {
    for (unsigned char c : word) push(s.byte_id[c]);
  } else {
    for (std::size_t pos = 0; pos < word.size();) {
      std::size_t len = 1;
      std::int32_t id = -1;
      auto c0 = static_cast<unsigned char>(word[pos]);
      if (c0 < 0x80) {
        id = s.ascii_id[c0];
      } else {
        decode_utf8(word, pos, len);
        auto it = s.vocab.find(std::string(word.substr(pos, len)));
        if (it != s.vocab.end()) id = it->second;
      }
      if (id >= 0) {
        push(id);
        last_unk = false;
      } else {
        bool fell_back = false;
        if (s.byte_fallback) {
          fell_back = true;
          for (std::size_t k = 0; k < len; ++k)
            if (s.fallback_id[static_cast<unsigned char>(word[pos + k])] < 0) fell_back = false;
          if (fell_back)
            for (std::size_t k = 0; k < len; ++k) push(s.fallback_id[static_cast<unsigned char>(word[pos + k])]);
        }
        if (fell_back) {
          last_unk = false;
        } else {
          if (s.unk_id < 0)
            throw UserError("'" + s.file + "': the text has a character ('" + std::string(word.substr(pos, len)) +
                            "') that is not in model.vocab, and the model has no unk_token");
          if (!(s.fuse_unk && last_unk)) push(s.unk_id);
          last_unk = true;
        }
      }
      pos += len;
    }
  }
  const auto n = static_cast<std::int32_t>(sym.size());
  if (n <= kShortWord) {
    // Short words: the lowest-ranked adjacent pair, leftmost among equals, merged one at a
    // time by rescanning. The same merges in the same order as the heap below (a heap entry
    // is only taken while its pair is still there), without the heap's bookkeeping.
    auto& w = st_->short_word;
    w.clear();
    for (const auto& x : sym) w.push_back(x.id);
    while (w.size() > 1) {
      std::int32_t best_rank = INT32_MAX, best_merged = -1;
      std::size_t best_i = 0;
      for (std::size_t i = 0; i + 1 < w.size(); ++i) {
        const auto* m = s.merges.find(Spec::pair_key(w[i], w[i + 1]));
        if (m && m->rank < best_rank) {
          best_rank = m->rank;
          best_merged = m->merged;
          best_i = i;
        }
      }
      if (best_merged < 0) break;
      w[best_i] = best_merged;
      w.erase(w.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
    }
    out.insert(out.end(), w.begin(), w.end());
    return;
  }
  if (n > 0) sym.back().next = -1;
  auto& heap = st_->heap;
  heap.clear();
  auto cmp = std::greater<State::Cand>();
  auto consider = [&](std::int32_t pos) {
    std::int32_t nx = sym[pos].next;
    if (nx < 0) return;
    const auto* m = s.merges.find(Spec::pair_key(sym[pos].id, sym[nx].id));
    if (!m) return;
    heap.push_back({m->rank, pos, m->merged});
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    State::Cand top = heap.back();
    heap.pop_back();
    auto& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    auto& right = sym[left.next];
    const auto* m = s.merges.find(Spec::pair_key(left.id, right.id));
    if (!m || m->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const auto& x : sym)
    if (x.alive) out.push_back(x.id);
}

std::string HfBpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  const Spec& s = *spec_;
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    ST_USER_CHECK(id >= 0 && id < static_cast<std::int64_t>(s.id_bytes.size()) && s.id_known[id], "'", s.file,
                  "': id ", id, " at position ", i, " is not a token of this tokenizer");
    text += s.id_bytes[id];
  }
  std::size_t strip = 0;
  while (strip < static_cast<std::size_t>(s.strip_leading) && strip < text.size() && text[strip] == ' ') ++strip;
  text.erase(0, strip);
  return text;
}

}  // namespace shardtrain::data
