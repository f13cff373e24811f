#pragma once
// Learning-rate schedules (docs/specs.md §4), as a pure function of the step:
//   warmup:  lr·(s+1)/W for s < W (not for "constant")
//   then p = (s − W) / max(1, steps − W), lo = min_lr_ratio·lr and
//   constant: lr · cosine: lo + ½(lr − lo)(1 + cos πp) · linear: lr + (lo − lr)p
//   step: lr · gamma^⌊(s − W) / step_size⌋
#include <cstdint>
#include <string>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct LrSchedule {
  std::string name = "constant";  // constant | linear | cosine | step
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  int64_t step_size = 1;
  double gamma = 0.1;

  // The learning rate at 0-based step `step` of a run of `total_steps`, for peak rate `lr`.
  double at(double lr, int64_t step, int64_t total_steps) const;
};

}  // namespace kiln
#pragma GCC visibility pop
