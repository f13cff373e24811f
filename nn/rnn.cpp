#include "kiln/nn/rnn.hpp"

#include <cmath>
#include <functional>
#include <string>

#include "kiln/autograd/rnn_ops.hpp"
#include "kiln/nn/init.hpp"

namespace kiln::nn {

template <Backend B> LSTMState<B> functional::lstm_cell(const Var<B>& gates, const Var<B>& c) {
  const Var<B> y = autograd::RnnOps<B>::lstm_cell(gates, c);  // [h' | c'], checked there
  const int64_t H = c.size(1);
  return {y.narrow(1, 0, H), y.narrow(1, H, H)};
}

template <Backend B> Var<B> functional::gru_cell(const Var<B>& gi, const Var<B>& gh, const Var<B>& h) {
  return autograd::RnnOps<B>::gru_cell(gi, gh, h);
}

namespace {

enum class Kind { lstm, gru };

struct Spec {
  const char* name;  // "LSTM", "GRU"
  Kind kind;
  int64_t input_size, hidden_size, num_layers;
  bool bias, batch_first;
  double dropout;
  bool bidirectional;
  int64_t proj_size;
  DType dtype;
  int64_t gates() const { return kind == Kind::lstm ? 4 : 3; }
  int64_t dirs() const { return bidirectional ? 2 : 1; }
  int64_t out_size() const { return proj_size > 0 ? proj_size : hidden_size; }  // P
};

Spec spec(const LSTMOptions& o) {
  return {"LSTM",        Kind::lstm, o.input_size,    o.hidden_size, o.num_layers, o.bias,
          o.batch_first, o.dropout,  o.bidirectional, o.proj_size,   o.dtype};
}
Spec spec(const GRUOptions& o) {
  return {"GRU", Kind::gru, o.input_size, o.hidden_size, o.num_layers, o.bias, o.batch_first, o.dropout, o.bidirectional, 0, o.dtype};
}

void check_spec(const Spec& s) {
  KILN_CHECK(s.input_size >= 1 && s.hidden_size >= 1 && s.num_layers >= 1,
             "{}: input_size ({}), hidden_size ({}) and num_layers ({}) must be >= 1", s.name, s.input_size, s.hidden_size, s.num_layers);
  KILN_CHECK(s.dropout >= 0 && s.dropout < 1, "{}: dropout must be in [0, 1), got {}", s.name, s.dropout);
  KILN_CHECK(s.proj_size >= 0 && s.proj_size < s.hidden_size, "{}: proj_size must be in [0, hidden_size = {}), got {}", s.name,
             s.hidden_size, s.proj_size);
  KILN_CHECK(is_floating(s.dtype), "{}: dtype must be floating, got {}", s.name, s.dtype);
}

// Registers one layer·direction's parameters in PyTorch's order and returns {w_ih, w_hh, b_ih, b_hh, w_hr}.
template <Backend B> using Register = std::function<Var<B>(const std::string&, Tensor<B>)>;  // the module's register_parameter

template <Backend B> std::vector<Var<B>> register_layer(const Spec& s, int64_t layer, bool reverse, const Register<B>& reg) {
  const int64_t H = s.hidden_size, GH = s.gates() * H, P = s.out_size();
  const int64_t in = layer == 0 ? s.input_size : s.dirs() * P;
  const std::string sfx = fmt::format("_l{}{}", layer, reverse ? "_reverse" : "");
  const double k = 1.0 / std::sqrt(static_cast<double>(H));
  auto make = [&](const std::string& name, Shape shape) {
    Var<B> p = reg(name + sfx, Tensor<B>::empty(shape, s.dtype));
    init::uniform_(p, -k, k);
    return p;
  };
  std::vector<Var<B>> w(5);
  w[0] = make("weight_ih", {GH, in});
  w[1] = make("weight_hh", {GH, P});
  if (s.bias) {
    w[2] = make("bias_ih", {GH});
    w[3] = make("bias_hh", {GH});
  }
  if (s.proj_size > 0) w[4] = make("weight_hr", {P, H});
  return w;
}

// One layer in one direction over x [T, N, I]: returns the outputs [T, N, P] and the final (h, c).
template <Backend B> std::pair<Var<B>, LSTMState<B>> run_direction(const Spec& s, const std::vector<Var<B>>& w, const Var<B>& x,
                                                                   const Var<B>& h0, const Var<B>& c0, bool reverse,
                                                                   const Tensor<B>& lengths) {
  const int64_t T = x.size(0), N = x.size(1), I = x.size(2), GH = s.gates() * s.hidden_size;
  // the input-to-hidden product for all steps in one GEMM; for the LSTM both biases go in here
  Var<B> gi = x.reshape({T * N, I}).matmul(w[0].t());
  if (s.bias) gi = s.kind == Kind::lstm ? gi + (w[2] + w[3]) : gi + w[2];
  gi = gi.reshape({T, N, GH});
  // the recurrence: one record for all steps (autograd/ops/rnn.cpp)
  const auto r = s.kind == Kind::lstm ? autograd::RnnOps<B>::lstm_scan(gi, w[1], w[4], h0, c0, lengths, reverse)
                                      : autograd::RnnOps<B>::gru_scan(gi, w[1], w[3], h0, lengths, reverse);
  return {r.out, {r.h_n, r.c_n}};
}

// The whole stack: x as given by the user, optional (h0, c0); returns (output, h_n, c_n).
template <Backend B> LSTMOutput<B> run(bool training, const Spec& s, const std::vector<std::vector<Var<B>>>& w, const Var<B>& x_in,
                                       const std::optional<Var<B>>& h0_in, const std::optional<Var<B>>& c0_in,
                                       const std::vector<int64_t>& lengths) {
  const int64_t H = s.hidden_size, P = s.out_size(), LD = s.num_layers * s.dirs();
  KILN_CHECK(x_in.defined() && (x_in.dim() == 2 || x_in.dim() == 3) && x_in.size(-1) == s.input_size,
             "{}: input {} is not [T, N, input_size={}]{} or unbatched [T, {}]", s.name, shape_str(x_in.shape()), s.input_size,
             s.batch_first ? " ([N, T, I] with batch_first)" : "", s.input_size);
  KILN_CHECK(x_in.dtype() == s.dtype, "{}: input dtype {} differs from the parameters' {}", s.name, x_in.dtype(), s.dtype);
  const bool batched = x_in.dim() == 3;
  Var<B> x = !batched ? x_in.unsqueeze(1) : s.batch_first ? x_in.transpose(0, 1) : x_in;  // [T, N, I]
  const int64_t T = x.size(0), N = x.size(1);
  KILN_CHECK(T >= 1 && N >= 1, "{}: input {} is empty", s.name, shape_str(x_in.shape()));
  auto state = [&](const std::optional<Var<B>>& v, int64_t width, const char* what) {
    if (!v) return Var<B>(Tensor<B>::zeros({LD, N, width}, s.dtype));
    const Shape want = batched ? Shape{LD, N, width} : Shape{LD, width};
    KILN_CHECK(v->defined() && v->shape() == want && v->dtype() == s.dtype, "{}: {} is {} {}, expected {} {} for input {}", s.name, what,
               v->defined() ? shape_str(v->shape()) : "undefined", v->defined() ? v->dtype() : s.dtype, shape_str(want), s.dtype,
               shape_str(x_in.shape()));
    return batched ? *v : v->unsqueeze(1);
  };
  const Var<B> h0 = state(h0_in, P, "h0");
  const Var<B> c0 = s.kind == Kind::lstm ? state(c0_in, H, "c0") : Var<B>();
  if (!lengths.empty()) {
    KILN_CHECK(static_cast<int64_t>(lengths.size()) == N, "{}: {} lengths for a batch of {} (input {})", s.name, lengths.size(), N,
               shape_str(x_in.shape()));
    for (int64_t len : lengths)
      KILN_CHECK(len >= 1 && len <= T, "{}: length {} outside [1, T = {}] (input {})", s.name, len, T, shape_str(x_in.shape()));
  }
  const Tensor<B> len = lengths.empty() ? Tensor<B>() : Tensor<B>::from_vector(lengths, {N, 1});  // i64 [N, 1]
  std::vector<Var<B>> hn, cn;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    std::vector<Var<B>> outs;
    for (int64_t d = 0; d < s.dirs(); ++d) {
      const int64_t k = l * s.dirs() + d;
      auto [y, st] = run_direction<B>(s, w[static_cast<size_t>(k)], x, h0.select(0, k), s.kind == Kind::lstm ? c0.select(0, k) : Var<B>(),
                                      d == 1, len);
      outs.push_back(y);
      hn.push_back(st.h);
      cn.push_back(st.c);
    }
    x = outs.size() == 1 ? outs[0] : Var<B>::cat(outs, 2);
    if (l + 1 < s.num_layers && s.dropout > 0 && training) {
      const Tensor<B> keep = Tensor<B>::rand(x.shape(), DType::f32).ge(s.dropout).to(x.dtype()).mul(1.0 / (1.0 - s.dropout));
      x = x * Var<B>(keep);
    }
  }
  LSTMOutput<B> r;
  r.output = !batched ? x.squeeze(1) : s.batch_first ? x.transpose(0, 1) : x;
  r.h_n = Var<B>::stack(hn, 0);
  if (s.kind == Kind::lstm) r.c_n = Var<B>::stack(cn, 0);
  if (!batched) {
    r.h_n = r.h_n.squeeze(1);
    if (s.kind == Kind::lstm) r.c_n = r.c_n.squeeze(1);
  }
  return r;
}

template <Backend B> std::vector<std::vector<Var<B>>> register_all(const Spec& s, const Register<B>& reg) {
  check_spec(s);
  std::vector<std::vector<Var<B>>> w;
  for (int64_t l = 0; l < s.num_layers; ++l)
    for (int64_t d = 0; d < s.dirs(); ++d) w.push_back(register_layer<B>(s, l, d == 1, reg));
  return w;
}

// A cell's input [N, I] or [I] and state [N, width] or [width] (zeros if absent), checked; the batched forms.
template <Backend B> Var<B> cell_input(const char* name, const RNNCellOptions& o, const Var<B>& x) {
  KILN_CHECK(x.defined() && (x.dim() == 1 || x.dim() == 2) && x.size(-1) == o.input_size, "{}: input {} is not [N, input_size={}] or [{}]",
             name, shape_str(x.shape()), o.input_size, o.input_size);
  KILN_CHECK(x.dtype() == o.dtype, "{}: input dtype {} differs from the parameters' {}", name, x.dtype(), o.dtype);
  return x.dim() == 1 ? x.unsqueeze(0) : x;
}
template <Backend B>
Var<B> cell_state(const char* name, const char* what, const RNNCellOptions& o, const Var<B>& x, const std::optional<Var<B>>& v) {
  const int64_t N = x.dim() == 1 ? 1 : x.size(0);
  if (!v) return Var<B>(Tensor<B>::zeros({N, o.hidden_size}, o.dtype));
  const Shape want = x.dim() == 1 ? Shape{o.hidden_size} : Shape{N, o.hidden_size};
  KILN_CHECK(v->defined() && v->shape() == want && v->dtype() == o.dtype, "{}: {} is {}, expected {} {} for input {}", name, what,
             v->defined() ? shape_str(v->shape()) : "undefined", shape_str(want), o.dtype, shape_str(x.shape()));
  return x.dim() == 1 ? v->unsqueeze(0) : *v;
}

template <Backend B> void register_cell(const char* name, const RNNCellOptions& o, int64_t gates, Var<B>& w_ih, Var<B>& w_hh, Var<B>& b_ih,
                                        Var<B>& b_hh, const Register<B>& reg) {
  KILN_CHECK(o.input_size >= 1 && o.hidden_size >= 1, "{}: input_size ({}) and hidden_size ({}) must be >= 1", name, o.input_size,
             o.hidden_size);
  KILN_CHECK(is_floating(o.dtype), "{}: dtype must be floating, got {}", name, o.dtype);
  const double k = 1.0 / std::sqrt(static_cast<double>(o.hidden_size));
  auto make = [&](const char* n, Shape shape) {
    Var<B> p = reg(n, Tensor<B>::empty(shape, o.dtype));
    init::uniform_(p, -k, k);
    return p;
  };
  w_ih = make("weight_ih", {gates * o.hidden_size, o.input_size});
  w_hh = make("weight_hh", {gates * o.hidden_size, o.hidden_size});
  if (o.bias) {
    b_ih = make("bias_ih", {gates * o.hidden_size});
    b_hh = make("bias_hh", {gates * o.hidden_size});
  }
}

}  // namespace

