#pragma once
// What a `kiln train` checkpoint says about itself (docs/formats.md, "Weights files and checkpoints"):
// the metadata of its safetensors header, read and checked without loading a tensor.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kiln/nn/config.hpp"
#include "kiln/train/config.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct CheckpointInfo {
  ModelConfig model;
  std::optional<TrainConfig> train;
  int64_t step = 0;
  uint64_t rng_seed = 0, rng_offset = 0;
  std::string data_path;
  std::map<std::string, std::string> metadata;
  bool is_checkpoint = false;  // false: a plain weights file (the reference's --save)
};

// Reads a checkpoint's metadata; a plain weights file gives is_checkpoint = false. A malformed
// checkpoint (a config that is not valid JSON or not a valid config, a step or RNG state that is not
// a non-negative integer) is a kiln::Error naming the file and the key.
CheckpointInfo read_checkpoint_info(const std::string& path);

}  // namespace kiln
#pragma GCC visibility pop
