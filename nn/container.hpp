#pragma once
// Containers, as torch.nn.Sequential and torch.nn.ModuleList: submodules registered under "0", "1", ...
// (or a name of your choice), so a model's parameters read "features.0.weight" as in PyTorch, and
// train()/eval(), state_dict() and save()/load() reach every module inside.
//
//   auto features = std::make_shared<nn::Sequential<B>>(
//       std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = 4, .out = 8, .bias = true}),
//       std::make_shared<nn::ReLU<B>>(),
//       std::make_shared<nn::BatchNorm1d<B>>(nn::BatchNormOptions{.num_features = 8}));
//   features->push_back(std::make_shared<nn::Dropout<B>>(0.1));     // registered as "3"
//   Var<B> y = features->forward(x);                                 // each module's forward, in order
//   auto lin = features->at<nn::Linear<B>>(0);                       // typed access; Error on a wrong type
//
// Modules have no virtual forward (module.hpp), so Sequential keeps, beside each module, a call of its
// `Var<B> forward(const Var<B>&) const`: any Module<B> subclass with that member can be pushed.
// # Shapes
//   Sequential: whatever the first module takes -> whatever the last returns (empty: the input)
#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// A module Sequential can chain: derives from Module<B> and has `Var<B> forward(const Var<B>&) const`.
template <class M, class B>
concept SequentialModule = std::is_base_of_v<Module<B>, M> && requires(const M& m, const Var<B>& x) {
  { m.forward(x) } -> std::convertible_to<Var<B>>;
};

namespace detail {
std::string demangle(const char* name);  // "kiln::nn::Linear<kiln::Cpu>" from typeid(...).name()
// The position `i` (negative counts from the end, as Python) in [0, size); Error naming the container.
size_t container_index(const char* what, int64_t i, size_t size);
}  // namespace detail

template <Backend B> class Sequential : public Module<B> {
 public:
  using iterator = typename std::vector<std::shared_ptr<Module<B>>>::const_iterator;

  Sequential() = default;
  template <class... Ms>
  requires(sizeof...(Ms) > 0 && (SequentialModule<Ms, B> && ...)) explicit Sequential(std::shared_ptr<Ms>... ms) {
    (push_back(std::move(ms)), ...);
  }

  // Appends m under the name "<size()>" (or `name`); returns m.
  template <class M>
  requires SequentialModule<M, B> std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    return push_back(std::to_string(modules_.size()), std::move(m));
  }
  template <class M>
  requires SequentialModule<M, B> std::shared_ptr<M> push_back(const std::string& name, std::shared_ptr<M> m) {
    KILN_CHECK(m != nullptr, "Sequential::push_back: module '{}' is null", name);
    this->register_module(name, m);
    const M* raw = m.get();
    calls_.emplace_back([raw](const Var<B>& x) -> Var<B> { return raw->forward(x); });
    modules_.push_back(m);
    names_.push_back(name);
    return m;
  }

  // x through every module in order.
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // The i-th module (negative i counts from the end); Error when out of range.
  const std::shared_ptr<Module<B>>& operator[](int64_t i) const {
    return modules_[detail::container_index("Sequential", i, modules_.size())];
  }
  // The i-th module as an M; Error naming both types when it is not one.
  template <class M> std::shared_ptr<M> at(int64_t i) const {
    const size_t k = detail::container_index("Sequential", i, modules_.size());
    auto p = std::dynamic_pointer_cast<M>(modules_[k]);
    KILN_CHECK(p != nullptr, "Sequential::at: module {} ('{}') is a {}, not a {}", i, names_[k],
               detail::demangle(typeid(*modules_[k]).name()), detail::demangle(typeid(M).name()));
    return p;
  }
  const std::string& name(int64_t i) const { return names_[detail::container_index("Sequential", i, names_.size())]; }
  iterator begin() const { return modules_.begin(); }
  iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module<B>>> modules_;
  std::vector<std::string> names_;
  std::vector<std::function<Var<B>(const Var<B>&)>> calls_;
};

// A list of submodules registered as "0", "1", ...; no forward (the owner decides how to call them).
template <Backend B> class ModuleList : public Module<B> {
 public:
  using iterator = typename std::vector<std::shared_ptr<Module<B>>>::const_iterator;

  ModuleList() = default;
  template <class... Ms>
  requires(sizeof...(Ms) > 0 && (std::is_base_of_v<Module<B>, Ms> && ...)) explicit ModuleList(std::shared_ptr<Ms>... ms) {
    (push_back(std::move(ms)), ...);
  }

  template <class M> std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    static_assert(std::is_base_of_v<Module<B>, M>, "ModuleList::push_back: M must derive from nn::Module<B>");
    KILN_CHECK(m != nullptr, "ModuleList::push_back: module {} is null", modules_.size());
    this->register_module(std::to_string(modules_.size()), m);
    modules_.push_back(m);
    return m;
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module<B>>& operator[](int64_t i) const {
    return modules_[detail::container_index("ModuleList", i, modules_.size())];
  }
  template <class M> std::shared_ptr<M> at(int64_t i) const {
    const size_t k = detail::container_index("ModuleList", i, modules_.size());
    auto p = std::dynamic_pointer_cast<M>(modules_[k]);
    KILN_CHECK(p != nullptr, "ModuleList::at: module {} is a {}, not a {}", i, detail::demangle(typeid(*modules_[k]).name()),
               detail::demangle(typeid(M).name()));
    return p;
  }
  iterator begin() const { return modules_.begin(); }
  iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module<B>>> modules_;
};

#define KILN_EXTERN(B)                 \
  extern template class Sequential<B>; \
  extern template class ModuleList<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
