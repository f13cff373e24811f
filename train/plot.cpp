#include "kiln/train/plot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/formats/printable.hpp"

extern char** environ;

namespace kiln {

namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Record {
  double loss = kNaN, lr = kNaN, grad_norm = kNaN, throughput = kNaN, eval_loss = kNaN;
};

// A number, or NaN for null/absent; anything else is an error naming the place.
double number(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return kNaN;
  KILN_CHECK(it->is_number(), "plot: {}: \"{}\" is {}, not a number", where, key, it->dump());
  return it->get<double>();
}

bool any_finite(const std::vector<double>& v) {
  for (const double x : v)
    if (std::isfinite(x)) return true;
  return false;
}

// The finite range of some series, for the choice of a log scale.
struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(const std::vector<double>& v) {
    for (const double x : v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  }
  // Positive and spanning at least a decade: a log axis shows the late, small changes.
  bool wants_log() const { return lo > 0 && hi >= 10 * lo; }
};

// A gnuplot double-quoted string.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (c == '\n') {
      q += ' ';
      continue;
    }
    q += c;
  }
  return q + "\"";
}

std::string fmt_value(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "NaN"; }

// Removes a folder and what is in it when it goes out of scope.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "kiln-plot-XXXXXX").string();
    KILN_CHECK(::mkdtemp(t.data()) != nullptr, "plot: cannot create a temporary folder ({})", std::strerror(errno));
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs `prog script`, its stderr into err_path; returns the exit status, or -1 with errno when the
// program could not be started.
int run(const std::string& prog, const std::string& script, const std::string& err_path, int& spawn_errno) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv{const_cast<char*>(prog.c_str()), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  spawn_errno = posix_spawnp(&pid, prog.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (spawn_errno != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string default_label(const std::string& path) {
  const fs::path p(path);
  const std::string parent = p.parent_path().filename().string();
  return !parent.empty() && parent != "." ? parent : p.stem().string();
}

}  // namespace

LogSeries read_log(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "plot: cannot open log '{}' ({})", path, std::strerror(errno));
  std::map<int64_t, Record> recs;
  LogSeries s;
  s.label = label.empty() ? default_label(path) : label;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("'{}' line {}", path, no);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    KILN_CHECK(!j.is_discarded(), "plot: {}: not a JSON object: {}", where, printable(line, 80));
    KILN_CHECK(j.is_object(), "plot: {}: not a JSON object: {}", where, printable(line, 80));
    const auto st = j.find("step");
    // step -1: kiln::fit's evaluation before training (an eval point only)
    KILN_CHECK(st != j.end() && st->is_number_integer() && st->get<int64_t>() >= -1, "plot: {}: needs an integer \"step\" >= -1, got {}",
               where, st == j.end() ? "none" : st->dump());
    Record r{.loss = number(j, "loss", where), .lr = number(j, "lr", where), .grad_norm = number(j, "grad_norm", where)};
    for (const char* key : {"tokens_per_s", "samples_per_s"}) {
      if (!j.contains(key)) continue;
      if (s.throughput_key.empty()) s.throughput_key = key;
      if (s.throughput_key == key) r.throughput = number(j, key, where);
    }
    r.eval_loss = number(j, "eval_loss", where);
    recs[st->get<int64_t>()] = r;  // a resumed run's repeated step: the last record wins
  }
  KILN_CHECK(!in.bad(), "plot: reading '{}' failed", path);
  KILN_CHECK(!recs.empty(), "plot: '{}' holds no records", path);
  for (const auto& [step, r] : recs) {
    if (std::isfinite(r.eval_loss)) {
      s.eval_step.push_back(step);
      s.eval_loss.push_back(r.eval_loss);
    }
    if (step < 0) continue;  // the evaluation before training: no training values
    s.step.push_back(step);
    s.loss.push_back(r.loss);
    s.lr.push_back(r.lr);
    s.grad_norm.push_back(r.grad_norm);
    s.throughput.push_back(r.throughput);
  }
  KILN_CHECK(!s.step.empty(), "plot: '{}' holds no records of training steps (only the evaluation before training)", path);
  return s;
}

