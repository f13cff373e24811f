#pragma once
// Writing a file atomically: the bytes go to a temporary file beside it, which is flushed to disk and
// renamed over the path, so a reader (or a crash) never sees a half-written file. Used by
// safetensors::save, checkpoints, IDX writing and the profiler's trace.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// Writes the pieces, in order, to path atomically (temp file, fsync, rename); a kiln::Error naming the
// temporary file and the failing step leaves no temporary file behind.
void write_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces);

}  // namespace kiln
#pragma GCC visibility pop
