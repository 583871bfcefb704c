#pragma once
// The checkpoint file on disk: written atomically, the temporaries of killed saves removed by the next
// successful save, and read back whole. Why: docs/design-notes.md#io-checkpoint

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace detail {

constexpr char checkpoint_magic[8] = {'T', 'W', 'R', 'P', 'C', 'K', 'P', 'T'};

// The directory part of a path ("." for a bare file name), for fsync'ing it after a rename.
inline std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Whether `name` is one of write_file_atomically's temporaries for a target named `target_name`: the
// target's name, ".tmp.", and the six letters or digits mkstemp puts in place of XXXXXX.
inline bool is_temporary_name_of(const std::string& name, const std::string& target_name) {
  const std::string prefix = target_name + ".tmp.";
  return name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0 &&
         name.find_first_not_of("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", prefix.size()) == name.npos;
}

// Removes the temporaries that killed saves to `path` left beside it (docs/design-notes.md#io-checkpoint says which
// files are taken as theirs), and returns how many. Never fails: the save that calls it has succeeded.
inline std::size_t remove_stale_temporaries(const std::string& path) noexcept {
  std::size_t removed = 0;
  try {  // out of memory: what was removed so far
    const std::string directory = directory_of(path), target = path.substr(path.find_last_of('/') + 1);  // npos + 1 is 0
    std::vector<std::string> names;
    DIR* listing = ::opendir(directory.c_str());
    if (listing == nullptr) return 0;
    while (const dirent* entry = ::readdir(listing)) {
      if (is_temporary_name_of(entry->d_name, target)) names.emplace_back(entry->d_name);
    }
    ::closedir(listing);
    for (const std::string& name : names) {
      const std::string file = directory + "/" + name;
      const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;  // gone meanwhile, a link, or not ours to read
      struct stat opened {};
      char head[sizeof checkpoint_magic] = {};
      // Empty or shorter than the magic: perhaps a save that has just created it (it writes only once it
      // holds the lock), so not even locked to look. A save in progress holds the lock: LOCK_NB fails.
      const bool ours = ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) &&
                        opened.st_size >= static_cast<off_t>(sizeof checkpoint_magic) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
                        ::pread(fd, head, sizeof head, 0) == static_cast<ssize_t>(sizeof head) &&
                        std::memcmp(head, checkpoint_magic, sizeof head) == 0;
      // Still the file that was opened under that name (not renamed over the target by a save that finished
      // between the open and the lock, its name taken by nothing else): removed while the lock is held.
      struct stat named {};
      if (ours && ::lstat(file.c_str(), &named) == 0 && named.st_dev == opened.st_dev && named.st_ino == opened.st_ino &&
          ::unlink(file.c_str()) == 0)
        ++removed;
      ::close(fd);
    }
  } catch (...) {
  }
  return removed;
}

// Writes `bytes` to `path` atomically: a uniquely named temporary beside it (mkstemp: two saves to one
// path never share it), locked while it exists under that name (so that no other save takes it for a
// killed one's), fsync, rename, then fsync of the directory so that the rename itself is durable; then
// the temporaries that killed saves to `path` left are removed.
inline void write_file_atomically(const std::string& path, const std::string& bytes) {
  std::string temporary = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(temporary.data());
  if (fd < 0) fail("checkpoint ", path, ": cannot create a temporary file beside it: ", std::strerror(errno));
  // The lock is taken before anything is written, and held (through `lock`, which shares the open file
  // with fd) until after the rename. Where the file system has no flock it is not taken, and the clean-up
  // of other saves, which cannot take it either, removes nothing there.
  int lock = -1;
  if (::flock(fd, LOCK_EX) == 0) lock = ::dup(fd);
  const auto release = [&] {
    if (lock >= 0) ::close(lock);
  };
  const auto give_up = [&](const char* what) {  // fd is -1 once closed
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(temporary.c_str());
    release();
    fail("checkpoint ", path, ": ", what, " failed: ", reason);
  };
  if (::fchmod(fd, 0644) != 0) give_up("chmod");
  for (std::size_t written = 0; written < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up("write");
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) give_up("fsync");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) give_up("close");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) give_up("rename");
  release();
  const int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) fail("checkpoint ", path, ": written, but its directory cannot be opened to sync: ", std::strerror(errno));
  const bool synced = ::fsync(dir) == 0;
  const std::string reason = synced ? "" : std::strerror(errno);
  ::close(dir);
  if (!synced) fail("checkpoint ", path, ": written, but syncing its directory failed: ", reason);
  remove_stale_temporaries(path);
}

// The whole of a regular file; any failure (missing, a directory, a read error) is a towerpipe::error.
inline std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("checkpoint ", path, ": cannot open: ", std::strerror(errno));
  std::string bytes;
  struct stat info {};
  const bool regular = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  char block[1 << 16];
  ssize_t n = 0;
  while (regular && (n = ::read(fd, block, sizeof block)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    bytes.append(block, static_cast<std::size_t>(n));
  }
  const std::string reason = std::strerror(errno);
  ::close(fd);
  if (!regular) fail("checkpoint ", path, ": not a regular file");
  if (n < 0) fail("checkpoint ", path, ": read failed: ", reason);
  return bytes;
}

}  // namespace detail
}  // namespace towerpipe
