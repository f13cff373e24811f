#include "kiln/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kiln/core/error.hpp"

namespace kiln {

double LrSchedule::at(double lr, int64_t step, int64_t total_steps) const {
  if (name == "constant") return lr;
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double lo = min_lr_ratio * lr;
  const double p = static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (name == "cosine") return lo + 0.5 * (lr - lo) * (1.0 + std::cos(std::numbers::pi * p));
  if (name == "linear") return lr + (lo - lr) * p;
  if (name == "step") {
    KILN_CHECK(step_size >= 1, "lr schedule: step_size must be >= 1, got {}", step_size);
    return lr * std::pow(gamma, static_cast<double>((step - warmup_steps) / step_size));
  }
  fail("lr schedule: unknown name '{}' (valid: constant, linear, cosine, step)", name);
}

}  // namespace kiln
