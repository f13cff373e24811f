// IDX files (raw and gzip, valid and corrupt, written here) and the DataLoader's order and state.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/idx.hpp>
#include <kiln/train/dataloader.hpp>

using namespace kiln;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("kiln-test-data-{}", ::getpid());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// gzip with zlib directly (independent of write_idx).
std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& in) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out(deflateBound(&z, static_cast<uLong>(in.size())) + 64);
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// An IDX ubyte file by hand: magic, big-endian sizes, values.
std::vector<uint8_t> idx_u8(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values) {
  std::vector<uint8_t> b{0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    b.push_back(static_cast<uint8_t>(d >> 24));
    b.push_back(static_cast<uint8_t>(d >> 16));
    b.push_back(static_cast<uint8_t>(d >> 8));
    b.push_back(static_cast<uint8_t>(d));
  }
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------------------ IDX

TEST_CASE("idx: raw and gzipped files read back the values the bytes hold", "[idx]") {
  TempDir dir;
  const std::vector<uint8_t> px = pixels(5 * 3 * 4);
  const std::vector<uint8_t> lab{3, 0, 9, 1, 3};
  for (bool gz : {false, true}) {
    INFO("gzip " << gz);
    const std::string ip = dir / (gz ? "im.gz" : "im"), lp = dir / (gz ? "lb.gz" : "lb");
    auto im = idx_u8({5, 3, 4}, px), lb = idx_u8({5}, lab);
    write_bytes(ip, gz ? gzip_bytes(im) : im);
    write_bytes(lp, gz ? gzip_bytes(lb) : lb);

    const IdxArray a = read_idx(ip);
    CHECK(a.type == IdxType::u8);
    CHECK(a.dims == std::vector<int64_t>{5, 3, 4});
    CHECK(a.bytes == px);

    const IdxDataset d = IdxDataset::load(ip, lp);
    CHECK(d.size() == 5);
    CHECK(d.sample_shape() == Shape{3, 4});
    CHECK(d.num_classes() == 10);
    CHECK(d.labels() == std::vector<int64_t>{3, 0, 9, 1, 3});
    for (size_t i = 0; i < px.size(); ++i) REQUIRE(d.images()[i] == Approx(px[i] / 255.0).margin(1e-7));

    const auto [x, y] = d.tensors<Reference>();  // two Tensor<Reference>: template code deduces from them
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(x)>, Tensor<Reference>>);
    const TensorDataset<Reference> t(x, y);
    CHECK(t.inputs().shape() == Shape{5, 12});
    CHECK(t.inputs().dtype() == DType::f32);
    CHECK(t.targets().dtype() == DType::i64);
    CHECK(to_vector<int64_t>(t.targets()) == d.labels());
    CHECK(d.tensors<Cpu>(false).inputs.shape() == Shape{5, 3, 4});
    // Sample 2, pixel (1, 2) = flat index 2·12 + 1·4 + 2.
    CHECK(t.inputs().at<float>({2, 6}) == Approx(px[2 * 12 + 6] / 255.0));
  }
}

TEST_CASE("idx: normalisation, big-endian multi-byte types, write_idx round trip", "[idx]") {
  TempDir dir;
  // i16 [2]: 0x0102 = 258, 0xFFFE = -2; f32 [1]: 0x3FC00000 = 1.5.
  write_bytes(dir / "i16", {0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE});
  CHECK(read_idx(dir / "i16").values<int64_t>() == std::vector<int64_t>{258, -2});
  write_bytes(dir / "f32", {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0xC0, 0x00, 0x00});
  CHECK(read_idx(dir / "f32").values<double>() == std::vector<double>{1.5});

  IdxArray a;
  a.type = IdxType::i32;
  a.dims = {3};
  const std::vector<int32_t> v{-7, 1 << 20, 42};
  a.bytes.resize(12);
  std::memcpy(a.bytes.data(), v.data(), 12);
  for (bool gz : {false, true}) {
    write_idx(dir / "rt", a, gz);
    const IdxArray b = read_idx(dir / "rt");
    CHECK(b.dims == a.dims);
    CHECK(b.values<int32_t>() == v);
    CHECK((read_bytes(dir / "rt")[0] == 0x1f) == gz);
  }

  write_bytes(dir / "im", idx_u8({2, 1, 1}, {0, 255}));
  write_bytes(dir / "lb", idx_u8({2}, {0, 1}));
  const IdxDataset d = IdxDataset::load(dir / "im", dir / "lb", {.mean = 0.5, .std = 0.25});
  CHECK(d.images()[0] == Approx(-2.0));
  CHECK(d.images()[1] == Approx(2.0));
}

