// The runner of tests/dist: Catch2 inside a kiln::dist group. Under mpirun every rank runs the same
// test cases in the same order (each is collective); the job fails when any rank fails.
//   test_dist [catch args]             dist::init() first (a group of one without mpirun)
//   test_dist --no-init [catch args]   no init: the [uninit] cases
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <kiln/dist/process_group.hpp>

int main(int argc, char* argv[]) {
  std::vector<char*> args;
  bool init = true;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-init") == 0)
      init = false;
    else
      args.push_back(argv[i]);
  }
  if (init) kiln::dist::init();
  Catch::Session session;
  if (const int rc = session.applyCommandLine(static_cast<int>(args.size()), args.data()); rc != 0) return rc;
  const int failed = session.run();
  if (init) kiln::dist::finalize();  // (a failing rank's non-zero exit aborts the job instead)
  return failed > 0 ? 1 : 0;
}