void plot_logs(const PlotOptions& o) {
  KILN_CHECK(!o.logs.empty(), "plot: no log given");
  KILN_CHECK(o.labels.empty() || o.labels.size() == o.logs.size(), "plot: {} labels for {} logs (give one per log, or none)",
             o.labels.size(), o.logs.size());
  KILN_CHECK(!o.out.empty(), "plot: no output file given");
  KILN_CHECK(o.width >= 200 && o.width <= 20000 && o.height >= 200 && o.height <= 20000, "plot: size {}x{} out of range [200, 20000]",
             o.width, o.height);
  std::vector<LogSeries> runs;
  for (size_t i = 0; i < o.logs.size(); ++i) runs.push_back(read_log(o.logs[i], o.labels.empty() ? "" : o.labels[i]));

  const TempDir tmp;
  for (size_t i = 0; i < runs.size(); ++i) {
    const LogSeries& s = runs[i];
    std::ofstream d(tmp.path / fmt::format("run{}.dat", i));
    for (size_t k = 0; k < s.step.size(); ++k)
      d << s.step[k] << ' ' << fmt_value(s.loss[k]) << ' ' << fmt_value(s.lr[k]) << ' ' << fmt_value(s.grad_norm[k]) << ' '
        << fmt_value(s.throughput[k]) << '\n';
    std::ofstream e(tmp.path / fmt::format("run{}_eval.dat", i));
    for (size_t k = 0; k < s.eval_step.size(); ++k) e << s.eval_step[k] << ' ' << fmt_value(s.eval_loss[k]) << '\n';
    KILN_CHECK(d.good() && e.good(), "plot: writing to '{}' failed", tmp.path.string());
  }

  // The PNG goes to a temporary name beside the output, then is renamed over it.
  const fs::path out(o.out);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  KILN_CHECK(fs::is_directory(dir), "plot: the folder of '{}' does not exist", o.out);
  const fs::path part = dir / (".kiln-plot-" + std::to_string(::getpid()) + "-" + out.filename().string());

  std::ostringstream g;
  g << "set terminal pngcairo noenhanced size " << o.width << "," << o.height << " font \"sans,10\"\n"
    << "set output " << quoted(part.string()) << "\n"
    << "set datafile missing \"NaN\"\nset grid\nset key top right\nset xlabel \"step\"\n"
    << "set multiplot layout 2,2" << (o.title.empty() ? "" : " title " + quoted(o.title)) << "\n";
  // One panel: column `col` of every run's data (and, for the loss, the eval points).
  auto panel = [&](const std::string& title, int col, auto values, bool with_eval, bool allow_log) {
    std::vector<std::string> items;
    Range range;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::vector<double>& v = values(runs[i]);
      const std::string color = fmt::format("lc {}", i + 1);
      if (any_finite(v)) {
        range.add(v);
        items.push_back(fmt::format("{} using 1:{} with lines lw 1.5 {} title {}",
                                    quoted((tmp.path / fmt::format("run{}.dat", i)).string()), col, color,
                                    quoted(runs[i].label + (with_eval ? " train" : ""))));
      }
      if (with_eval && !runs[i].eval_loss.empty()) {
        range.add(runs[i].eval_loss);
        items.push_back(fmt::format("{} using 1:2 with linespoints lw 2 dt 2 pt 6 ps 1.8 {} title {}",
                                    quoted((tmp.path / fmt::format("run{}_eval.dat", i)).string()), color,
                                    quoted(runs[i].label + " eval")));
      }
    }
    g << "set title " << quoted(title) << "\n" << (allow_log && range.wants_log() ? "set logscale y\n" : "unset logscale y\n");
    if (items.empty()) {  // no run logged this quantity: an empty, labelled panel
      g << "set label 1 \"not in the logs\" at graph 0.5, 0.5 center\nset xrange [0:1]\nset yrange [0:1]\nplot 2 notitle\n"
        << "unset label 1\nset autoscale\n";
      return;
    }
    g << "plot ";
    for (size_t k = 0; k < items.size(); ++k) g << (k ? ", \\\n     " : "") << items[k];
    g << "\n";
  };
  panel(
      "loss", 2, [](const LogSeries& s) -> const std::vector<double>& { return s.loss; }, true, true);
  panel(
      "learning rate", 3, [](const LogSeries& s) -> const std::vector<double>& { return s.lr; }, false, false);
  panel(
      "gradient norm (before clipping)", 4, [](const LogSeries& s) -> const std::vector<double>& { return s.grad_norm; }, false, true);
  std::string tput = "tokens/s";
  for (const LogSeries& s : runs)
    if (s.throughput_key == "samples_per_s") tput = "samples/s";
  panel(
      tput, 5, [](const LogSeries& s) -> const std::vector<double>& { return s.throughput; }, false, false);
  g << "unset multiplot\nset output\n";

  const std::string script = (tmp.path / "curves.gp").string();
  {
    std::ofstream f(script);
    f << g.str();
    KILN_CHECK(f.good(), "plot: writing '{}' failed", script);
  }
  const std::string err_path = (tmp.path / "gnuplot.err").string();
  int spawn_errno = 0;
  const int rc = run(o.gnuplot, script, err_path, spawn_errno);
  std::error_code ec;
  if (rc != 0) fs::remove(part, ec);
  KILN_CHECK(rc != -1 || spawn_errno != ENOENT, "plot: '{}' not found: install the Debian package gnuplot-nox", o.gnuplot);
  KILN_CHECK(rc != -1, "plot: cannot run '{}': {}", o.gnuplot, std::strerror(spawn_errno));
  if (rc != 0) {
    std::ifstream e(err_path);
    std::string msg((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
    fail("plot: {} failed (status {}): {}", o.gnuplot, rc, msg.substr(0, 600));
  }
  KILN_CHECK(fs::exists(part) && fs::file_size(part) > 0, "plot: {} wrote no image", o.gnuplot);
  fs::rename(part, out, ec);
  if (ec) {
    fs::remove(part, ec);
    fail("plot: cannot write '{}': {}", o.out, ec.message());
  }
}

}  // namespace kiln
