#pragma once
// Training curves from JSONL logs (docs/formats.md, "The JSONL log"), drawn by gnuplot (Debian package
// gnuplot-nox) into one PNG: four panels against the step, train and eval loss, learning rate, gradient
// norm (before clipping) and throughput (tokens/s, or samples/s), with every run overlaid and labelled.
//
//   kiln::plot_logs({.logs = {"a/log.jsonl", "b/log.jsonl"}, .labels = {"mha", "diff"}, .out = "curves.png"});
//   kiln plot --log a/log.jsonl --label mha --log b/log.jsonl --label diff --out curves.png
//
// A log line is one JSON object with an integer "step" (-1: kiln::fit's evaluation before training, an
// eval point only); the keys used are "loss", "eval_loss", "lr",
// "grad_norm" and "tokens_per_s" (else "samples_per_s"); others are ignored. A resumed run that
// re-logged steps keeps the last record of each step. The PNG is written to a temporary file and
// renamed, so a failed plot never leaves a half-written image.
#include <cstdint>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct PlotOptions {
  std::vector<std::string> logs = {};    // JSONL files, one run each
  std::vector<std::string> labels = {};  // one per log, or empty: the log's parent folder name, else its file name
  std::string out = {};                  // the PNG to write
  std::string title = {};                // above the panels ("" = none)
  int width = 1400, height = 1000;       // pixels
  std::string gnuplot = "gnuplot";       // the program to run (a name on PATH or a path)
};

// One run's records, as plot_logs reads them (exposed for tests and for users' own reports).
struct LogSeries {
  std::string label;
  std::vector<int64_t> step;                            // every record of a step >= 0, ascending, unique
  std::vector<double> loss, lr, grad_norm, throughput;  // NaN where a record lacks the key
  std::vector<int64_t> eval_step;                       // records with "eval_loss" (-1 first: before training)
  std::vector<double> eval_loss;
  std::string throughput_key;  // "tokens_per_s", "samples_per_s" or "" (none in the log)
};
LogSeries read_log(const std::string& path, const std::string& label = "");

// Draws the curves; throws kiln::Error naming the file (and line) of a bad log, or gnuplot's message.
void plot_logs(const PlotOptions& o);

}  // namespace kiln
#pragma GCC visibility pop
