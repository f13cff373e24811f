#pragma once
// Reading a JSON file (model.json, train.json, a Hugging Face config.json).
#include <string>

#include <nlohmann/json_fwd.hpp>  // callers that read the value include <nlohmann/json.hpp>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// Reads a JSON file; throws naming the file on a missing file or a syntax error (with line/column).
nlohmann::json read_json_file(const std::string& path);

}  // namespace kiln
#pragma GCC visibility pop
