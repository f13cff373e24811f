// The test runner's exit status (tests/catch_main.cpp), checked by exit_status.sh through CTest (this
// program is not discovered as tests of its own: tests/CMakeLists.txt). A case with exactly 77 failed
// assertions must exit 1, not 77 (CTest's skip code; Catch2 v2 returns the number of failed assertions);
// a case that needs a GPU ([cuda]) must fail, not skip, under KILN_REQUIRE_GPU=1 where no GPU is usable.
#include <catch2/catch.hpp>

TEST_CASE("runner: 77 failed assertions", "[runner-exit]") {
  for (int i = 0; i < 77; ++i) CHECK(i < 0);
}

TEST_CASE("runner: a case that needs a GPU", "[cuda]") { SUCCEED("ran on a GPU"); }
