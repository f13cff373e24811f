#include "kiln/formats/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/formats/safetensors.hpp"

namespace kiln {

namespace {

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
constexpr uint64_t kMaxBytes = uint64_t{1} << 34;

size_t type_size(IdxType t) {
  switch (t) {
    case IdxType::u8:
    case IdxType::i8:
      return 1;
    case IdxType::i16:
      return 2;
    case IdxType::i32:
    case IdxType::f32:
      return 4;
    case IdxType::f64:
      return 8;
  }
  return 0;
}

bool valid_type(uint8_t t) { return t == 0x08 || t == 0x09 || t == 0x0B || t == 0x0C || t == 0x0D || t == 0x0E; }

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(path, ec), "read_idx: '{}': no such file", path);
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "read_idx: '{}': cannot open ({})", path, std::strerror(errno));
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  KILN_CHECK(!f.bad(), "read_idx: '{}': read error", path);
  return buf;
}

// Inflates one or more concatenated gzip members, stopping with an error beyond `limit` bytes.
std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& in, uint64_t limit) {
  std::vector<uint8_t> out;
  size_t consumed = 0;
  while (consumed < in.size()) {
    KILN_CHECK(in.size() - consumed >= 2 && in[consumed] == 0x1f && in[consumed + 1] == 0x8b,
               "read_idx: '{}': {} bytes of garbage after the gzip stream", path, in.size() - consumed);
    KILN_CHECK(in.size() - consumed <= UINT32_MAX, "read_idx: '{}': compressed file too large", path);
    z_stream z{};
    KILN_CHECK(inflateInit2(&z, 15 + 16) == Z_OK, "read_idx: '{}': zlib init failed", path);
    z.next_in = const_cast<Bytef*>(in.data() + consumed);
    z.avail_in = static_cast<uInt>(in.size() - consumed);
    std::vector<uint8_t> chunk(1 << 18);
    for (;;) {
      z.next_out = chunk.data();
      z.avail_out = static_cast<uInt>(chunk.size());
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        const std::string msg = z.msg ? z.msg : fmt::format("zlib error {}", rc);
        inflateEnd(&z);
        fail("read_idx: '{}': corrupt gzip data ({})", path, msg);
      }
      out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - z.avail_out));
      if (out.size() > limit) {
        inflateEnd(&z);
        fail("read_idx: '{}': decompresses to more than {} bytes", path, limit);
      }
      if (rc == Z_STREAM_END) break;
      // All input was given at once: output space left over without the end of the stream means the
      // stream stops early.
      if (z.avail_out != 0) {
        inflateEnd(&z);
        fail("read_idx: '{}': truncated gzip stream ({} compressed bytes end before the stream does)", path, in.size());
      }
    }
    consumed = in.size() - z.avail_in;
    inflateEnd(&z);
  }
  return out;
}

template <class T> T load_be(const uint8_t* p) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t,
                               std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  U u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u = static_cast<U>((u << 8) | p[i]);
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

template <class T> void store_be(T v, uint8_t* p) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t,
                               std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  U u;
  std::memcpy(&u, &v, sizeof(T));
  for (size_t i = sizeof(T); i-- > 0;) {
    p[i] = static_cast<uint8_t>(u & 0xFF);
    if constexpr (sizeof(T) > 1) u = static_cast<U>(u >> 8);
  }
}

// Converts big-endian data to host order (or back: the swap is its own inverse).
void swap_bytes(IdxType t, const uint8_t* src, uint8_t* dst, int64_t n) {
  const size_t s = type_size(t);
  if (s == 1) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n));  // src may be null for no data
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* a = src + static_cast<size_t>(i) * s;
    uint8_t* b = dst + static_cast<size_t>(i) * s;
    for (size_t k = 0; k < s; ++k) b[k] = a[s - 1 - k];
  }
}

template <class T, class F> void for_each_value(const IdxArray& a, F&& f) {
  const int64_t n = a.numel();
  const uint8_t* p = a.bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    f(i, v);
  }
}

std::string first_existing(const std::vector<std::string>& candidates, const std::string& what) {
  std::error_code ec;
  for (const auto& c : candidates)
    if (std::filesystem::is_regular_file(c, ec)) return c;
  fail("IdxDataset::load_split: no {} file; tried {}", what, fmt::join(candidates, ", "));
}

}  // namespace

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

