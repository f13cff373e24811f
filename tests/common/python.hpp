#pragma once
// The Python interpreter (with PyTorch) that the reference and parity tests run: KILN_PYTHON from the
// environment where set (a GPU machine whose PyTorch lives in a virtual environment), else Debian's
// /usr/bin/python3 with python3-torch (scripts/setup.sh --python).
#include <cstdlib>
#include <string>

namespace kiln::test {

inline std::string python() {
  const char* e = std::getenv("KILN_PYTHON");
  return e && *e ? e : "/usr/bin/python3";
}

}  // namespace kiln::test
