// The start-of-run console text of `train`: a one-screen deck summary, and the nothing-to-train note.
#include "start_report.h"

#include <sstream>

namespace shardtrain::train {

namespace {

// The keys the deck file and --set give, one line per section ("[model] arch = "gpt2", ..."),
// taken from the resolved deck's text (the one rendering of values), whose lines for keys left
// at their default end in "(default)".
std::string given_keys(const std::string& resolved) {
  std::istringstream in(resolved);
  std::string out, section, keys;
  auto flush = [&] {
    if (!keys.empty()) out += "[" + section + "] " + keys + "\n";
    keys.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      flush();
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t comment = line.find("  # ");
    if (line.size() >= 9 && line.compare(line.size() - 9, 9, "(default)") == 0) continue;
    std::string kv = line.substr(0, comment);
    while (!kv.empty() && kv.back() == ' ') kv.pop_back();
    keys += (keys.empty() ? "" : ", ") + kv;
  }
  flush();
  return out;
}

}  // namespace

std::string start_summary(const deck::Deck& d, const std::string& out_dir) {
  std::ostringstream os;
  // The whole deck is ~120 lines: on the console it buries the lines that matter (and errors
  // end up below it); the file keeps it, the summary names what this run chose.
  os << "# shardtrain train: " << d.source() << "; the keys it and --set give (every other key at its default):\n";
  const std::string resolved = d.resolved_toml();
  std::istringstream given(given_keys(resolved));
  for (std::string line; std::getline(given, line);) os << "#   " << line << "\n";
  os << "# resolved deck (every key, defaults included): " << out_dir << "/deck.resolved.toml"
     << (d.get_bool("log.print_deck") ? "" : "; --set log.print_deck=true prints it here") << "\n";
  if (d.get_bool("log.print_deck")) os << resolved;
  std::string text = os.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();  // log::info adds it
  return text;
}

bool nothing_left(const LoopPosition& pos, const TrainerSettings& s) {
  return pos.step >= s.max_steps || (s.max_tokens > 0 && pos.tokens_seen >= s.max_tokens);
}

std::string nothing_to_train_note(const LoopPosition& pos, const TrainerSettings& s,
                                  const std::string& checkpoint) {
  std::ostringstream os;
  const bool by_steps = pos.step >= s.max_steps;
  os << "# nothing to train: " << checkpoint << " is at step " << pos.step;
  if (by_steps) os << " and train.max_steps = " << s.max_steps;
  else os << " with " << pos.tokens_seen << " tokens seen and train.max_tokens = " << s.max_tokens;
  os << " (this run is finished); no file was changed.\n"
     << "#   to train this run further: --set " << (by_steps ? "train.max_steps=" : "train.max_tokens=")
     << (by_steps ? "<more than " + std::to_string(pos.step) + ">" : "<more than " + std::to_string(pos.tokens_seen) + ">")
     << " (it continues from this checkpoint)\n"
     << "#   to start a new run: --set run.name=<another name> (its own directory runs/<name>"
     << " unless run.out_dir is set), or keep the directory and move this run to " << s.out_dir
     << "/previous-runs/: --set checkpoint.resume=never --set checkpoint.previous_run=move_aside\n";
  return os.str();
}

}  // namespace shardtrain::train
