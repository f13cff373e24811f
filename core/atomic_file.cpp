#include "kiln/core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/core/error.hpp"

namespace kiln {

namespace {
std::string errno_str() { return std::strerror(errno); }
}  // namespace

void write_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces) {
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "save: cannot create '{}': {}", tmp, errno_str());
  auto bail = [&](const char* what) {
    const std::string e = errno_str();
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("save: {} '{}' failed: {}", what, tmp, e);
  };
  for (const auto& [ptr, n] : pieces) {
    const auto* p = static_cast<const char*>(ptr);
    size_t left = n;
    while (left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0) {
        if (errno == EINTR) continue;
        bail("writing");
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) bail("fsync of");
  if (::close(fd) != 0) {
    const std::string e = errno_str();
    ::unlink(tmp.c_str());
    fail("save: closing '{}' failed: {}", tmp, e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_str();
    ::unlink(tmp.c_str());
    fail("save: renaming '{}' to '{}' failed: {}", tmp, path, e);
  }
  // Make the rename itself durable.
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kiln