template <Backend B> LSTM<B>::LSTM(LSTMOptions o) : o_(o) {
  w_ = register_all<B>(spec(o), [this](const std::string& n, Tensor<B> t) { return this->register_parameter(n, std::move(t)); });
}

template <Backend B>
LSTMOutput<B> LSTM<B>::forward(const Var<B>& x, const std::optional<LSTMState<B>>& state, const std::vector<int64_t>& lengths) const {
  return run<B>(this->is_training(), spec(o_), w_, x, state ? std::optional<Var<B>>(state->h) : std::nullopt,
                state ? std::optional<Var<B>>(state->c) : std::nullopt, lengths);
}

template <Backend B> GRU<B>::GRU(GRUOptions o) : o_(o) {
  w_ = register_all<B>(spec(o), [this](const std::string& n, Tensor<B> t) { return this->register_parameter(n, std::move(t)); });
}

template <Backend B>
GRUOutput<B> GRU<B>::forward(const Var<B>& x, const std::optional<Var<B>>& h0, const std::vector<int64_t>& lengths) const {
  const LSTMOutput<B> r = run<B>(this->is_training(), spec(o_), w_, x, h0, std::nullopt, lengths);
  return {r.output, r.h_n};
}

template <Backend B> LSTMCell<B>::LSTMCell(RNNCellOptions o) : o_(o) {
  register_cell<B>("LSTMCell", o, 4, w_ih_, w_hh_, b_ih_, b_hh_,
                   [this](const std::string& n, Tensor<B> t) { return this->register_parameter(n, std::move(t)); });
}

