// The version of shardtrain and the git revision it was built from (the one place they live:
// a small .cpp generated at build time, so a new commit recompiles that file and nothing else).
#pragma once

namespace shardtrain {

const char* version();       // e.g. "0.1.0" (project(VERSION) in CMakeLists.txt)
const char* git_revision();  // `git describe --always --dirty` of the source tree, or "unknown"

}  // namespace shardtrain
