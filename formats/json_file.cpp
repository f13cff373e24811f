#include "kiln/formats/json_file.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/formats/printable.hpp"

namespace kiln {

using json = nlohmann::json;

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "cannot read '{}': no such file or not readable", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {                                   // syntax errors, and numbers beyond a double (1e999)
    fail("'{}' is not valid JSON: {}", path, printable(e.what(), 400));  // it quotes the bytes read
  }
}

}  // namespace kiln