template <Backend B> LSTMState<B> LSTMCell<B>::forward(const Var<B>& x_in, const std::optional<LSTMState<B>>& state) const {
  const Var<B> x = cell_input<B>("LSTMCell", o_, x_in);
  const Var<B> h = cell_state<B>("LSTMCell", "h", o_, x_in, state ? std::optional<Var<B>>(state->h) : std::nullopt);
  const Var<B> c = cell_state<B>("LSTMCell", "c", o_, x_in, state ? std::optional<Var<B>>(state->c) : std::nullopt);
  Var<B> gates = x.matmul(w_ih_.t()) + h.matmul(w_hh_.t());
  if (o_.bias) gates = gates + (b_ih_ + b_hh_);
  LSTMState<B> r = functional::lstm_cell(gates, c);
  if (x_in.dim() == 1) r = {r.h.squeeze(0), r.c.squeeze(0)};
  return r;
}

template <Backend B> GRUCell<B>::GRUCell(RNNCellOptions o) : o_(o) {
  register_cell<B>("GRUCell", o, 3, w_ih_, w_hh_, b_ih_, b_hh_,
                   [this](const std::string& n, Tensor<B> t) { return this->register_parameter(n, std::move(t)); });
}

template <Backend B> Var<B> GRUCell<B>::forward(const Var<B>& x_in, const std::optional<Var<B>>& h_in) const {
  const Var<B> x = cell_input<B>("GRUCell", o_, x_in);
  const Var<B> h = cell_state<B>("GRUCell", "h", o_, x_in, h_in);
  Var<B> gi = x.matmul(w_ih_.t()), gh = h.matmul(w_hh_.t());
  if (o_.bias) {
    gi = gi + b_ih_;
    gh = gh + b_hh_;
  }
  const Var<B> r = functional::gru_cell(gi, gh, h);
  return x_in.dim() == 1 ? r.squeeze(0) : r;
}

#define KILN_INST(B)                                                            \
  template class LSTM<B>;                                                       \
  template class GRU<B>;                                                        \
  template class LSTMCell<B>;                                                   \
  template class GRUCell<B>;                                                    \
  template LSTMState<B> functional::lstm_cell<B>(const Var<B>&, const Var<B>&); \
  template Var<B> functional::gru_cell<B>(const Var<B>&, const Var<B>&, const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
