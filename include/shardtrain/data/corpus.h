// Corpora for `data prepare`: plain text files (one document each), JSONL files (one document
// per line, the text in a named field), gzip-compressed variants, directories and glob patterns
// of them, and the Austen novels; tokenized in parallel (ranks: byte ranges cut at document
// boundaries; threads inside a rank) into the token dataset format, the same bits at any number
// of ranks and threads.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/data/commands.h"

namespace shardtrain::data {

enum class CorpusFormat { Text, Jsonl };

struct CorpusSource {
  std::string name;           // the path as found (or "austen/<novel>")
  CorpusFormat format = CorpusFormat::Text;
  bool gzip = false;
  std::int64_t bytes = 0;     // on disk (compressed size for .gz); the text's size in memory
  bool in_memory = false;     // `text` holds the document (the Austen novels)
  std::string text;
  // An uncompressed JSONL file can be cut between lines into byte ranges of several ranks.
  bool splittable() const { return !in_memory && !gzip && format == CorpusFormat::Jsonl; }
};

// Expands --source values in order: "austen" (the six novels), a file, a directory (its files
// named *.txt, *.text, *.md, *.jsonl, *.ndjson, each optionally .gz, recursively, sorted by
// path; hidden ones skipped) or a glob pattern (matches sorted). The format follows the name:
// *.jsonl / *.ndjson (optionally .gz) are JSONL, the rest plain text. UserError naming the
// source when it does not exist, matches nothing, or is not a regular file.
std::vector<CorpusSource> expand_corpus_sources(const std::vector<std::string>& sources, const std::string& data_dir);

// One rank's part: source `source`, bytes [begin, end) (a JSONL range starts at the first
// line that begins in it; whole sources have begin 0, end = bytes).
struct SourceRange {
  int source = 0;
  std::int64_t begin = 0, end = 0;
};
// Rank r of n takes the bytes [r*B/n, (r+1)*B/n) of the sources laid end to end: the lines of
// a splittable file that begin there, and every other source that begins there.
std::vector<SourceRange> rank_ranges(const std::vector<CorpusSource>& s, int rank, int size);

// data prepare for text corpora, collective over `world` (every rank runs it with the same
// arguments; one rank works too). `agreed(f)` runs f on every rank and turns a failure on any
// rank into the same error on all of them (runtime::run_agreed; the data layer knows no
// runtime). Returns the summary (on rank 0; "" elsewhere). Nothing is left half-written: the
// splits are written as .tmp files and renamed, and meta.json comes last.
std::string prepare_corpus(const PrepareArgs& a, MPI_Comm world,
                           const std::function<void(const std::function<void()>&)>& agreed);

}  // namespace shardtrain::data
