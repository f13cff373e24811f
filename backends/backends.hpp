#pragma once
// The built-in backends, for explicit instantiation of generic code (autograd, nn, optim):
//   #define X(B) template class Linear<B>;
//   KILN_FOR_EACH_BACKEND(X)
#include "backends/cpu/cpu.hpp"
#include "backends/reference/reference.hpp"

#define KILN_FOR_EACH_BACKEND(X) X(::kiln::Reference) X(::kiln::Cpu)