TEST_CASE("idx: corrupt and truncated files are errors naming the file and the problem", "[idx][errors]") {
  TempDir dir;
  const auto good = idx_u8({4, 2, 2}, pixels(16));
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    const std::string p = dir / "bad";
    write_bytes(p, bytes);
    INFO(what);
    CHECK_THROWS_AS(read_idx(p), Error);
    CHECK_THROWS_WITH(read_idx(p), Contains(p) && Contains(what));
  };
  expect({}, "too short");
  expect({0, 0}, "too short");
  expect({1, 0, 8, 1, 0, 0, 0, 0}, "bad magic");
  expect({0, 0, 0x07, 1, 0, 0, 0, 0}, "unknown element type 0x07");
  expect({0, 0, 0x08, 0}, "rank 0");
  expect({0, 0, 0x08, 9}, "rank 9");
  expect({0, 0, 0x08, 3, 0, 0, 0, 4, 0, 0}, "truncated header");
  expect(std::vector<uint8_t>(good.begin(), good.end() - 1), "truncated");
  expect(std::vector<uint8_t>(good.begin(), good.begin() + 20), "need 16 bytes of data");
  auto trailing = good;
  trailing.push_back(0);
  expect(trailing, "1 unexpected trailing bytes");
  expect({0, 0, 0x08, 1, 0x80, 0, 0, 0}, "more than 2^31 - 1");
  expect({0, 0, 0x0E, 2, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF}, "more than 2^34 bytes");
  // 2^31-1 cubed overflows 64 bits if multiplied before checking.
  expect({0, 0, 0x08, 3, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF}, "more than 2^34 bytes");

  // gzip: cut short, corrupted, garbage after the stream, and content that decompresses to a bad IDX.
  const auto gz = gzip_bytes(idx_u8({64, 8, 8}, pixels(64 * 64)));
  expect(std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)), "truncated gzip");
  expect(std::vector<uint8_t>(gz.begin(), gz.end() - 4), "truncated gzip");  // no length field
  auto flipped = gz;
  for (size_t i = 20; i < 40; ++i) flipped[i] ^= 0x5A;
  expect(flipped, "corrupt gzip");
  auto crc = gz;
  crc[crc.size() - 6] ^= 1;  // the CRC-32 of the trailer
  expect(crc, "corrupt gzip");
  auto garbage = gz;
  garbage.push_back('x');
  garbage.push_back('y');
  expect(garbage, "garbage after the gzip stream");
  expect(gzip_bytes(std::vector<uint8_t>(good.begin(), good.end() - 3)), "the decompressed file has 13");
  expect({0x1f, 0x8b}, "truncated gzip");

  CHECK_THROWS_WITH(read_idx(dir / "nope"), Contains("nope") && Contains("no such file"));
}

TEST_CASE("idx: image/label pairs are cross-checked, load_split finds the MNIST names", "[idx][errors]") {
  TempDir dir;
  write_bytes(dir / "im", idx_u8({3, 2, 2}, pixels(12)));
  write_bytes(dir / "lb4", idx_u8({4}, {0, 1, 2, 3}));
  write_bytes(dir / "lb2d", idx_u8({3, 1}, {0, 1, 2}));
  CHECK_THROWS_WITH(IdxDataset::load(dir / "im", dir / "lb4"), Contains("3 images") && Contains("4 labels"));
  CHECK_THROWS_WITH(IdxDataset::load(dir / "im", dir / "lb2d"), Contains("lb2d") && Contains("rank 1"));
  CHECK_THROWS_WITH(IdxDataset::load(dir / "lb4", dir / "lb4"), Contains("rank >= 2"));

  write_bytes(dir / "train-images-idx3-ubyte.gz", gzip_bytes(idx_u8({3, 2, 2}, pixels(12))));
  write_bytes(dir / "train-labels-idx1-ubyte", idx_u8({3}, {2, 0, 1}));
  const IdxDataset d = IdxDataset::load_split(dir.path.string(), "train");
  CHECK(d.size() == 3);
  CHECK(d.num_classes() == 3);
  CHECK_THROWS_WITH(IdxDataset::load_split(dir.path.string(), "t10k"),
                    Contains("t10k-images-idx3-ubyte.gz") && Contains("t10k-images-idx3-ubyte"));
}

