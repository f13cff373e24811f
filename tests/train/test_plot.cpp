// Training curves (train/plot.hpp, `kiln plot`): what is read from the logs, the PNG gnuplot draws, and
// that bad logs and a failing plotter name the problem and leave no half-written image.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include <kiln/core/error.hpp>
#include <kiln/train/plot.hpp>

namespace fs = std::filesystem;
using kiln::LogSeries;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("kiln-plot-test-{}-{}", ::getpid(), name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

// Width and height from a PNG's IHDR chunk (0, 0 if the file is no PNG).
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char h[24] = {};
  f.read(reinterpret_cast<char*>(h), 24);
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (!f || std::memcmp(h, sig, 8) != 0 || std::memcmp(h + 12, "IHDR", 4) != 0) return {0, 0};
  auto be = [&](int o) { return uint32_t{h[o]} << 24 | uint32_t{h[o + 1]} << 16 | uint32_t{h[o + 2]} << 8 | uint32_t{h[o + 3]}; };
  return {be(16), be(20)};
}

std::string kiln_cli(const std::string& args) {
  FILE* p = ::popen(fmt::format("{} {} 2>&1", KILN_CLI, args).c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return fmt::format("status {}: {}", WEXITSTATUS(st), out);
}

const char* kLog =
    "{\"step\":0,\"loss\":5.5,\"lr\":0.001,\"grad_norm\":2.0,\"ms\":10,\"tokens_per_s\":1000}\n"
    "\n"
    "{\"step\":1,\"loss\":5.0,\"lr\":0.002,\"grad_norm\":1.5,\"ms\":10,\"tokens_per_s\":1100,\"eval_loss\":5.2,\"extra\":\"x\"}\n"
    "{\"step\":2,\"loss\":4.0,\"lr\":0.003,\"ms\":10}\n"
    "{\"step\":1,\"loss\":4.9,\"lr\":0.002,\"grad_norm\":1.4,\"ms\":10,\"tokens_per_s\":1200,\"eval_loss\":5.1}\n";

}  // namespace

TEST_CASE("plot: read_log takes every record by step, the last of a repeated step, NaN where a key is missing", "[plot]") {
  const fs::path d = scratch("read");
  const LogSeries s = kiln::read_log(write(d / "run_a" / "log.jsonl", kLog));
  CHECK(s.label == "run_a");  // the folder's name
  CHECK(s.step == std::vector<int64_t>{0, 1, 2});
  CHECK(s.loss == std::vector<double>{5.5, 4.9, 4.0});  // step 1 re-logged after a resume: the last record
  CHECK(s.lr == std::vector<double>{0.001, 0.002, 0.003});
  CHECK(s.grad_norm[1] == 1.4);
  CHECK(std::isnan(s.grad_norm[2]));
  CHECK(s.throughput_key == "tokens_per_s");
  CHECK(s.throughput[1] == 1200);
  CHECK(std::isnan(s.throughput[2]));
  CHECK(s.eval_step == std::vector<int64_t>{1});
  CHECK(s.eval_loss == std::vector<double>{5.1});
  // kiln::fit's evaluation before training (step -1): an eval point, no training values
  const LogSeries e = kiln::read_log(write(d / "e.jsonl", std::string("{\"step\":-1,\"eval_loss\":6.0}\n") + kLog));
  CHECK(e.step == std::vector<int64_t>{0, 1, 2});
  CHECK(e.loss == s.loss);
  CHECK(e.eval_step == std::vector<int64_t>{-1, 1});
  CHECK(e.eval_loss == std::vector<double>{6.0, 5.1});
  CHECK(kiln::read_log(write(d / "x.jsonl", "{\"step\":3,\"samples_per_s\":7}\n"), "mine").label == "mine");
  CHECK(kiln::read_log((d / "x.jsonl").string()).throughput_key == "samples_per_s");
}

