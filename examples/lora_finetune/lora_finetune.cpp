// The measuring half of examples/lora_finetune (run.sh is the whole example): held-out losses of a
// Hugging Face model directory, of that model with a LoRA adapter in PEFT's layout (nn::load_lora), of
// the same model after nn::merge_lora, of the merged model written back as a Hugging Face directory
// (hf::save_pretrained) and read again, and optionally of a fully fine-tuned copy (a state dict from
// `kiln train --init-from DIR --save FILE` without LoRA), each on two held-out sets.
//
//   example_lora_finetune --base DIR --adapter DIR --new FILE --original FILE [flags]
//     --base DIR          the Hugging Face model directory the adapter was trained on
//     --adapter DIR       adapter_model.safetensors + adapter_config.json (kiln train --save DIR with LoRA)
//     --new FILE          held-out text (or token file) of the corpus adapted to
//     --original FILE     held-out text (or token file) of the corpus the base was trained on
//     --full FILE         weights of a full fine-tune (kiln names), evaluated for comparison
//     --merged-out DIR    write the merged model here (a Hugging Face directory, the base's tokenizer)
//     --batches N --batch-size B --seq-len T   evaluation batches, as train.json's eval_batches,
//                         batch_size and seq_len (defaults 8, 16, 128): batch i is TokenData::batch(i),
//                         the batches `kiln train --eval-data` evaluates, so the numbers are the log's
//     --log-eval X        the last eval_loss of the LoRA run's log: base + adapter must give it (1e-4)
//     --max-new-loss X    exit 1 unless base + adapter's loss on --new is below X
//     --json FILE         write the figures as JSON
// Text files are encoded with the base directory's tokenizer, as `kiln train --init-from` does.
// Checks that always apply (exit 1 when one fails): the merged model's losses equal base + adapter's
// within 1e-4 relative (merging reorders float additions; nothing else changes), the exported and
// reloaded merged model gives the merged losses bit for bit (f32 written, f32 read), and LoRA lowers
// the held-out loss on --new.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/hf/export.hpp>
#include <kiln/nn/lora.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/text/tokenizer.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/text.hpp>

using namespace kiln;

namespace {

struct Options {
  std::string base, adapter, new_data, original_data, full, merged_out, json;
  int64_t batches = 8, batch_size = 16, seq_len = 128;
  std::optional<double> log_eval, max_new_loss;
};

Options parse(int argc, char** argv) {
  Options o;
  const std::map<std::string, std::string*> strings = {
      {"--base", &o.base}, {"--adapter", &o.adapter},       {"--new", &o.new_data}, {"--original", &o.original_data},
      {"--full", &o.full}, {"--merged-out", &o.merged_out}, {"--json", &o.json}};
  const std::map<std::string, int64_t*> ints = {{"--batches", &o.batches}, {"--batch-size", &o.batch_size}, {"--seq-len", &o.seq_len}};
  const std::map<std::string, std::optional<double>*> numbers = {{"--log-eval", &o.log_eval}, {"--max-new-loss", &o.max_new_loss}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    KILN_CHECK(i + 1 < argc, "lora_finetune: {} needs a value", flag);
    const std::string value = argv[++i];
    if (auto s = strings.find(flag); s != strings.end()) {
      *s->second = value;
    } else if (auto n = ints.find(flag); n != ints.end()) {
      char* end = nullptr;
      *n->second = std::strtoll(value.c_str(), &end, 10);
      KILN_CHECK(*end == '\0' && *n->second > 0, "lora_finetune: {} must be a positive integer, got '{}'", flag, value);
    } else if (auto x = numbers.find(flag); x != numbers.end()) {
      char* end = nullptr;
      *x->second = std::strtod(value.c_str(), &end);
      KILN_CHECK(*end == '\0', "lora_finetune: {} must be a number, got '{}'", flag, value);
    } else {
      kiln::fail("lora_finetune: unknown flag '{}' (see the comment at the top of examples/lora_finetune/lora_finetune.cpp)", flag);
    }
  }
  for (const auto& [flag, s] :
       {std::pair{"--base", o.base}, {"--adapter", o.adapter}, {"--new", o.new_data}, {"--original", o.original_data}})
    KILN_CHECK(!s.empty(), "lora_finetune: {} is required", flag);
  return o;
}

// A token file, or a text file encoded with the model directory's tokenizer (no BOS/EOS here: the
// byte tokenizer adds none).
TokenData held_out(const std::string& path, const std::string& model_dir) {
  if (path.ends_with(".safetensors")) return TokenData::load(path);
  const auto ids = text::Tokenizer::load(model_dir).encode(read_text_file(path));
  return TokenData(std::vector<int64_t>(ids.begin(), ids.end()), path);
}

// Mean cross-entropy over batches 0..n-1, as kiln::fit evaluates (model.eval(), no gradient).
template <Backend B> double loss_on(hf::CausalLM<B>& model, const TokenData& data, const Options& o) {
  NoGrad ng;
  const bool was_training = model.is_training();
  model.eval();
  data.check_vocab(model.spec().vocab);
  double total = 0;
  for (int64_t i = 0; i < o.batches; ++i) {
    const auto [x, y] = data.batch<B>(i, o.batch_size, o.seq_len);
    total += item<double>(nn::cross_entropy(model.forward(x).reshape({-1, model.spec().vocab}), y.reshape({-1})).value());
  }
  model.train(was_training);
  return total / static_cast<double>(o.batches);
}

struct Row {
  std::string name;
  int64_t trainable = 0, total = 0;  // shown for the fine-tuned rows (0: not shown)
  double new_loss = 0, original_loss = 0;
};

template <Backend B>
Row measure(const std::string& name, hf::CausalLM<B>& model, const TokenData& fresh, const TokenData& original, const Options& o) {
  return {.name = name, .trainable = 0, .total = 0, .new_loss = loss_on(model, fresh, o), .original_loss = loss_on(model, original, o)};
}

bool close(double a, double b, double rtol) { return std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b)); }

