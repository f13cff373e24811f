#include "kiln/train/checkpoint.hpp"

#include <charconv>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"

namespace kiln {

namespace {

// The whole of `s` as a non-negative integer of type T.
template <class T> T whole_number(const std::string& s, const std::string& path, const char* key) {
  T v{};
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(!s.empty() && ec == std::errc() && p == s.data() + s.size() && v >= 0,
             "checkpoint '{}': metadata '{}' = '{}' is not a non-negative integer", path, key, printable(s, 40));
  return v;
}

nlohmann::json json_value(const std::string& s, const std::string& path, const char* key) {
  const nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  KILN_CHECK(!j.is_discarded(), "checkpoint '{}': metadata '{}' is not valid JSON", path, key);
  return j;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const auto f = safetensors::File::open(path);
  CheckpointInfo c;
  c.metadata = f.metadata();
  const auto& m = c.metadata;
  c.is_checkpoint = m.count("kiln_checkpoint") != 0;
  if (!c.is_checkpoint) return c;
  KILN_CHECK(m.count("model_config"), "checkpoint '{}' holds no GPT model_config (a kiln::fit checkpoint of another model?)", path);
  for (const char* key : {"step", "rng_seed", "rng_offset"}) KILN_CHECK(m.count(key), "checkpoint '{}': no '{}' metadata", path, key);
  c.model = ModelConfig::from_json(json_value(m.at("model_config"), path, "model_config"), path + ": model_config");
  if (m.count("train_config"))
    c.train = TrainConfig::from_json(json_value(m.at("train_config"), path, "train_config"), path + ": train_config");
  c.step = whole_number<int64_t>(m.at("step"), path, "step");
  c.rng_seed = whole_number<uint64_t>(m.at("rng_seed"), path, "rng_seed");
  c.rng_offset = whole_number<uint64_t>(m.at("rng_offset"), path, "rng_offset");
  if (m.count("data")) c.data_path = m.at("data");
  return c;
}

}  // namespace kiln
