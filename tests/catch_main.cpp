// The test runner of every tests/ executable: Catch2's, plus CUDA skipping.
//
// A test needs a GPU when its name contains "Cuda" (a TEMPLATE_TEST_CASE instantiated for the Cuda
// backend) or it is tagged [cuda]. Where no device is usable (or kiln was built without the backend):
//  * a run that selects only such tests prints "no CUDA device (...): skipped" and exits 77, which CTest
//    reports as skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt);
//  * a run that selects some runs the others and says how many it left out;
//  * with KILN_REQUIRE_GPU=1 (scripts/gpu_run.sh sets it) a run that selects CUDA tests fails instead:
//    on a GPU machine, "no device" is a broken machine, not a skip.
// Temporary files: the run makes one folder of its own under the temporary directory and points TMPDIR
// at it (std::filesystem::temp_directory_path, Python's tempfile and the `kiln` processes a test starts
// all follow TMPDIR), and removes it with everything in it when the run ends: a run leaves nothing in
// /tmp, whatever its test cases forgot. KILN_KEEP_TMP=1 keeps it (the path is printed) to look at.
// Exit status: 0 when every selected test passed, 77 only for the skip above, 1 for any failure. (Catch2
// v2 returns the number of failed assertions, capped at 255: exactly 77 would read as skipped.)
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <kiln/config.hpp>
#if defined(KILN_HAVE_CUDA_BACKEND)
#include <kiln/backends/cuda/cuda.hpp>
#endif

namespace {

bool needs_gpu(const Catch::TestCase& t) {
  if (t.name.find("Cuda") != std::string::npos) return true;
  for (const std::string& tag : t.tags)
    if (tag == "cuda") return true;
  return false;
}

// An exact-name test spec (Catch's special characters escaped).
std::string escape_name(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == ',' || c == '[' || c == ']' || c == '\\' || c == '*' || c == '~' || c == '"') r += '\\';
    r += c;
  }
  return r;
}

// This run's temporary folder (above).
class RunTmpDir {
 public:
  RunTmpDir() {
    std::error_code ec;
    std::string base = std::filesystem::temp_directory_path(ec).string();
    if (ec) base = "/tmp";
    std::string tmpl = base + "/kiln-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return;  // then the tests use the plain temporary directory
    dir_ = tmpl;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  ~RunTmpDir() {
    if (dir_.empty()) return;
    if (const char* keep = std::getenv("KILN_KEEP_TMP"); keep != nullptr && std::string(keep) == "1") {
      std::printf("KILN_KEEP_TMP=1: temporary files kept in %s\n", dir_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RunTmpDir(const RunTmpDir&) = delete;
  RunTmpDir& operator=(const RunTmpDir&) = delete;

 private:
  std::string dir_;
};

}  // namespace

int main(int argc, char* argv[]) {
  const RunTmpDir tmp;
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
#if defined(KILN_HAVE_CUDA_BACKEND)
  const bool gpu_ok = kiln::cuda::available();
  const std::string why = gpu_ok ? "" : kiln::cuda::unavailable_reason();
#else
  const bool gpu_ok = false;
  const std::string why = "kiln built without the CUDA backend";
#endif
  if (!gpu_ok && !session.configData().listTests && !session.configData().listTestNamesOnly && !session.configData().listTags) {
    const Catch::Config& cfg = session.config();
    const std::vector<Catch::TestCase> matched = Catch::filterTests(Catch::getAllTestCasesSorted(cfg), cfg.testSpec(), cfg);
    std::vector<std::string> keep;
    size_t gpu = 0;
    for (const Catch::TestCase& t : matched) {
      if (needs_gpu(t))
        ++gpu;
      else
        keep.push_back(t.name);
    }
    if (gpu > 0) {
      if (const char* req = std::getenv("KILN_REQUIRE_GPU"); req != nullptr && std::string(req) == "1") {
        std::printf("KILN_REQUIRE_GPU=1 and no CUDA device (%s): %zu CUDA test case(s) fail\n", why.c_str(), gpu);
        return 1;
      }
      if (keep.empty()) {
        std::printf("no CUDA device (%s): skipped %zu CUDA test case(s)\n", why.c_str(), gpu);
        return 77;
      }
      std::printf("no CUDA device (%s): leaving out %zu CUDA test case(s)\n", why.c_str(), gpu);
      // The kept tests by exact name (an exclusion such as ~*Cuda* would match case-insensitively and
      // also drop the host tests named "cuda ...").
      Catch::ConfigData data = session.configData();
      std::string spec;
      for (const std::string& n : keep) spec += (spec.empty() ? "" : ",") + escape_name(n);
      data.testsOrTags = {spec};
      session.useConfigData(data);
    }
  }
  return session.run() == 0 ? 0 : 1;
}