template <Backend B> int run(const Options& o) {
  const TokenData fresh = held_out(o.new_data, o.base), original = held_out(o.original_data, o.base);
  std::vector<Row> rows;
  std::vector<std::string> failures;

  auto model = hf::load_causal_lm<B>(o.base);
  rows.push_back(measure("base", *model, fresh, original, o));
  const std::vector<std::string> wrapped = nn::load_lora(*model, o.adapter);
  const nn::LoraOptions lo = nn::read_lora_config(o.adapter + "/adapter_config.json");
  fmt::print("adapter {}: r {}, alpha {}, {} Linears wrapped\n", o.adapter, lo.r, lo.alpha, wrapped.size());
  rows.push_back(measure("base + LoRA adapter", *model, fresh, original, o));
  for (const auto& [n, p] : model->named_parameters()) {  // the adapters (trainable) of the whole model (base + adapters)
    rows.back().total += p.numel();
    rows.back().trainable += p.requires_grad() ? p.numel() : 0;
  }
  const Row with_adapter = rows.back();
  nn::merge_lora(*model);
  rows.push_back(measure("merged (nn::merge_lora)", *model, fresh, original, o));
  if (!o.merged_out.empty()) {
    hf::save_pretrained(*model, o.merged_out, {.dtype = DType::f32, .tokenizer_from = o.base, .overwrite = true});
    auto back = hf::load_causal_lm<B>(o.merged_out);
    rows.push_back(measure("merged, exported, reloaded", *back, fresh, original, o));
    const Row& m = rows[rows.size() - 2];
    if (rows.back().new_loss != m.new_loss || rows.back().original_loss != m.original_loss)
      failures.push_back(fmt::format("the exported merged model gives {:.8f} / {:.8f}, the merged one {:.8f} / {:.8f}",
                                     rows.back().new_loss, rows.back().original_loss, m.new_loss, m.original_loss));
  }
  if (!o.full.empty()) {
    auto full = hf::load_causal_lm<B>(o.base);
    full->load(o.full);
    rows.push_back(measure("full fine-tune", *full, fresh, original, o));
    rows.back().trainable = rows.back().total = full->num_parameters();  // every parameter trained
  }

  fmt::print("\n{:<28} {:>22} {:>15} {:>15}\n", "held-out loss (nats/token)", "trainable / total", "new corpus", "original corpus");
  for (const Row& r : rows) {
    const std::string params = r.total == 0 ? std::string("-")
                                            : fmt::format("{} / {} ({:.1f}%)", r.trainable, r.total,
                                                          100.0 * static_cast<double>(r.trainable) / static_cast<double>(r.total));
    fmt::print("{:<28} {:>22} {:>15.4f} {:>15.4f}\n", r.name, params, r.new_loss, r.original_loss);
  }

  const Row &base = rows[0], &lora = rows[1], &merged = rows[2];
  fmt::print("\nLoRA: new corpus {:.4f} -> {:.4f} ({:+.4f}), original corpus {:.4f} -> {:.4f} ({:+.4f}); {} of {} parameters trained\n",
             base.new_loss, lora.new_loss, lora.new_loss - base.new_loss, base.original_loss, lora.original_loss,
             lora.original_loss - base.original_loss, with_adapter.trainable, with_adapter.total);
  if (!close(merged.new_loss, lora.new_loss, 1e-4) || !close(merged.original_loss, lora.original_loss, 1e-4))
    failures.push_back(fmt::format("merged {:.6f} / {:.6f} differs from base + adapter {:.6f} / {:.6f} by more than 1e-4 relative",
                                   merged.new_loss, merged.original_loss, lora.new_loss, lora.original_loss));
  if (!(lora.new_loss < base.new_loss))
    failures.push_back(
        fmt::format("LoRA did not lower the held-out loss on the new corpus: {:.4f} -> {:.4f}", base.new_loss, lora.new_loss));
  if (o.log_eval && !close(*o.log_eval, lora.new_loss, 1e-4))
    failures.push_back(fmt::format("base + the saved adapter gives {:.6f} on the new corpus; the training log's last eval_loss is {:.6f}",
                                   lora.new_loss, *o.log_eval));
  if (o.max_new_loss && !(lora.new_loss < *o.max_new_loss))
    failures.push_back(
        fmt::format("base + adapter's held-out loss on the new corpus {:.4f} is not below {:.4f}", lora.new_loss, *o.max_new_loss));

  if (!o.json.empty()) {
    nlohmann::json j;
    for (const Row& r : rows)
      j["rows"].push_back(
          {{"name", r.name}, {"trainable", r.trainable}, {"total", r.total}, {"new", r.new_loss}, {"original", r.original_loss}});
    j["lora_trainable"] = with_adapter.trainable;
    j["lora_total"] = with_adapter.total;
    j["failures"] = failures;
    std::FILE* f = std::fopen(o.json.c_str(), "w");
    KILN_CHECK(f != nullptr, "lora_finetune: cannot write '{}'", o.json);
    std::fputs((j.dump(1) + "\n").c_str(), f);
    std::fclose(f);
  }
  for (const std::string& f : failures) std::fprintf(stderr, "lora_finetune: FAILED: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run<Cpu>(parse(argc, argv));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
