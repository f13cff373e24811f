#pragma once
// A planted upward include: the floors check must name this line (tests/floors/CMakeLists.txt).
#include "kiln/core/tensor.hpp"
#include "kiln/train/loop.hpp"
