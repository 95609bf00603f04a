// Paths a deck or a file names relative to a documented base (run.name under runs/,
// log.metrics_file under run.out_dir, a checkpoint directory's `latest`): the one check that
// they stay inside it.
#pragma once
#include <string>

namespace shardtrain {

// Why `rel` would leave its base, or "" when it stays inside: "" (empty), an absolute path, a
// ".." component that climbs above the base, or a NUL or other control character. Lexical
// only: a directory inside the base that is itself a symbolic link is the site's to prevent
// (docs/security.md).
std::string path_escape_reason(const std::string& rel);

// base + "/" + rel after the check above; UserError "<key> = "<rel>": ... must stay inside
// <base_doc>" otherwise. `base_doc` names the base for the message ("run.out_dir", "runs/").
std::string path_inside(const std::string& base, const std::string& rel, const std::string& key,
                        const std::string& base_doc);

// A single file name (no '/', not "." or "..", no control characters): `latest` names a
// checkpoint next to it this way. Returns the reason it is not, or "".
std::string plain_name_reason(const std::string& name);

}  // namespace shardtrain
