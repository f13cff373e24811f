#pragma once
// A training progress bar: step/total, loss, lr, tokens/s, GFLOP/s (when the model FLOPs are known) and ETA, redrawn in place on a terminal
// and printed as plain lines when the output is not a terminal (a log file, a pipe): at the first step, every
// `every` steps (default total/20), at the end, and whenever 30 s passed since the last line.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class ProgressBar {
 public:
  // tty: -1 = detect with isatty(out) (what kiln::fit and `kiln train` do), 1 = redraw in place, 0 = plain lines.
  explicit ProgressBar(int64_t total, std::FILE* out = stdout, int tty = -1, int64_t every = 0);
  // step is 0-based; tokens is the number processed by this step, flops its model FLOPs (0: unknown).
  // The rates are averages since the bar started.
  void update(int64_t step, double loss, double lr, int64_t tokens, const std::string& extra = "", double flops = 0);
  void finish();
  // Prints a line of its own (on a terminal, above the bar, which the next update redraws).
  void message(const std::string& line);
  // What update()'s counts are ("tok" by default: "tok/s"; e.g. "samples").
  void set_unit(std::string unit) { unit_ = std::move(unit); }
  // The first step this bar sees (a resumed run): the ETA then comes from the steps actually timed.
  void start_at(int64_t step) { first_ = step0_ = step; }
  // A new total (a time limit's plan shortened the run).
  void set_total(int64_t total) { total_ = total < 1 ? 1 : total; }
  // The line update() draws, without the carriage return (exposed for tests).
  std::string line(int64_t step, double loss, double lr, double tokens_per_s, double eta_s, const std::string& extra,
                   double gflops_per_s = 0) const;

 private:
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  int64_t every_;
  bool open_line_ = false;
  int64_t tokens_ = 0;
  double flops_ = 0;
  int64_t first_ = 0;
  int64_t step0_ = 0;  // the first step: it always prints a line
  double last_line_s_ = 0;
  static constexpr double kLineSeconds = 30;
  std::string unit_ = "tok";
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln
#pragma GCC visibility pop
