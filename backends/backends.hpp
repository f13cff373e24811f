#pragma once
// The built-in backends, for explicit instantiation of generic code (autograd, nn, optim):
//   #define X(B) template class Linear<B>;
//   KILN_FOR_EACH_BACKEND(X)
// and as a type list (e.g. Catch's TEMPLATE_TEST_CASE(..., KILN_BACKEND_TYPES)).
#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/backends/reference/reference.hpp"
#include "kiln/config.hpp"
#if defined(KILN_REFERENCE_ONLY)  // a reduced build of the readers alone (fuzz/): Reference only
#define KILN_FOR_EACH_BACKEND(X) X(::kiln::Reference)
#define KILN_BACKEND_TYPES ::kiln::Reference
#elif !defined(KILN_HAVE_REFERENCE_BACKEND)  // -DKILN_WITH_REFERENCE=OFF (CMake: never with Cuda): the main job's lean build
#define KILN_FOR_EACH_BACKEND(X) X(::kiln::Cpu)
#define KILN_BACKEND_TYPES ::kiln::Cpu
#elif defined(KILN_HAVE_CUDA_BACKEND)
#include "kiln/backends/cuda/cuda.hpp"
#define KILN_FOR_EACH_BACKEND(X) X(::kiln::Reference) X(::kiln::Cpu) X(::kiln::Cuda)
#define KILN_BACKEND_TYPES ::kiln::Reference, ::kiln::Cpu, ::kiln::Cuda
#else
#define KILN_FOR_EACH_BACKEND(X) X(::kiln::Reference) X(::kiln::Cpu)
#define KILN_BACKEND_TYPES ::kiln::Reference, ::kiln::Cpu
#endif
