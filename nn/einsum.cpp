#include "kiln/nn/einsum.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>

namespace kiln {

namespace {

constexpr const char* kOp = "einsum";

bool has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// x (labels `l`) with the labels not in `keep` summed away.
template <Backend B> Var<B> sum_except(const Var<B>& x, std::string& l, const std::string& keep) {
  std::vector<int64_t> axes;
  std::string rest;
  for (size_t i = 0; i < l.size(); ++i) {
    if (has(keep, l[i]))
      rest.push_back(l[i]);
    else
      axes.push_back(static_cast<int64_t>(i));
  }
  if (axes.empty()) return x;
  l = rest;
  return x.sum(axes);
}

// x (labels `l`) permuted to the label order `to` (a permutation of l).
template <Backend B> Var<B> permute_to(const Var<B>& x, const std::string& l, const std::string& to) {
  if (l == to) return x;
  std::vector<int64_t> perm;
  for (char c : to) perm.push_back(static_cast<int64_t>(l.find(c)));
  return x.permute(perm);
}

int64_t prod(const std::map<char, int64_t>& size, const std::string& l) {
  int64_t n = 1;
  for (char c : l) n *= size.at(c);
  return n;
}

}  // namespace

template <Backend B> Var<B> einsum(std::string_view equation, const std::vector<Var<B>>& operands) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq.push_back(c);
  KILN_CHECK(eq.find("...") == std::string::npos, "{}: '{}': ellipsis (...) is not supported", kOp, equation);
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms(1);
  for (char c : lhs) {
    if (c == ',')
      terms.emplace_back();
    else
      terms.back().push_back(c);
  }
  KILN_CHECK(terms.size() == operands.size(), "{}: '{}' has {} operand(s), got {} tensor(s)", kOp, equation, terms.size(), operands.size());
  std::map<char, int64_t> size, count;
  for (size_t k = 0; k < terms.size(); ++k) {
    const std::string& t = terms[k];
    const Var<B>& x = operands[k];
    KILN_CHECK(x.defined(), "{}: operand {} is undefined", kOp, k);
    KILN_CHECK(static_cast<int64_t>(t.size()) == x.dim(), "{}: '{}': operand {} has {} subscript(s) '{}' for shape {}", kOp, equation, k,
               t.size(), t, shape_str(x.shape()));
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "{}: '{}': invalid subscript '{}' (letters only)", kOp, equation, c);
      KILN_CHECK(t.find(c) == i, "{}: '{}': subscript '{}' repeated in operand {} (diagonals and traces are not supported)", kOp, equation,
                 c, k);
      const int64_t n = x.size(static_cast<int64_t>(i));
      auto [it, fresh] = size.emplace(c, n);
      KILN_CHECK(fresh || it->second == n, "{}: '{}': subscript '{}' has size {} in operand {} ({}) but {} before", kOp, equation, c, n, k,
                 shape_str(x.shape()), it->second);
      ++count[c];
    }
    KILN_CHECK(k == 0 || x.dtype() == operands[0].dtype(), "{}: operands have dtypes {} and {}", kOp, operands[0].dtype(), x.dtype());
  }
  std::string out;
  if (arrow == std::string::npos) {
    for (const auto& [c, n] : count)
      if (n == 1) out.push_back(c);  // std::map: alphabetical
  } else {
    out = eq.substr(arrow + 2);
    for (size_t i = 0; i < out.size(); ++i) {
      KILN_CHECK(size.count(out[i]), "{}: '{}': output subscript '{}' appears in no operand", kOp, equation, out[i]);
      KILN_CHECK(out.find(out[i]) == i, "{}: '{}': output subscript '{}' repeated", kOp, equation, out[i]);
    }
  }
  // letters still needed after operand k: the output's and those of operands k+1...
  auto needed_after = [&](size_t k) {
    std::string need = out;
    for (size_t j = k + 1; j < terms.size(); ++j) need += terms[j];
    return need;
  };
  std::string l = terms[0];
  Var<B> cur = sum_except(operands[0], l, needed_after(0) + (terms.size() > 1 ? terms[1] : ""));
  for (size_t k = 1; k < terms.size(); ++k) {
    const std::string keep = needed_after(k);
    std::string r = terms[k];
    const Var<B> rhs = sum_except(operands[k], r, keep + l);
    cur = sum_except(cur, l, keep + r);
    std::string batch, left, right, contr;
    for (char c : l) (has(r, c) ? (has(keep, c) ? batch : contr) : left).push_back(c);
    for (char c : r)
      if (!has(l, c)) right.push_back(c);
    const int64_t nb = prod(size, batch), nl = prod(size, left), nc = prod(size, contr), nr = prod(size, right);
    const Var<B> a = permute_to(cur, l, batch + left + contr).reshape({nb, nl, nc});
    const Var<B> b = permute_to(rhs, r, batch + contr + right).reshape({nb, nc, nr});
    Shape s;
    for (char c : batch + left + right) s.push_back(size.at(c));
    cur = a.matmul(b).reshape(s);
    l = batch + left + right;
  }
  cur = sum_except(cur, l, out);
  return permute_to(cur, l, out);
}

#define KILN_INST(B) template Var<B> einsum<B>(std::string_view, const std::vector<Var<B>>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln
