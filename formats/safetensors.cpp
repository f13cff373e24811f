#include "kiln/formats/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/backends/backends.hpp"
#include "kiln/formats/printable.hpp"

namespace kiln::safetensors {

namespace {

constexpr size_t kMaxHeader = 100u << 20;  // 100 MiB, the format's own limit

struct StType {
  const char* name;
  size_t size;
  DType kiln;  // what it loads as
};
constexpr StType kTypes[] = {
    {"F32", 4, DType::f32}, {"F64", 8, DType::f64}, {"BF16", 2, DType::bf16},    {"F16", 2, DType::f16},
    {"I32", 4, DType::i32}, {"I64", 8, DType::i64}, {"BOOL", 1, DType::boolean}, {"I8", 1, DType::i32},
    {"U8", 1, DType::i32},  {"I16", 2, DType::i32}, {"U16", 2, DType::i32},      {"U32", 4, DType::i64},
};

const StType* find_type(const std::string& n) {
  for (const StType& t : kTypes)
    if (n == t.name) return &t;
  return nullptr;
}

const char* st_name(DType d) {
  switch (d) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::boolean:
      return "BOOL";
  }
  return "?";
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

// ============================================================================== reading
File::File(File&& o) noexcept { *this = std::move(o); }
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    data_start_ = o.data_start_;
    infos_ = std::move(o.infos_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}
File::~File() {
  if (map_) munmap(map_, size_);
}

namespace {

// The file mapped read-only (its size in `size`); a missing, unreadable, irregular or too short file
// is an Error naming it.
void* map_file(const std::string& path, size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "safetensors: cannot open '{}': {}", path, errno_str());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string e = errno_str();
    ::close(fd);
    fail("safetensors: cannot stat '{}': {}", path, e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("safetensors: '{}' is not a regular file", path);
  }
  size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("safetensors: '{}' is truncated: {} bytes, the 8-byte header length alone needs 8", path, size);
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  KILN_CHECK(m != MAP_FAILED, "safetensors: cannot map '{}': {}", path, errno_str());
  return m;
}

// The n-byte JSON header, a JSON object; duplicate top-level keys are rejected (nlohmann would
// silently keep the last one).
nlohmann::json parse_header(const std::string& path, const unsigned char* text, size_t n) {
  std::set<std::string> keys;
  std::string dup;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
      const auto k = parsed.get<std::string>();
      if (!keys.insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text, text + n, cb);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors: '{}': header is not valid JSON: {}", path, printable(e.what(), 400));  // it quotes the bytes read
  }
  KILN_CHECK(dup.empty(), "safetensors: '{}': tensor '{}' appears twice in the header", path, printable(dup));
  KILN_CHECK(h.is_object(), "safetensors: '{}': header must be a JSON object", path);
  return h;
}

// __metadata__: an object of strings.
void read_metadata(const std::string& path, const nlohmann::json& v, std::map<std::string, std::string>& metadata) {
  KILN_CHECK(v.is_object(), "safetensors: '{}': __metadata__ must be an object of strings", path);
  for (auto m = v.begin(); m != v.end(); ++m) {
    KILN_CHECK(m.value().is_string(), "safetensors: '{}': __metadata__ value of '{}' is not a string", path, printable(m.key()));
    metadata[m.key()] = m.value().get<std::string>();
  }
}

// One tensor's entry: a supported dtype, a sane shape, and data_offsets inside the data_size bytes
// that span exactly the shape's bytes.
TensorInfo read_entry(const std::string& path, const std::string& name, const nlohmann::json& v, size_t data_size) {
  const std::string shown = printable(name);  // the name as error messages quote it
  KILN_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
             "safetensors: '{}': entry '{}' needs dtype, shape and data_offsets", path, shown);
  KILN_CHECK(v["dtype"].is_string(), "safetensors: '{}': dtype of '{}' is not a string", path, shown);
  const std::string dt = v["dtype"].get<std::string>();
  const StType* t = find_type(dt);
  KILN_CHECK(t != nullptr,
             "safetensors: '{}': tensor '{}' has unsupported dtype '{}' (supported: F32 F64 BF16 F16 I64 I32 I16 "
             "U16 I8 U8 U32 BOOL)",
             path, shown, printable(dt));
  KILN_CHECK(v["shape"].is_array(), "safetensors: '{}': shape of '{}' is not an array", path, shown);
  TensorInfo info;
  info.st_dtype = dt;
  info.dtype = t->kiln;
  uint64_t count = 1;
  for (const auto& d : v["shape"]) {
    KILN_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
               "safetensors: '{}': shape of '{}' has an invalid dimension {}", path, shown, d.dump());
    const auto dim = d.get<uint64_t>();
    KILN_CHECK(dim < (uint64_t{1} << 40) && (dim == 0 || count <= (uint64_t{1} << 48) / dim),
               "safetensors: '{}': shape of '{}' is absurdly large", path, shown);
    count *= dim;
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  const nlohmann::json& off = v["data_offsets"];
  KILN_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             "safetensors: '{}': data_offsets of '{}' must be two non-negative integers", path, shown);
  const auto b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  KILN_CHECK(b <= e && e <= data_size, "safetensors: '{}': data_offsets [{}, {}] of '{}' fall outside the {} data bytes", path, b, e, shown,
             data_size);
  KILN_CHECK(e - b == count * t->size, "safetensors: '{}': '{}' is {} {} ({} bytes) but data_offsets span {} bytes", path, shown, dt,
             shape_str(info.shape), count * t->size, e - b);
  info.begin = static_cast<size_t>(b);
  info.end = static_cast<size_t>(e);
  return info;
}

// The tensors' byte spans tile the data section: no overlap, no hole, nothing after the last.
void check_spans(const std::string& path, std::vector<std::pair<size_t, size_t>> spans, size_t data_size) {
  std::sort(spans.begin(), spans.end());
  size_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b == e) continue;
    KILN_CHECK(b >= at, "safetensors: '{}': tensor data overlaps at byte {}", path, b);
    KILN_CHECK(b == at, "safetensors: '{}': hole in the data between bytes {} and {}", path, at, b);
    at = e;
  }
  KILN_CHECK(at == data_size, "safetensors: '{}': {} trailing bytes after the last tensor", path, data_size - at);
}

}  // namespace

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  f.map_ = map_file(path, f.size_);  // unmapped by ~File if a check below fails
  const auto* bytes = static_cast<const unsigned char*>(f.map_);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  KILN_CHECK(n <= kMaxHeader, "safetensors: '{}': header length {} exceeds the 100 MiB limit (corrupt file?)", path, n);
  KILN_CHECK(n <= f.size_ - 8, "safetensors: '{}' is truncated: header says {} bytes of JSON, file has {} after the length", path, n,
             f.size_ - 8);
  f.data_start_ = 8 + n;
  const size_t data_size = f.size_ - f.data_start_;

  const nlohmann::json h = parse_header(path, bytes + 8, n);
  std::vector<std::pair<size_t, size_t>> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(path, it.value(), f.metadata_);
      continue;
    }
    TensorInfo info = read_entry(path, it.key(), it.value(), data_size);
    spans.emplace_back(info.begin, info.end);
    f.infos_.emplace(it.key(), std::move(info));
  }
  check_spans(path, std::move(spans), data_size);
  return f;
}

std::vector<std::string> File::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : infos_) out.push_back(k);
  return out;
}

const TensorInfo& File::info(const std::string& name) const {
  const auto it = infos_.find(name);
  KILN_CHECK(it != infos_.end(), "safetensors: '{}' has no tensor '{}'", path_, name);
  return it->second;
}

const unsigned char* File::data(const std::string& name) const {
  return static_cast<const unsigned char*>(map_) + data_start_ + info(name).begin;
}

void File::release(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(map_);
  const uintptr_t lo = (base + data_start_ + t.begin + page - 1) / page * page, hi = (base + data_start_ + t.end) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // a hint: failure changes nothing
}

namespace {
template <class S, class D> std::vector<D> widen(const unsigned char* p, size_t n) {
  std::vector<D> out(n);
  for (size_t i = 0; i < n; ++i) {
    S s;
    std::memcpy(&s, p + i * sizeof(S), sizeof(S));
    out[i] = static_cast<D>(s);
  }
  return out;
}
}  // namespace

