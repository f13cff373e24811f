#include "kiln/train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kiln {

namespace {
std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{:02}:{:02}", t / 60, t % 60);
}
std::string si(double x) {
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}
}  // namespace

ProgressBar::ProgressBar(int64_t total, std::FILE* out, int tty, int64_t every)
    : total_(std::max<int64_t>(total, 1)),
      out_(out),
      tty_(tty < 0 ? ::isatty(::fileno(out)) != 0 : tty != 0),
      every_(every > 0 ? every : std::max<int64_t>(1, total / 20)),
      start_(std::chrono::steady_clock::now()) {}

std::string ProgressBar::line(int64_t step, double loss, double lr, double tps, double eta, const std::string& extra, double gflops) const {
  const int64_t done = step + 1;
  const int width = 24;
  const int fill = static_cast<int>(width * std::min<int64_t>(done, total_) / total_);
  std::string bar =
      tty_ ? "[" + std::string(static_cast<size_t>(fill), '#') + std::string(static_cast<size_t>(width - fill), '.') + "] " : "";
  std::string s = fmt::format("{}{}/{} loss {:.4f} lr {:.2e} {} {}/s", bar, done, total_, loss, lr, si(tps), unit_);
  if (gflops > 0) s += fmt::format(" {:.1f} GFLOP/s", gflops);
  s += " ETA " + hms(eta);
  if (!extra.empty()) s += " " + extra;
  return s;
}

void ProgressBar::update(int64_t step, double loss, double lr, int64_t tokens, const std::string& extra, double flops) {
  tokens_ += tokens;
  flops_ += flops;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double tps = el > 0 ? static_cast<double>(tokens_) / el : 0.0;
  const double per_step = el / static_cast<double>(std::max<int64_t>(1, step + 1 - first_));
  const double eta = per_step * static_cast<double>(total_ - step - 1);
  const std::string l = line(step, loss, lr, tps, eta, extra, el > 0 ? flops_ / el / 1e9 : 0.0);
  if (tty_) {
    fmt::print(out_, "\r{}\x1b[K", l);
    open_line_ = true;
  } else if ((step + 1) % every_ == 0 || step + 1 == total_ || step == step0_ || el - last_line_s_ >= kLineSeconds) {
    fmt::print(out_, "{}\n", l);
    last_line_s_ = el;
  }
  std::fflush(out_);
}

void ProgressBar::message(const std::string& line) {
  if (open_line_) fmt::print(out_, "\r\x1b[K");
  fmt::print(out_, "{}\n", line);
  open_line_ = false;
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (open_line_) fmt::print(out_, "\n");
  open_line_ = false;
  std::fflush(out_);
}

}  // namespace kiln
