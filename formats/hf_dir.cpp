#include "kiln/formats/hf_dir.hpp"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"

namespace kiln::hf {

namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

}  // namespace

bool is_model_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && exists(path + "/config.json");
}

ModelDir ModelDir::open(const std::string& dir_in) {
  ModelDir d;
  d.dir_ = dir_in;
  while (d.dir_.size() > 1 && d.dir_.back() == '/') d.dir_.pop_back();
  struct stat st {};
  KILN_CHECK(::stat(d.dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "hf: {} is not a directory", d.dir_);
  KILN_CHECK(exists(d.config_path()), "hf: {} has no config.json (not a Hugging Face model directory)", d.dir_);
  d.config_ = std::make_shared<const nlohmann::json>(read_json(d.config_path()));
  KILN_CHECK(d.config_->is_object(), "{}: expected a JSON object", d.config_path());
  const auto arch = d.config_->find("architectures");
  KILN_CHECK(arch != d.config_->end() && arch->is_array() && arch->size() == 1 && (*arch)[0].is_string(),
             "{}: 'architectures' must be a list of one architecture name, got {}", d.config_path(),
             arch == d.config_->end() ? std::string("nothing") : arch->dump());
  d.architecture_ = (*arch)[0].get<std::string>();
  if (exists(d.generation_config_path())) {
    d.generation_config_ = std::make_shared<const nlohmann::json>(read_json(d.generation_config_path()));
    KILN_CHECK(d.generation_config_->is_object(), "{}: expected a JSON object", d.generation_config_path());
  }

  const std::string single = d.dir_ + "/model.safetensors", index = d.dir_ + "/model.safetensors.index.json";
  if (exists(single)) {
    KILN_CHECK(!exists(index), "hf: {} has both model.safetensors and model.safetensors.index.json; which one is the model?", d.dir_);
    d.files_.push_back(safetensors::File::open(single));
    for (const std::string& n : d.files_[0].names()) d.where_[n] = 0;
    return d;
  }
  KILN_CHECK(exists(index),
             "hf: {} has neither model.safetensors nor model.safetensors.index.json (only safetensors weights are read; "
             "pytorch_model.bin is not)",
             d.dir_);
  d.sharded_ = true;
  const nlohmann::json idx = read_json(index);
  const auto wm = idx.is_object() ? idx.find("weight_map") : idx.end();
  KILN_CHECK(wm != idx.end() && wm->is_object() && !wm->empty(), "{}: needs a non-empty object 'weight_map' {{tensor: file}}", index);
  std::map<std::string, size_t> file_index;
  std::map<std::string, std::string> claimed;  // tensor -> shard, from the index
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    KILN_CHECK(it.value().is_string(), "{}: weight_map['{}'] must be a file name, got {}", index, it.key(), it.value().dump());
    const std::string shard = it.value().get<std::string>();
    KILN_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
               "{}: weight_map['{}'] = \"{}\" is not a file name in the directory", index, it.key(), shard);
    if (!file_index.count(shard)) {
      const std::string path = d.dir_ + "/" + shard;
      KILN_CHECK(exists(path), "{}: shard {} (holding '{}') is missing", index, path, it.key());
      file_index[shard] = d.files_.size();
      d.files_.push_back(safetensors::File::open(path));
    }
    claimed[it.key()] = shard;
  }
  for (const auto& [shard, i] : file_index) {
    const safetensors::File& f = d.files_[i];
    for (const std::string& n : f.names()) {
      const auto c = claimed.find(n);
      KILN_CHECK(c != claimed.end(), "{}: tensor '{}' is not in the index {}", f.path(), n, index);
      KILN_CHECK(c->second == shard, "{}: tensor '{}' is also in {}, where the index {} puts it", f.path(), n, c->second, index);
      d.where_[n] = i;
    }
  }
  for (const auto& [n, shard] : claimed)
    KILN_CHECK(d.where_.count(n), "{}: the index {} puts tensor '{}' in this shard, which does not hold it", d.dir_ + "/" + shard, index,
               n);
  return d;
}

std::vector<std::string> ModelDir::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

const safetensors::File& ModelDir::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  KILN_CHECK(it != where_.end(), "hf: {}: no tensor '{}' in {}", dir_, name,
             sharded_ ? "model.safetensors.index.json's shards" : "model.safetensors");
  return files_[it->second];
}

size_t ModelDir::weight_bytes() const {
  size_t n = 0;
  for (const auto& [name, i] : where_) {
    const auto& info = files_[i].info(name);
    n += info.end - info.begin;
  }
  return n;
}

std::vector<int64_t> eos_token_ids(const ModelDir& d) {
  const nlohmann::json& src = d.generation_config() ? *d.generation_config() : d.config();
  const std::string path = d.generation_config() ? d.generation_config_path() : d.config_path();
  std::vector<int64_t> out;
  const auto it = src.find("eos_token_id");
  if (it == src.end() || it->is_null()) return out;
  auto one = [&](const nlohmann::json& v) {
    KILN_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, "{}: 'eos_token_id' must be a token id or a list of them, got {}", path,
               it->dump());
    out.push_back(v.get<int64_t>());
  };
  if (it->is_array())
    for (const auto& v : *it) one(v);
  else
    one(*it);
  return out;
}

}  // namespace kiln::hf
