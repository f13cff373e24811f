// Checkpoint metadata (train/checkpoint.cpp): read_checkpoint_info parses the model and train
// configs and the step / RNG state out of a safetensors header.
#include <nlohmann/json.hpp>

#include <kiln/train/checkpoint.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  try {
    const CheckpointInfo c = read_checkpoint_info(path);
    if (c.is_checkpoint) {
      KILN_FUZZ_ASSERT(c.step >= 0, "step {}", c.step);
      (void)c.model.resolved();  // may throw kiln::Error: a checkpoint of an invalid model
      if (c.train) c.train->validate();
    }
  } catch (const Error&) {
  }
  return 0;
}