TEST_CASE("idx: the Fashion-MNIST package reads as 60000 + 10000 28x28 images", "[idx]") {
  // The suite's set-up installs the package (scripts/test.sh: setup.sh --data); a missing one fails.
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz"))
    FAIL("dataset-fashion-mnist is not installed: run scripts/setup.sh --data (scripts/test.sh does)");
  const IdxDataset test = IdxDataset::load_split(dir, "t10k");
  CHECK(test.size() == 10000);
  CHECK(test.sample_shape() == Shape{28, 28});
  CHECK(test.num_classes() == 10);
  std::vector<int64_t> count(10);
  for (int64_t l : test.labels()) ++count[static_cast<size_t>(l)];
  for (int64_t c : count) CHECK(c == 1000);  // the test split is balanced
  CHECK(*std::max_element(test.images().begin(), test.images().end()) == 1.0f);
}

// ------------------------------------------------------------------------------------------ DataLoader

namespace {
std::vector<std::vector<int64_t>> take(BatchSampler& s, int64_t k) {
  std::vector<std::vector<int64_t>> out;
  while (static_cast<int64_t>(out.size()) < k) {
    if (auto b = s.next())
      out.push_back(*b);
    else
      out.push_back({-1});  // marks an epoch boundary
  }
  return out;
}
}  // namespace

TEST_CASE("dataloader: same seed, same order, every sample exactly once per epoch", "[dataloader]") {
  for (bool drop_last : {false, true}) {
    INFO("drop_last " << drop_last);
    const DataLoaderOptions o{.batch_size = 10, .shuffle = true, .drop_last = drop_last, .seed = 7};
    BatchSampler a(103, o), b(103, o);
    CHECK(a.batches_per_epoch() == (drop_last ? 10 : 11));
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      while (auto batch = a.next()) {
        auto other = b.next();
        REQUIRE(other);
        CHECK(*batch == *other);
        CHECK(static_cast<int64_t>(batch->size()) <= 10);
        seen.insert(seen.end(), batch->begin(), batch->end());
      }
      CHECK(!b.next());
      CHECK(a.epoch() == epoch + 1);
      std::vector<int64_t> sorted = seen;
      std::sort(sorted.begin(), sorted.end());
      CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // no sample twice
      CHECK(seen.size() == (drop_last ? 100u : 103u));
      if (!drop_last) CHECK(sorted.front() == 0);
      if (!drop_last) CHECK(sorted.back() == 102);
    }
  }
  // A fresh sampler (a new run) repeats the first one's batches.
  const DataLoaderOptions o{.batch_size = 4, .seed = 123};
  BatchSampler r1(50, o), r2(50, o);
  CHECK(take(r1, 40) == take(r2, 40));
  // Regression pin: the permutation is part of the format (a resumed run depends on it).
  // (Computed once from this implementation: Philox-4x32-10 keyed by SplitMix64(seed ^ SplitMix64(epoch)).)
  CHECK(shuffled_indices(10, 42, 0) == std::vector<int64_t>{0, 4, 2, 8, 9, 5, 7, 3, 1, 6});
  CHECK(shuffled_indices(10, 42, 1) == std::vector<int64_t>{3, 1, 4, 5, 2, 9, 0, 7, 8, 6});
  CHECK(shuffled_indices(1, 5, 3) == std::vector<int64_t>{0});
  CHECK(shuffled_indices(0, 5, 3).empty());
}

