// error_text: what an exception says, in one line for the user.
#pragma once
#include <exception>
#include <string>

namespace shardtrain {

// e.what() without the stack trace a library appends (libtorch's c10::Error adds "Exception
// raised from ..." and its frames): that is for whoever debugs the library, not for the user
// who gave a bad file. Callers log the whole what() at debug level.
std::string error_text(const std::exception& e);

}  // namespace shardtrain
