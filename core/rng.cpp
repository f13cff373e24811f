#include "kiln/core/rng.hpp"

namespace kiln {

Generator& default_generator() {
  thread_local Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