template <Backend B> Tensor<B> File::load(const std::string& name) const {
  const TensorInfo& i = info(name);
  const unsigned char* p = data(name);
  const auto n = static_cast<size_t>(kiln::numel(i.shape));
  const std::string& d = i.st_dtype;
  if (d == "I8") return Tensor<B>::from_vector(widen<int8_t, int32_t>(p, n), i.shape);
  if (d == "U8") return Tensor<B>::from_vector(widen<uint8_t, int32_t>(p, n), i.shape);
  if (d == "I16") return Tensor<B>::from_vector(widen<int16_t, int32_t>(p, n), i.shape);
  if (d == "U16") return Tensor<B>::from_vector(widen<uint16_t, int32_t>(p, n), i.shape);
  if (d == "U32") return Tensor<B>::from_vector(widen<uint32_t, int64_t>(p, n), i.shape);
  if (d == "BOOL") {
    for (size_t k = 0; k < n; ++k) KILN_CHECK(p[k] <= 1, "safetensors: '{}': BOOL tensor '{}' holds byte {} at {}", path_, name, p[k], k);
  }
  return Tensor<B>::from_blob(p, i.shape, i.dtype);
}

// ============================================================================== writing
// The header is JSON, whose strings are UTF-8: a name or metadata string that is not (strictly:
// no overlong forms or surrogates, formats/printable.hpp) is refused here; the JSON writer would
// otherwise fail with an internal error.
template <Backend B> void save(const std::string& path, const std::vector<std::pair<std::string, Tensor<B>>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  for (const auto& [k, v] : metadata)
    KILN_CHECK(valid_utf8(k) && valid_utf8(v), "save: '{}': metadata '{}' is not valid UTF-8 (a safetensors header is JSON)", path,
               printable(k));
  std::vector<std::pair<std::string, const Tensor<B>*>> sorted;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty(), "save: '{}': empty tensor name", path);
    KILN_CHECK(name != "__metadata__", "save: '{}': '__metadata__' is reserved", path);
    KILN_CHECK(valid_utf8(name), "save: '{}': tensor name is not valid UTF-8: '{}' (a safetensors header is JSON)", path, printable(name));
    KILN_CHECK(t.defined(), "save: '{}': tensor '{}' is undefined", path, name);
    sorted.emplace_back(name, &t);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < sorted.size(); ++i)
    KILN_CHECK(sorted[i].first != sorted[i - 1].first, "save: '{}': tensor name '{}' given twice", path, sorted[i].first);

  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::vector<std::vector<unsigned char>> blobs;
  size_t off = 0;
  for (const auto& [name, t] : sorted) {
    const size_t bytes = static_cast<size_t>(t->numel()) * dtype_size(t->dtype());
    std::vector<unsigned char> blob(bytes);
    if (bytes) t->contiguous().copy_to_host(blob.data(), bytes);
    h[name] = {{"dtype", st_name(t->dtype())}, {"shape", t->shape()}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
    blobs.push_back(std::move(blob));
  }
  std::string js = h.dump();
  js.append((8 - js.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((js.size() >> (8 * i)) & 0xff);
  std::vector<std::pair<const void*, size_t>> pieces{{len, 8}, {js.data(), js.size()}};
  for (const auto& b : blobs) pieces.emplace_back(b.data(), b.size());
  write_atomically(path, pieces);
}

template <Backend B> std::map<std::string, Tensor<B>> load(const std::string& path) {
  const File f = File::open(path);
  std::map<std::string, Tensor<B>> out;
  for (const std::string& n : f.names()) out.emplace(n, f.load<B>(n));
  return out;
}

#define KILN_INST(B)                                                                               \
  template Tensor<B> File::load<B>(const std::string&) const;                                      \
  template void save<B>(const std::string&, const std::vector<std::pair<std::string, Tensor<B>>>&, \
                        const std::map<std::string, std::string>&);                                \
  template std::map<std::string, Tensor<B>> load<B>(const std::string&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::safetensors
