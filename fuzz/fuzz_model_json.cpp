// model.json (nn/config.cpp, formats/json_fields.hpp): load, resolve (every value checked), and the
// round trip: the config written as JSON reads back as the same config.
#include <nlohmann/json.hpp>

#include <kiln/nn/config.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  try {
    const ModelConfig c = ModelConfig::load(path);
    const nlohmann::json j = c.to_json();
    KILN_FUZZ_ASSERT(ModelConfig::from_json(j).to_json() == j, "model config round trip: {}", j.dump());
    const ModelConfig r = c.resolved();
    KILN_FUZZ_ASSERT(r.n_kv_heads >= 1 && r.ffn_hidden >= 1 && r.d_model >= 1, "resolved config: {}", r.to_json().dump());
    KILN_FUZZ_ASSERT(r.resolved().to_json() == r.to_json(), "resolving twice changes nothing: {}", r.to_json().dump());
  } catch (const Error&) {
  }
  return 0;
}