template <class T> std::vector<T> IdxArray::values() const {
  KILN_CHECK(bytes.size() == static_cast<size_t>(numel()) * type_size(type), "IdxArray::values: {} bytes for {} values of {} bytes",
             bytes.size(), numel(), type_size(type));
  std::vector<T> out(static_cast<size_t>(numel()));
  auto put = [&](int64_t i, auto v) { out[static_cast<size_t>(i)] = static_cast<T>(v); };
  switch (type) {
    case IdxType::u8:
      for_each_value<uint8_t>(*this, put);
      break;
    case IdxType::i8:
      for_each_value<int8_t>(*this, put);
      break;
    case IdxType::i16:
      for_each_value<int16_t>(*this, put);
      break;
    case IdxType::i32:
      for_each_value<int32_t>(*this, put);
      break;
    case IdxType::f32:
      for_each_value<float>(*this, put);
      break;
    case IdxType::f64:
      for_each_value<double>(*this, put);
      break;
  }
  return out;
}

template std::vector<uint8_t> IdxArray::values<uint8_t>() const;
template std::vector<int32_t> IdxArray::values<int32_t>() const;
template std::vector<int64_t> IdxArray::values<int64_t>() const;
template std::vector<float> IdxArray::values<float>() const;
template std::vector<double> IdxArray::values<double>() const;

IdxArray read_idx(const std::string& path) {
  std::vector<uint8_t> raw = read_file_bytes(path);
  const bool gz = raw.size() >= 2 && raw[0] == 0x1f && raw[1] == 0x8b;
  const std::vector<uint8_t> buf = gz ? gunzip(path, raw, kMaxBytes + 4 + 4 * 8 + 1) : std::move(raw);
  const char* kind = gz ? "decompressed " : "";

  KILN_CHECK(buf.size() >= 4, "read_idx: '{}': {}file has {} bytes, too short for the 4-byte IDX magic", path, kind, buf.size());
  KILN_CHECK(buf[0] == 0 && buf[1] == 0, "read_idx: '{}': bad magic {:02x} {:02x} {:02x} {:02x} (an IDX file starts with 00 00)", path,
             buf[0], buf[1], buf[2], buf[3]);
  KILN_CHECK(valid_type(buf[2]), "read_idx: '{}': unknown element type 0x{:02x} (valid: 08 ubyte, 09 i8, 0B i16, 0C i32, 0D f32, 0E f64)",
             path, buf[2]);
  const int rank = buf[3];
  KILN_CHECK(rank >= 1 && rank <= 8, "read_idx: '{}': rank {} out of range [1, 8]", path, rank);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  KILN_CHECK(buf.size() >= header, "read_idx: '{}': truncated header: {} bytes, the {} sizes need {}", path, buf.size(), rank, header);

  IdxArray a;
  a.type = static_cast<IdxType>(buf[2]);
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = load_be<uint32_t>(buf.data() + 4 + 4 * i);
    KILN_CHECK(d <= kMaxDim, "read_idx: '{}': dimension {} has size {} (more than 2^31 - 1)", path, i, d);
    a.dims.push_back(d);
    // count · d · element size <= 2^34, checked without overflowing (count <= 2^34 here, d < 2^31).
    KILN_CHECK(d == 0 || count <= kMaxBytes / type_size(a.type) / static_cast<uint64_t>(d),
               "read_idx: '{}': sizes [{}] describe more than 2^34 bytes", path, fmt::join(a.dims, ", "));
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t want = count * type_size(a.type);
  const uint64_t have = buf.size() - header;
  KILN_CHECK(have >= want, "read_idx: '{}': truncated: sizes [{}] need {} bytes of data, the {}file has {}", path, fmt::join(a.dims, ", "),
             want, kind, have);
  KILN_CHECK(have == want, "read_idx: '{}': {} unexpected trailing bytes after the {} bytes of data for sizes [{}]", path, have - want,
             want, fmt::join(a.dims, ", "));
  a.bytes.resize(static_cast<size_t>(want));
  swap_bytes(a.type, buf.data() + header, a.bytes.data(), static_cast<int64_t>(count));
  return a;
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  KILN_CHECK(!a.dims.empty() && a.dims.size() <= 8, "write_idx: '{}': rank {} out of range [1, 8]", path, a.dims.size());
  const size_t n = static_cast<size_t>(a.numel()) * type_size(a.type);
  KILN_CHECK(a.bytes.size() == n, "write_idx: '{}': {} bytes of data for sizes [{}] ({} needed)", path, a.bytes.size(),
             fmt::join(a.dims, ", "), n);
  std::vector<uint8_t> out(4 + 4 * a.dims.size() + n);
  out[2] = static_cast<uint8_t>(a.type);
  out[3] = static_cast<uint8_t>(a.dims.size());
  for (size_t i = 0; i < a.dims.size(); ++i) {
    KILN_CHECK(a.dims[i] >= 0 && a.dims[i] <= kMaxDim, "write_idx: '{}': size {} out of range", path, a.dims[i]);
    store_be(static_cast<uint32_t>(a.dims[i]), out.data() + 4 + 4 * i);
  }
  swap_bytes(a.type, a.bytes.data(), out.data() + 4 + 4 * a.dims.size(), a.numel());
  if (gzip) {
    gzFile g = gzopen(path.c_str(), "wb");
    KILN_CHECK(g != nullptr, "write_idx: '{}': cannot open for writing", path);
    const int w = out.empty() ? 0 : gzwrite(g, out.data(), static_cast<unsigned>(out.size()));
    const int c = gzclose(g);
    KILN_CHECK(w == static_cast<int>(out.size()) && c == Z_OK, "write_idx: '{}': write failed", path);
    return;
  }
  safetensors::write_atomically(path, {{out.data(), out.size()}});
}