TEST_CASE("dataloader: epochs and seeds give different orders, shuffle off is index order", "[dataloader]") {
  const auto e0 = shuffled_indices(100, 1, 0), e1 = shuffled_indices(100, 1, 1), s2 = shuffled_indices(100, 2, 0);
  CHECK(e0 != e1);
  CHECK(e0 != s2);
  std::vector<int64_t> id(100);
  for (int64_t i = 0; i < 100; ++i) id[static_cast<size_t>(i)] = i;
  CHECK(e0 != id);
  BatchSampler plain(25, {.batch_size = 10, .shuffle = false});
  CHECK(plain.order(0) == std::vector<int64_t>(id.begin(), id.begin() + 25));
  CHECK(take(plain, 4) == std::vector<std::vector<int64_t>>{
                              {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, {20, 21, 22, 23, 24}, {-1}});
}

TEST_CASE("dataloader: the shuffle is uniform over permutations", "[dataloader]") {
  // 3 elements: 6 permutations, 6000 epochs, 1000 expected each (sd ~29); a biased Fisher-Yates
  // (e.g. j drawn from [0, n) instead of [0, i]) gives 4/27 vs 5/27 and fails by > 30 sd.
  std::map<std::vector<int64_t>, int> count;
  for (int64_t e = 0; e < 6000; ++e) ++count[shuffled_indices(3, 99, e)];
  REQUIRE(count.size() == 6);
  for (const auto& [perm, c] : count) {
    INFO(fmt::format("{}", perm));
    CHECK(c > 850);
    CHECK(c < 1150);
  }
  // Position of element 0 in 97-element permutations: uniform too.
  std::vector<int> pos(97);
  for (int64_t e = 0; e < 9700; ++e) {
    const auto p = shuffled_indices(97, 5, e);
    ++pos[static_cast<size_t>(std::find(p.begin(), p.end(), 0) - p.begin())];
  }
  for (int c : pos) CHECK((c > 55 && c < 150));
}

TEST_CASE("dataloader: a restored state continues with identical batches", "[dataloader]") {
  const DataLoaderOptions o{.batch_size = 8, .shuffle = true, .drop_last = false, .seed = 2024};
  BatchSampler a(61, o);
  take(a, 2 * 9 + 3);  // two epochs (8 batches + end marker each) and 3 batches into the third
  CHECK(a.epoch() == 2);
  CHECK(a.position() == 3);
  const DataLoaderState s = DataLoaderState::from_map(a.state().to_map("data."), "data.");
  CHECK(s == a.state());
  BatchSampler b(61, o);
  b.load_state(s);
  CHECK(take(a, 30) == take(b, 30));  // crosses two epoch boundaries

  BatchSampler other_seed(61, {.batch_size = 8, .seed = 1});
  CHECK_THROWS_WITH(other_seed.load_state(s), Contains("seed 2024") && Contains("seed 1"));
  BatchSampler other_size(60, o);
  CHECK_THROWS_WITH(other_size.load_state(s), Contains("61 samples") && Contains("60"));
  BatchSampler other_batch(61, {.batch_size = 4, .seed = 2024});
  CHECK_THROWS_WITH(other_batch.load_state(s), Contains("batch_size 8"));
  auto m = s.to_map();
  m["position"] = "x3";
  CHECK_THROWS_WITH(DataLoaderState::from_map(m), Contains("'position' = 'x3'"));
  m["position"] = "3";
  m.erase("seed");
  CHECK_THROWS_WITH(DataLoaderState::from_map(m), Contains("missing key 'seed'"));
  CHECK_THROWS_WITH(BatchSampler(10, {.batch_size = 0}), Contains("batch_size must be positive"));
}

TEST_CASE("dataloader: TensorDataset batches hold the rows of their indices, range-for is one epoch", "[dataloader]") {
  const int64_t n = 23;
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t i = 0; i < n; ++i) {
    xs.push_back(static_cast<float>(i));
    xs.push_back(static_cast<float>(-2 * i));
    ys.push_back(i * 10);
  }
  TensorDataset<Cpu> data(Tensor<Cpu>::from_vector(xs, {n, 2}), Tensor<Cpu>::from_vector(ys, {n}));
  DataLoader loader(data, {.batch_size = 5, .shuffle = true, .seed = 3});
  BatchSampler ref(n, {.batch_size = 5, .shuffle = true, .seed = 3});
  for (int epoch = 0; epoch < 2; ++epoch) {
    int batches = 0;
    for (auto [x, y] : loader) {
      const auto idx = *ref.next();
      REQUIRE(x.shape() == Shape{static_cast<int64_t>(idx.size()), 2});
      const auto xv = to_vector<float>(x);
      const auto yv = to_vector<int64_t>(y);
      for (size_t r = 0; r < idx.size(); ++r) {
        CHECK(xv[2 * r] == static_cast<float>(idx[r]));
        CHECK(xv[2 * r + 1] == static_cast<float>(-2 * idx[r]));
        CHECK(yv[r] == idx[r] * 10);
      }
      ++batches;
    }
    CHECK(!ref.next());
    CHECK(batches == 5);
    CHECK(loader.epoch() == epoch + 1);
  }
  CHECK_THROWS_WITH(TensorDataset<Cpu>(Tensor<Cpu>::zeros({3, 2}), Tensor<Cpu>::zeros({4})), Contains("[3, 2]") && Contains("[4]"));
}