TEST_CASE("plot: bad logs name the file, the line and the problem", "[plot]") {
  const fs::path d = scratch("bad");
  auto error_of = [&](const std::string& text) {
    const std::string p = write(d / "bad.jsonl", text);
    try {
      kiln::read_log(p);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of("{\"step\":0,\"loss\":1}\n{\"step\":1,\"loss\":\n"),
             Catch::Contains("bad.jsonl' line 2") && Catch::Contains("not a JSON object"));
  CHECK_THAT(error_of("[1, 2]\n"), Catch::Contains("line 1") && Catch::Contains("not a JSON object"));
  CHECK_THAT(error_of("{\"loss\":1}\n"), Catch::Contains("line 1") && Catch::Contains("\"step\""));
  CHECK_THAT(error_of("{\"step\":-2}\n"), Catch::Contains("\"step\" >= -1"));
  CHECK_THAT(error_of("{\"step\":-1,\"eval_loss\":2}\n"), Catch::Contains("holds no records of training steps"));
  CHECK_THAT(error_of("{\"step\":0,\"loss\":\"low\"}\n"), Catch::Contains("\"loss\" is \"low\", not a number"));
  CHECK_THAT(error_of("\n\n"), Catch::Contains("holds no records"));
  CHECK_THROWS_WITH(kiln::read_log((d / "missing.jsonl").string()), Catch::Contains("missing.jsonl") && Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(kiln::plot_logs({.logs = {write(d / "ok.jsonl", kLog)}, .labels = {"a", "b"}, .out = (d / "o.png").string()}),
                    Catch::Contains("2 labels for 1 logs"));
  CHECK_THROWS_WITH(kiln::plot_logs({.logs = {(d / "ok.jsonl").string()}, .out = (d / "no" / "such" / "o.png").string()}),
                    Catch::Contains("does not exist"));
}

TEST_CASE("plot: gnuplot draws a PNG of the requested size, several runs overlaid", "[plot]") {
  const fs::path d = scratch("png");
  const std::string a = write(d / "mha" / "log.jsonl", kLog);
  std::string b_text;
  for (int s = 0; s < 50; ++s)
    b_text += fmt::format("{{\"step\":{},\"loss\":{},\"lr\":1e-3,\"grad_norm\":{},\"ms\":5,\"tokens_per_s\":900{}}}\n", s, 6.0 / (1 + s),
                          1.0 + s % 3, s % 10 == 9 ? fmt::format(",\"eval_loss\":{}", 6.5 / (1 + s)) : "");
  const std::string b = write(d / "diff" / "log.jsonl", b_text);
  const std::string out = (d / "curves.png").string();
  kiln::plot_logs({.logs = {a, b}, .out = out, .title = "two runs", .width = 800, .height = 600});
  CHECK(png_size(out) == std::pair<uint32_t, uint32_t>{800, 600});
  CHECK(fs::file_size(out) > 10000);  // four panels of curves, not an empty canvas
  // The command line: repeated --log and --label, --size.
  const std::string out2 = (d / "cli.png").string();
  CHECK_THAT(kiln_cli(fmt::format("plot --log {} --label A --log {} --label B --out {} --size 640x480", a, b, out2)),
             Catch::Contains("status 0") && Catch::Contains("2 runs"));
  CHECK(png_size(out2) == std::pair<uint32_t, uint32_t>{640, 480});
  CHECK_THAT(kiln_cli(fmt::format("plot --log {} --out {} --size big", a, out2)), Catch::Contains("--size must be WIDTHxHEIGHT"));
  CHECK_THAT(kiln_cli(fmt::format("plot --out {}", out2)), Catch::Contains("--log is required"));
}

TEST_CASE("plot: a failing or missing plotter names itself and leaves the old image and no temporary file", "[plot]") {
  const fs::path d = scratch("fail");
  const std::string log = write(d / "log.jsonl", kLog);
  const std::string out = write(d / "curves.png", "the previous image");
  CHECK_THROWS_WITH(kiln::plot_logs({.logs = {log}, .out = out, .gnuplot = "false"}), Catch::Contains("false failed (status 1)"));
  CHECK_THROWS_WITH(kiln::plot_logs({.logs = {log}, .out = out, .gnuplot = "kiln-no-such-plotter"}),
                    Catch::Contains("not found") && Catch::Contains("gnuplot-nox"));
  std::ifstream f(out);
  std::string kept((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(kept == "the previous image");
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++files;
  CHECK(files == 2);  // the log and the old image
}