IdxDataset IdxDataset::load(const std::string& images_path, const std::string& labels_path, IdxImageOptions o) {
  KILN_CHECK(o.std > 0, "IdxDataset::load: std must be positive, got {}", o.std);
  const IdxArray im = read_idx(images_path);
  const IdxArray lb = read_idx(labels_path);
  KILN_CHECK(im.type == IdxType::u8, "IdxDataset::load: '{}': images must be ubyte (type 0x08), got 0x{:02x}", images_path,
             static_cast<int>(im.type));
  KILN_CHECK(im.dims.size() >= 2, "IdxDataset::load: '{}': images need rank >= 2 ([N, ...]), got sizes [{}]", images_path,
             fmt::join(im.dims, ", "));
  KILN_CHECK(lb.dims.size() == 1, "IdxDataset::load: '{}': labels must have rank 1 ([N]), got sizes [{}]", labels_path,
             fmt::join(lb.dims, ", "));
  KILN_CHECK(lb.type == IdxType::u8 || lb.type == IdxType::i32, "IdxDataset::load: '{}': labels must be ubyte or i32, got type 0x{:02x}",
             labels_path, static_cast<int>(lb.type));
  KILN_CHECK(im.dims[0] == lb.dims[0], "IdxDataset::load: {} images in '{}' but {} labels in '{}'", im.dims[0], images_path, lb.dims[0],
             labels_path);
  IdxDataset d;
  d.sample_shape_.assign(im.dims.begin() + 1, im.dims.end());
  d.labels_ = lb.values<int64_t>();
  for (size_t i = 0; i < d.labels_.size(); ++i) {
    KILN_CHECK(d.labels_[i] >= 0 && d.labels_[i] < 256, "IdxDataset::load: '{}': label {} at index {} is out of range [0, 256)",
               labels_path, d.labels_[i], i);
    d.num_classes_ = std::max(d.num_classes_, d.labels_[i] + 1);
  }
  d.images_.resize(im.bytes.size());
  const float scale = static_cast<float>(1.0 / (255.0 * o.std)), shift = static_cast<float>(o.mean / o.std);
  for (size_t i = 0; i < im.bytes.size(); ++i) d.images_[i] = static_cast<float>(im.bytes[i]) * scale - shift;
  return d;
}

IdxDataset IdxDataset::load_split(const std::string& dir, const std::string& split, IdxImageOptions o) {
  namespace fs = std::filesystem;
  auto paths = [&](const std::string& stem) {
    const std::string p = (fs::path(dir) / (split + stem)).string();
    return std::vector<std::string>{p + ".gz", p};
  };
  const std::string images = first_existing(paths("-images-idx3-ubyte"), split + " images");
  const std::string labels = first_existing(paths("-labels-idx1-ubyte"), split + " labels");
  return load(images, labels, o);
}

}  // namespace kiln
