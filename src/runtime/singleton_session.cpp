// A private Open MPI session directory per singleton (see singleton_session.h).
#include "shardtrain/runtime/singleton_session.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace shardtrain::runtime {
namespace {

constexpr const char* kPrefix = "shardtrain-mpi.";
// Set next to OMPI_MCA_orte_tmpdir_base, so that a child process that inherits both knows the
// directory is its parent's, not one its user chose.
constexpr const char* kMarkEnv = "SHARDTRAIN_SINGLETON_TMPDIR";
constexpr const char* kBaseEnv = "OMPI_MCA_orte_tmpdir_base";

std::string& made_dir() {
  static std::string dir;
  return dir;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// Where Open MPI itself would put the session tree (opal_tmp_directory's order).
std::string tmp_parent() {
  for (const char* name : {"TMPDIR", "TEMP", "TMP"})
    if (env_set(name)) return std::getenv(name);
  return "/tmp";
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  std::remove(path);  // best effort: an entry already gone (ENOENT) is fine
  return 0;
}

void remove_tree(const std::string& dir) {
  nftw(dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

// Removes <parent>/shardtrain-mpi.* directories of this user whose owner file names this host
// and a process that no longer exists (a singleton that was killed before it could clean up).
void remove_stale(const std::string& parent, const std::string& host) {
  DIR* d = opendir(parent.c_str());
  if (d == nullptr) return;
  const uid_t uid = geteuid();
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    const std::string dir = parent + "/" + e->d_name;
    struct stat st {};
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid) continue;
    std::ifstream owner(dir + "/owner");
    std::string owner_host;
    long pid = 0;
    if (!(owner >> owner_host >> pid) || owner_host != host || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    remove_tree(dir);
  }
  closedir(d);
}

}  // namespace

bool launched_as_singleton() {
  for (const char* name : {"OMPI_MCA_orte_launch", "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE",
                           "PMIX_NAMESPACE", "PMIX_RANK", "PMI_FD", "PMI_RANK"})
    if (env_set(name)) return false;
  return true;
}

std::string use_private_session_dir_if_singleton() {
  if (!made_dir().empty() || !launched_as_singleton()) return "";
  // A caller's own choice of session location is kept; one inherited from a shardtrain parent
  // (both variables equal) is not a choice.
  const bool inherited = env_set(kBaseEnv) && env_set(kMarkEnv) &&
                         std::strcmp(std::getenv(kBaseEnv), std::getenv(kMarkEnv)) == 0;
  if ((env_set(kBaseEnv) && !inherited) || env_set("OMPI_MCA_orte_top_session_dir") ||
      env_set("OMPI_MCA_orte_jobfam_session_dir"))
    return "";
  const std::string parent = tmp_parent();
  const std::string host = host_name();
  if (!host.empty()) remove_stale(parent, host);
  std::string templ = parent + "/" + kPrefix + std::to_string(getpid()) + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return "";  // Open MPI reports an unusable tmp itself
  {
    std::ofstream owner(templ + "/owner");
    owner << (host.empty() ? "?" : host) << ' ' << getpid() << '\n';
  }
  made_dir() = templ;
  static bool registered = false;
  if (!registered) registered = std::atexit(remove_private_session_dir) == 0;
  setenv(kBaseEnv, templ.c_str(), 1);
  setenv(kMarkEnv, templ.c_str(), 1);
  return templ;
}

void remove_private_session_dir() {
  if (made_dir().empty()) return;
  remove_tree(made_dir());
  made_dir().clear();
}

}  // namespace shardtrain::runtime
