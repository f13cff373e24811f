// train.json (train/config.cpp): load, validate, and the round trip through JSON.
#include <cmath>

#include <nlohmann/json.hpp>

#include <kiln/train/config.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  try {
    const TrainConfig c = TrainConfig::load(path);
    c.validate();
    const nlohmann::json j = c.to_json();
    KILN_FUZZ_ASSERT(TrainConfig::from_json(j).to_json() == j, "train config round trip: {}", j.dump());
    // the schedule of a valid config gives a finite, non-negative lr at every step
    for (int64_t s : {int64_t{0}, c.steps / 2, c.steps - 1}) {
      const double lr = c.schedule.at(c.optimizer.lr, s, c.steps);
      KILN_FUZZ_ASSERT(std::isfinite(lr) && lr >= 0, "lr at step {} is {} ({})", s, lr, j.dump());
    }
  } catch (const Error&) {
  }
  return 0;
}
