#include "kiln/nn/module.hpp"

#include <algorithm>
#include <set>

#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"

namespace kiln::nn {

template <Backend B> void Module<B>::check_name(const std::string& name, const char* op) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, "{}: invalid name '{}' (non-empty, no '.')", op, name);
  const bool taken = std::any_of(params_.begin(), params_.end(), [&](const auto& p) { return p.first == name; }) ||
                     std::any_of(buffers_.begin(), buffers_.end(), [&](const auto& b) { return b.name == name; }) ||
                     std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  KILN_CHECK(!taken, "{}: name '{}' is already registered in this module", op, name);
}

template <Backend B> Var<B> Module<B>::register_parameter(const std::string& name, Tensor<B> value, bool requires_grad) {
  check_name(name, "register_parameter");
  KILN_CHECK(value.defined(), "register_parameter: '{}' is undefined", name);
  KILN_CHECK(is_floating(value.dtype()), "register_parameter: '{}' must be floating point, got {}", name, value.dtype());
  Var<B> v(value.contiguous(), requires_grad);
  params_.emplace_back(name, v);
  return v;
}

template <Backend B> Tensor<B> Module<B>::register_buffer(const std::string& name, Tensor<B> value, bool persistent) {
  check_name(name, "register_buffer");
  buffers_.push_back({name, value, persistent});
  return value;
}

template <Backend B> const Tensor<B>& Module<B>::buffer(const std::string& name) const {
  for (const Buffer& b : buffers_)
    if (b.name == name) return b.value;
  fail("buffer: this module has no buffer '{}'", name);
}

template <Backend B> void Module<B>::collect_params(const std::string& prefix, std::vector<std::pair<std::string, Var<B>>>& out) const {
  for (const auto& [n, p] : params_) out.emplace_back(prefix + n, p);
  for (const auto& [n, c] : children_) c->collect_params(prefix + n + ".", out);
}

template <Backend B> void Module<B>::collect_buffers(const std::string& prefix, bool persistent_only,
                                                     std::vector<std::pair<std::string, Tensor<B>>>& out) const {
  for (const Buffer& b : buffers_)
    if (!persistent_only || b.persistent) out.emplace_back(prefix + b.name, b.value);
  for (const auto& [n, c] : children_) c->collect_buffers(prefix + n + ".", persistent_only, out);
}

template <Backend B> std::vector<std::pair<std::string, Var<B>>> Module<B>::named_parameters() const {
  std::vector<std::pair<std::string, Var<B>>> out;
  collect_params("", out);
  return out;
}

template <Backend B> std::vector<Var<B>> Module<B>::parameters() const {
  std::vector<Var<B>> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> Module<B>::named_buffers() const {
  std::vector<std::pair<std::string, Tensor<B>>> out;
  collect_buffers("", false, out);
  return out;
}

template <Backend B> std::vector<std::pair<std::string, const Module<B>*>> Module<B>::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out{{"", this}};
  for (const auto& [n, c] : children_)
    for (auto& [sub, m] : c->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, m);
  return out;
}

template <Backend B> void Module<B>::remove_module(const std::string& name) {
  const auto it = std::find_if(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  KILN_CHECK(it != children_.end(), "remove_module: no submodule '{}'", name);
  children_.erase(it);
}

template <Backend B> int64_t Module<B>::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

template <Backend B> Var<B> Module<B>::parameter(const std::string& name) const {
  std::vector<std::string> names;
  for (auto& [n, p] : named_parameters()) {
    if (n == name) return p;
    names.push_back(n);
  }
  fail("parameter: no parameter '{}' (the module has {} parameters{}{})", name, names.size(), names.empty() ? "" : ": ",
       fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(names.size(), 12)), ", "));
}

template <Backend B> void Module<B>::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& [n, c] : children_) c->train(on);
}

template <Backend B> void Module<B>::zero_grad() {
  for (auto& [n, p] : named_parameters()) p.zero_grad();
}

template <Backend B> void Module<B>::requires_grad_(bool on) {
  for (auto& [n, p] : named_parameters()) p.requires_grad_(on);
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> Module<B>::state_dict() const {
  std::vector<std::pair<std::string, Tensor<B>>> out;
  for (auto& [n, p] : named_parameters()) out.emplace_back(n, p.value());
  collect_buffers("", true, out);
  return out;
}

template <Backend B> void Module<B>::load_state_dict(const std::map<std::string, Tensor<B>>& state, bool strict) {
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> known;
  std::vector<std::pair<Tensor<B>, const Tensor<B>*>> copies;
  for (auto& [n, t] : state_dict()) {
    known.insert(n);
    const auto it = state.find(n);
    if (it == state.end()) {
      missing.push_back(n);
      continue;
    }
    if (it->second.shape() != t.shape()) {
      mismatched.push_back(fmt::format("{}: {} in the state, {} in the model", n, shape_str(it->second.shape()), shape_str(t.shape())));
      continue;
    }
    copies.emplace_back(t, &it->second);
  }
  for (const auto& [n, t] : state)
    if (!known.count(n)) unexpected.push_back(n);
  const bool bad = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::string msg = "load_state_dict: the weights do not match the model:";
    if (!missing.empty()) msg += fmt::format(" missing {} [{}];", missing.size(), fmt::join(missing, ", "));
    if (!unexpected.empty()) msg += fmt::format(" unexpected {} [{}];", unexpected.size(), fmt::join(unexpected, ", "));
    if (!mismatched.empty()) msg += fmt::format(" wrong shape {} [{}];", mismatched.size(), fmt::join(mismatched, "; "));
    msg.pop_back();
    throw Error(msg);
  }
  NoGrad ng;
  for (auto& [dst, src] : copies) dst.copy_(*src);  // all checks passed: nothing is half-loaded
}

template <Backend B> void Module<B>::save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  safetensors::save<B>(path, state_dict(), metadata);
}

template <Backend B> void Module<B>::load(const std::string& path, bool strict) {
  try {
    load_state_dict(safetensors::load<B>(path), strict);
  } catch (const Error& e) {
    fail("{} ('{}')", printable(e.what(), std::string::npos), path);  // it may quote the file's tensor names
  }
}

template <Backend B> void Module<B>::to(DType dtype) {
  KILN_CHECK(is_floating(dtype), "Module::to: parameters must be floating point, got {}", dtype);
  for (auto& [n, p] : params_) {
    auto& node = *p.node();
    node.value = node.value.to(dtype).contiguous();
    if (node.grad.defined()) node.grad = node.grad.to(dtype);
  }
  for (Buffer& b : buffers_)
    if (b.value.defined() && is_floating(b.value.dtype())) b.value = b.value.to(dtype).contiguous();
  for (auto& [n, c] : children_) c->to(dtype);
}

#define KILN_INST(B) template class Module<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
