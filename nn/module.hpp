#pragma once
// Module<B>: the base of every layer. Parameters, buffers and submodules are registered by name, so
// named_parameters() yields dotted PyTorch names ("layers.0.attn.q_proj.weight") in registration order
// (a module's own parameters first, then each submodule's), and a state dict round-trips through
// safetensors unchanged.
//
//   template <Backend B> class Scale : public nn::Module<B> {
//    public:
//     explicit Scale(int64_t n) { w_ = this->register_parameter("weight", Tensor<B>::ones({n})); }
//     Var<B> forward(const Var<B>& x) const { return x * w_; }
//    private:
//     Var<B> w_;
//   };
//
// Forward signatures differ between layers, so there is no virtual forward (as in LibTorch).
// Modules are not copyable: share them with std::shared_ptr.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

template <Backend B> class Module {
 public:
  using backend = B;
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ------------------------------------------------------------------------------ traversal
  std::vector<std::pair<std::string, Var<B>>> named_parameters() const;
  std::vector<Var<B>> parameters() const;
  std::vector<std::pair<std::string, Tensor<B>>> named_buffers() const;
  // Every module below (and including) this one, with its dotted prefix ("" for this one).
  std::vector<std::pair<std::string, const Module*>> named_modules() const;
  int64_t num_parameters() const;
  // The parameter with this dotted name; throws listing near names if there is none.
  Var<B> parameter(const std::string& name) const;

  // ------------------------------------------------------------------------------ modes and grads
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();
  void requires_grad_(bool on);  // freeze/unfreeze every parameter

  // ------------------------------------------------------------------------------ state
  // Parameters and persistent buffers by dotted name.
  std::vector<std::pair<std::string, Tensor<B>>> state_dict() const;
  // Copies values into the existing tensors (so optimizers keep their references), converting dtype.
  // strict: missing keys, unexpected keys and shape mismatches are reported together in one Error.
  void load_state_dict(const std::map<std::string, Tensor<B>>& state, bool strict = true);
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  void load(const std::string& path, bool strict = true);

  // Converts every parameter and every floating-point buffer (BatchNorm's running_mean/var, persistent
  // or not) to a floating dtype, e.g. f64 for gradient checks, as torch.nn.Module.to(dtype); integer
  // buffers (num_batches_tracked) keep theirs; accumulated gradients are converted with their
  // parameter. Layers read their buffers through buffer() (the converted tensor), never a handle kept
  // from registration. Make the optimizer after to(): it holds the parameters' old tensors otherwise.
  void to(DType dtype);

 protected:
  // Registration. Names are non-empty, contain no '.', and are unique within the module.
  Var<B> register_parameter(const std::string& name, Tensor<B> value, bool requires_grad = true);
  Tensor<B> register_buffer(const std::string& name, Tensor<B> value, bool persistent = true);
  // This module's own buffer `name` (registered above): the current tensor, after any to().
  const Tensor<B>& buffer(const std::string& name) const;
  template <class M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    static_assert(std::is_base_of_v<Module<B>, M>, "register_module: M must derive from nn::Module<B>");
    check_name(name, "register_module");
    KILN_CHECK(m != nullptr, "register_module: submodule '{}' is null", name);
    children_.emplace_back(name, m);
    return m;
  }
  // Drops the submodule `name` (and so its parameters); an unknown name is an error.
  void remove_module(const std::string& name);
  // Called by train(); layers with mode-dependent state override it.
  virtual void on_train(bool) {}

 private:
  void check_name(const std::string& name, const char* op) const;
  void collect_params(const std::string& prefix, std::vector<std::pair<std::string, Var<B>>>& out) const;
  void collect_buffers(const std::string& prefix, bool persistent_only, std::vector<std::pair<std::string, Tensor<B>>>& out) const;

  struct Buffer {
    std::string name;
    Tensor<B> value;
    bool persistent;
  };
  std::vector<std::pair<std::string, Var<B>>> params_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

#define KILN_EXTERN_MODULE(B) extern template class Module<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN_MODULE)
#undef KILN_EXTERN_MODULE

}  // namespace kiln::nn
#pragma GCC visibility pop
