// error_text: e.what() cut before the stack trace a library appends.
#include "shardtrain/util/error_text.h"

namespace shardtrain {

std::string error_text(const std::exception& e) {
  std::string text = e.what();
  // libtorch 1.13 and 2.x: "<message>\nException raised from <function> at <file>:<line> (most
  // recent call first):\nframe #0: ..."; some builds give the frames alone.
  for (const char* marker : {"\nException raised from ", "\nframe #0"}) {
    const size_t at = text.find(marker);
    if (at != std::string::npos) text.resize(at);
  }
  return text;
}

}  // namespace shardtrain
