#pragma once
// A Hugging Face model directory as files (https://huggingface.co/docs/transformers/main_classes/model):
//   config.json                    the architecture and its hyperparameters (required)
//   generation_config.json         generation defaults: eos_token_id, do_sample, temperature, ... (optional)
//   model.safetensors              the weights, or
//   model.safetensors.index.json   {"weight_map": {tensor: shard file}} and the shards it names
// Every safetensors file is memory-mapped and validated (formats/safetensors.hpp); nothing is read into
// memory until a tensor is asked for. Sharded checkpoints are checked against their index: a shard that
// is missing, a tensor the index names that its shard lacks, a tensor a shard holds that the index does
// not name (or names in another shard), and a tensor in two shards are each a kiln::Error naming the
// files and the tensor. Turning the tensors into a model is nn/hf's job (nn/hf/causal_lm.hpp).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kiln/formats/safetensors.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::hf {

class ModelDir {
 public:
  // Reads config.json (and generation_config.json when present) and maps the weights.
  static ModelDir open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  std::string generation_config_path() const { return dir_ + "/generation_config.json"; }
  const nlohmann::json& config() const { return *config_; }
  // null when the directory has no generation_config.json.
  const nlohmann::json* generation_config() const { return generation_config_.get(); }
  // config.json's "architectures"[0] (a single entry; several is an error).
  const std::string& architecture() const { return architecture_; }

  bool sharded() const { return sharded_; }
  std::vector<std::string> tensor_names() const;  // sorted, over every file
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The file that holds a tensor (throws naming the tensor and the directory when none does).
  const safetensors::File& file_of(const std::string& name) const;
  const std::vector<safetensors::File>& files() const { return files_; }
  size_t weight_bytes() const;  // sum of the tensors' sizes as stored

 private:
  std::string dir_, architecture_;
  std::shared_ptr<const nlohmann::json> config_, generation_config_;
  bool sharded_ = false;
  std::vector<safetensors::File> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
};

// True when `path` is a directory with a config.json (what `kiln generate` takes for a Hugging Face model).
bool is_model_dir(const std::string& path);

// The end-of-sequence ids a model directory declares: generation_config.json's eos_token_id when that
// file exists (as transformers' generate() reads it), else config.json's; an int or a list of ints.
std::vector<int64_t> eos_token_ids(const ModelDir& d);

}  // namespace kiln::hf
#pragma GCC visibility pop
