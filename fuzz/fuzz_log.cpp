// The JSONL metrics log (docs/formats.md, "The JSONL log") as its two readers see it: read_log, what
// `kiln plot` parses (train/plot.cpp), and truncate_log, what `kiln train --resume` does to the log
// before appending (train/loop.cpp). The two must agree: where read_log accepts a log, trimming it
// before a step keeps exactly the records of the earlier steps, as read_log reads them.
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include <kiln/formats/printable.hpp>
#include <kiln/train/loop.hpp>
#include <kiln/train/plot.hpp>

#include "fuzz.hpp"

using namespace kiln;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// The records of `s` at steps < before.
LogSeries before_step(const LogSeries& s, int64_t before) {
  LogSeries r;
  for (size_t k = 0; k < s.step.size(); ++k) {
    if (s.step[k] >= before) continue;
    r.step.push_back(s.step[k]);
    r.loss.push_back(s.loss[k]);
    r.lr.push_back(s.lr[k]);
    r.grad_norm.push_back(s.grad_norm[k]);
    r.throughput.push_back(s.throughput[k]);
  }
  for (size_t k = 0; k < s.eval_step.size(); ++k)
    if (s.eval_step[k] < before) r.eval_step.push_back(s.eval_step[k]), r.eval_loss.push_back(s.eval_loss[k]);
  return r;
}

void check_series(const LogSeries& s) {
  const size_t n = s.step.size();
  KILN_FUZZ_ASSERT(n > 0, "an accepted log without records");
  KILN_FUZZ_ASSERT(s.loss.size() == n && s.lr.size() == n && s.grad_norm.size() == n && s.throughput.size() == n,
                   "{} steps but {} / {} / {} / {} values", n, s.loss.size(), s.lr.size(), s.grad_norm.size(), s.throughput.size());
  for (size_t k = 0; k < n; ++k)
    KILN_FUZZ_ASSERT(s.step[k] >= 0 && (k == 0 || s.step[k] > s.step[k - 1]), "steps not ascending at {}: {}", k, s.step[k]);
  KILN_FUZZ_ASSERT(s.eval_step.size() == s.eval_loss.size(), "{} eval steps, {} eval losses", s.eval_step.size(), s.eval_loss.size());
  size_t j = 0;
  for (size_t k = 0; k < s.eval_step.size(); ++k) {
    KILN_FUZZ_ASSERT(std::isfinite(s.eval_loss[k]), "eval loss {} at step {}", s.eval_loss[k], s.eval_step[k]);
    if (s.eval_step[k] == -1 && k == 0) continue;  // the evaluation before training: an eval point only
    while (j < n && s.step[j] < s.eval_step[k]) ++j;
    KILN_FUZZ_ASSERT(j < n && s.step[j] == s.eval_step[k], "eval step {} is not a step", s.eval_step[k]);
  }
  KILN_FUZZ_ASSERT(s.throughput_key.empty() || s.throughput_key == "tokens_per_s" || s.throughput_key == "samples_per_s",
                   "throughput key '{}'", s.throughput_key);
}

void check_equal(const LogSeries& a, const LogSeries& b) {
  KILN_FUZZ_ASSERT(a.step == b.step, "trimmed log has steps [{}], the log before the step [{}]", fmt::join(a.step, ","),
                   fmt::join(b.step, ","));
  KILN_FUZZ_ASSERT(a.eval_step == b.eval_step, "eval steps differ after trimming");
  for (size_t k = 0; k < a.step.size(); ++k)
    KILN_FUZZ_ASSERT(same(a.loss[k], b.loss[k]) && same(a.lr[k], b.lr[k]) && same(a.grad_norm[k], b.grad_norm[k]),
                     "step {}: the record changed in trimming", a.step[k]);
  for (size_t k = 0; k < a.eval_step.size(); ++k)
    KILN_FUZZ_ASSERT(same(a.eval_loss[k], b.eval_loss[k]), "eval step {} changed in trimming", a.eval_step[k]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  std::optional<LogSeries> s;
  try {
    s = read_log(path, "run");
    check_series(*s);
  } catch (const Error&) {
  }

  // Trimming before a step from the seeds' range, and before every step.
  const std::string original(reinterpret_cast<const char*>(data), size);
  for (const int64_t before : {int64_t{2}, INT64_MAX}) {
    const std::string trimmed_path = fuzz::file(data, size, "trimmed");
    try {
      fit_detail::truncate_log(trimmed_path, before);
    } catch (const Error&) {
      continue;
    }
    const std::string trimmed = slurp(trimmed_path);
    // Whole lines of the log, in its order, each a JSON object with an integer step < before.
    size_t at = 0;
    std::istringstream lines(trimmed);
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      KILN_FUZZ_ASSERT(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() < before,
                       "kept line '{}' (before {})", printable(line, 80), before);
      const size_t found = original.find(line, at);
      KILN_FUZZ_ASSERT(found != std::string::npos, "kept line '{}' is not a line of the log after byte {}", printable(line, 80), at);
      at = found + line.size();
    }
    KILN_FUZZ_ASSERT(trimmed.empty() || trimmed.back() == '\n', "the trimmed log does not end in a newline");
    // Trimming again changes nothing.
    fit_detail::truncate_log(trimmed_path, before);
    KILN_FUZZ_ASSERT(slurp(trimmed_path) == trimmed, "trimming twice before {} differs from once", before);
    if (!s) continue;
    const LogSeries want = before_step(*s, before);
    try {
      check_equal(read_log(trimmed_path, "run"), want);
    } catch (const Error& e) {
      KILN_FUZZ_ASSERT(want.step.empty(), "read_log rejects the trimmed log of a log it accepted: {}", e.what());
    }
  }
  return 0;
}
