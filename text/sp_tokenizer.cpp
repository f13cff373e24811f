// tokenizer.model (SentencePiece, BPE or unigram) through Debian's libsentencepiece, with BOS/EOS and
// decoding as transformers' LlamaTokenizer (the slow tokenizer Llama 2 and Mistral ship the model for):
// ids = [bos if add_bos_token] + sp.encode(text) + [eos if add_eos_token]; the text of special tokens
// in the input is encoded as text (as sentencepiece itself does), not matched as special tokens.
#include <sentencepiece_processor.h>

#include <set>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/text/detail.hpp"

namespace kiln::text::detail {
namespace {

using json = nlohmann::json;

class SpTokenizer : public Tokenizer::Impl {
 public:
  SpTokenizer(const std::string& model_path, const std::string& config_path) {
    path = model_path;
    const std::string bytes = read_file(model_path);
    KILN_CHECK(!bytes.empty(), "tokenizer: {}: the file is empty", model_path);
    const auto st = sp_.LoadFromSerializedProto(bytes);
    KILN_CHECK(st.ok(), "tokenizer: {}: not a SentencePiece model (truncated or corrupt?): {}", model_path, st.ToString());
    vocab_size = sp_.GetPieceSize();
    KILN_CHECK(vocab_size > 0, "tokenizer: {}: the model has no pieces", model_path);
    if (sp_.bos_id() >= 0) bos = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos = sp_.eos_id();
    if (sp_.unk_id() >= 0) unk = sp_.unk_id();
    for (const auto& i : {bos, eos, unk})  // LlamaTokenizer's special tokens, until tokenizer_config.json names them
      if (i) special_pieces_.insert(sp_.IdToPiece(*i));
    if (!config_path.empty()) read_config(config_path);
    KILN_CHECK(!add_bos_ || bos, "tokenizer: {}: add_bos_token is true but the model has no BOS piece", model_path);
    KILN_CHECK(!add_eos_ || eos, "tokenizer: {}: add_eos_token is true but the model has no EOS piece", model_path);
    description = fmt::format("tokenizer.model (sentencepiece, {} pieces)", vocab_size);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    const size_t valid = utf8_valid_prefix(text);
    KILN_CHECK(valid == text.size(), "tokenizer encode: the text is not valid UTF-8 (byte {} of {})", valid, text.size());
    std::vector<int> pieces;
    const auto st = sp_.Encode(std::string_view(text), &pieces);
    KILN_CHECK(st.ok(), "tokenizer encode ({}): {}", path, st.ToString());
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + 2);
    if (add_special_tokens && add_bos_) ids.push_back(*bos);
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    if (add_special_tokens && add_eos_) ids.push_back(*eos);
    return ids;
  }

  // LlamaTokenizer.convert_tokens_to_string (transformers 4.46), after skipping special tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    static const std::string kSpace = "\xE2\x96\x81";  // ▁
    std::vector<std::string> tokens;
    for (const int32_t id : ids)
      if (!(skip_special_tokens && is_special(id))) tokens.push_back(sp_.IdToPiece(id));
    if (tokens.empty()) return {};
    if (add_prefix_space_ && tokens[0].rfind(kSpace, 0) == 0) tokens[0] = tokens[0].substr(kSpace.size());
    std::string out;
    std::vector<std::string> current;
    bool prev_special = false;
    auto sp_decode = [&](const std::vector<std::string>& pieces) {
      std::string s;
      const auto st = sp_.Decode(pieces, &s);
      KILN_CHECK(st.ok(), "tokenizer decode ({}): {}", path, st.ToString());
      return s;
    };
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      if (special_pieces_.count(t)) {
        if (!prev_special && i != 0 && legacy_) out += ' ';
        out += sp_decode(current) + t;
        prev_special = true;
        current.clear();
      } else {
        if (prev_special && i == 1 && add_prefix_space_ && t.rfind(kSpace, 0) != 0) out += ' ';
        current.push_back(t);
        prev_special = false;
      }
    }
    return out + sp_decode(current);
  }

  std::string token(int32_t id) const override { return sp_.IdToPiece(id); }
  std::optional<int32_t> id(std::string_view piece) const override {
    const int id = sp_.PieceToId(std::string_view(piece));
    if (id < 0 || sp_.IdToPiece(id) != piece) return std::nullopt;
    return id;
  }
  bool is_special(int32_t id) const override { return special_pieces_.count(sp_.IdToPiece(id)) != 0; }

 private:
  void read_config(const std::string& config_path) {
    json c;
    try {
      c = json::parse(read_file(config_path));
    } catch (const json::parse_error& e) {
      fail("tokenizer: {}: not valid JSON (truncated or corrupt?) at byte {}: {}", config_path, e.byte, e.what());
    }
    KILN_CHECK(c.is_object(), "tokenizer: {}: must be a JSON object", config_path);
    auto flag = [&](const char* key, bool def) {
      if (!c.contains(key) || c.at(key).is_null()) return def;
      KILN_CHECK(c.at(key).is_boolean(), "tokenizer: {}: {} must be true or false", config_path, key);
      return c.at(key).get<bool>();
    };
    add_bos_ = flag("add_bos_token", true);
    add_eos_ = flag("add_eos_token", false);
    legacy_ = flag("legacy", true);
    add_prefix_space_ = flag("add_prefix_space", true);
    KILN_CHECK(!flag("clean_up_tokenization_spaces", false),
               "tokenizer: {}: clean_up_tokenization_spaces = true is not supported for a SentencePiece model", config_path);
    // The special tokens' names (LlamaTokenizer's bos/eos/unk/pad) must be pieces of the model.
    special_pieces_.clear();
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      if (!c.contains(key) || c.at(key).is_null()) continue;
      const json& v = c.at(key);
      std::string name;
      if (v.is_string())
        name = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v.at("content").is_string())
        name = v.at("content").get<std::string>();
      else
        fail("tokenizer: {}: {} must be a token (a string or {{\"content\": ...}})", config_path, key);
      const auto i = id(name);
      KILN_CHECK(i.has_value(), "tokenizer: {}: {} '{}' is not a piece of {}", config_path, key, name, path);
      special_pieces_.insert(name);
      if (std::string(key) == "bos_token") bos = *i;
      if (std::string(key) == "eos_token") eos = *i;
      if (std::string(key) == "unk_token") unk = *i;
    }
    if (c.contains("bos_token") && c.at("bos_token").is_null()) bos.reset();
    if (c.contains("eos_token") && c.at("eos_token").is_null()) eos.reset();
  }

  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false, legacy_ = true, add_prefix_space_ = true;
  std::set<std::string> special_pieces_;
};

}  // namespace

std::shared_ptr<const Tokenizer::Impl> load_sentencepiece(const std::string& model_path, const std::string& config_path) {
  return std::make_shared<SpTokenizer>(model_path, config_path);
}

}  // namespace kiln::text::detail
