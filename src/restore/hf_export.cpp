// tsnap::export_hf: a snapshot as a Hugging Face model directory (include/tsnap/hf_export.h).
//
// Durable-write protocol:
//   1. map the selected keys (every chunk verified, pieces assembled; a key kept in its stored
//      dtype is written straight from the mapping, others from a buffer of their own);
//   2. make ".<out>.hf-tmp-<id>" next to `out`; write each file there with plain buffered
//      writes (header from format::build_header, then the tensors' bytes), fsync and close it;
//   3. write model.safetensors.index.json the same way when there are several files;
//   4. fsync the temporary directory, rename it to `out` (with overwrite: move the old `out`
//      aside first, then remove it), fsync the parent.
// Any failure removes the temporary directory; `out` is never seen half-written.
// With `link` (and a snapshot whose shards serve as they are), steps 1 and 2 are: verify every
// chunk, then hard-link each shard into the temporary directory under its Hugging Face name.

#include "tsnap/hf_export.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/remove_tree.h"
#include "common/sys_error.h"
#include "format/convert.h"
#include "format/dtype.h"
#include "format/layout.h"
#include "format/safetensors.h"
#include "io/fd.h"
#include "restore/mapped_snapshot.h"
#include "restore/reshard.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;

// One tensor of the export: a view of the snapshot's mapping, or a buffer of its own (a key
// assembled from pieces, or converted).
struct OutTensor {
  std::string key;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<std::vector<uint8_t>> owned;
};

struct OutFile {
  std::string name;
  std::vector<OutTensor> tensors;  // in data order
  uint64_t bytes = 0;
};

// Writes all of `data` at the current position of `fd`, retrying EINTR and short writes.
void write_all(int fd, const char* data, uint64_t len, const fs::path& file, uint64_t* offset) {
  while (len > 0) {
    const size_t step = static_cast<size_t>(std::min<uint64_t>(len, 1ull << 30));
    const ssize_t n = ::write(fd, data, step);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_sys_error(-errno,
                              "write " + file.string() + " at offset " + std::to_string(*offset));
    }
    data += n;
    len -= static_cast<uint64_t>(n);
    *offset += static_cast<uint64_t>(n);
  }
}

// Creates `path` (which must not exist), lets `fill` write it, fsyncs and closes it.
template <typename Fill>
void write_file(const fs::path& path, Fill&& fill) {
  int err = 0;
  io::UniqueFd fd = io::open_fd(path.string(), O_WRONLY | O_CREAT | O_EXCL, 0644, &err);
  if (!fd.valid()) detail::throw_sys_error(err, "create " + path.string());
  uint64_t offset = 0;
  fill(fd.get(), &offset);
  if (::fsync(fd.get()) != 0) detail::throw_sys_error(-errno, "fsync " + path.string());
  if (const int rc = fd.close(); rc != 0) detail::throw_sys_error(rc, "close " + path.string());
}

void fsync_dir(const fs::path& dir) {
  int err = 0;
  io::UniqueFd fd = io::open_fd(dir.string(), O_RDONLY | O_DIRECTORY, 0, &err);
  if (!fd.valid()) detail::throw_sys_error(err, "open directory " + dir.string());
  if (::fsync(fd.get()) != 0) detail::throw_sys_error(-errno, "fsync directory " + dir.string());
}

void write_safetensors(const fs::path& path, const OutFile& file) {
  std::vector<format::HeaderTensor> header;
  uint64_t at = 0;
  for (const OutTensor& t : file.tensors) {
    header.push_back({t.key, t.dtype, t.shape, at, at + t.nbytes});
    at += t.nbytes;
  }
  const std::string head = format::build_header(header, {{"format", "pt"}});
  write_file(path, [&](int fd, uint64_t* offset) {
    write_all(fd, head.data(), head.size(), path, offset);
    for (const OutTensor& t : file.tensors) {
      write_all(fd, reinterpret_cast<const char*>(t.data), t.nbytes, path, offset);
    }
  });
}

// "model.safetensors", or "model-0000i-of-0000N.safetensors" for file i of n (from 0).
std::string hf_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

// Splits the keys (in key order) into files of at most max_shard_size data bytes, as
// transformers' save_pretrained does; a tensor larger than the limit gets a file of its own.
// Within a file the tensors are ordered by element size (largest first), then name, so that
// each is aligned to its element size (the header pads the data start to 4096).
std::vector<OutFile> split(std::vector<OutTensor> tensors, uint64_t max_shard_size) {
  std::vector<OutFile> files;
  for (OutTensor& t : tensors) {
    if (files.empty() ||
        (!files.back().tensors.empty() && files.back().bytes + t.nbytes > max_shard_size)) {
      files.emplace_back();
    }
    files.back().bytes += t.nbytes;
    files.back().tensors.push_back(std::move(t));
  }
  if (files.empty()) files.emplace_back();  // an empty state still gets its (empty) file
  for (OutFile& f : files) {
    std::stable_sort(f.tensors.begin(), f.tensors.end(), [](const auto& a, const auto& b) {
      return format::element_size(a.dtype) > format::element_size(b.dtype);
    });
  }
  for (size_t i = 0; i < files.size(); ++i) files[i].name = hf_name(i, files.size());
  return files;
}

// The selected keys (those of options.object, without its prefix), read from `snap` (every
// chunk verified): whole tensors only (a key stored as pieces assembled), converted to the
// requested dtype. Keys stay in manifest (name) order.
std::vector<OutTensor> read_tensors(const restore::MappedSnapshot& snap, const fs::path& snapshot,
                                    const HfExportOptions& options) {
  const std::string prefix = options.object.empty() ? "" : options.object + "/";
  const Manifest& m = snap.manifest();
  std::vector<OutTensor> out;
  for (size_t i = 0; i < m.tensors.size();) {
    const TensorRecord& r = m.tensors[i];
    std::vector<const TensorRecord*> pieces;
    for (; i < m.tensors.size() && m.tensors[i].name == r.name; ++i) {
      pieces.push_back(&m.tensors[i]);
    }
    if (!prefix.empty() &&
        (r.name.size() <= prefix.size() || r.name.compare(0, prefix.size(), prefix) != 0)) {
      continue;
    }
    const std::vector<int64_t>& global = restore::global_shape_of(r);
    if (pieces.size() == 1 && r.shard && global != r.shape) {
      throw_error(ErrorCode::kUnsupported,
                  "tensor '" + r.name + "' of " + snapshot.string() +
                      " holds only a piece of its global tensor (a rank's part without its "
                      "peers'): it cannot be exported");
    }
    const std::optional<uint64_t> nbytes = format::checked_nbytes(r.dtype, global);
    if (!nbytes) {
      throw_error(ErrorCode::kBadManifest, "tensor '" + r.name + "' of " + snapshot.string() +
                                               " has a global shape too large to hold");
    }
    OutTensor t{r.name.substr(prefix.size()), r.dtype, global, nullptr, *nbytes, nullptr};
    if (pieces.size() == 1) {
      t.data = snap.bytes(r, r.begin, r.end);
    } else {
      t.owned = std::make_shared<std::vector<uint8_t>>(*nbytes);
      snap.read_box(pieces, {std::vector<int64_t>(global.size(), 0), global}, t.owned->data());
      t.data = t.owned->data();
    }
    if (options.dtype && format::is_floating(r.dtype) && *options.dtype != r.dtype) {
      const uint64_t n = *nbytes / format::element_size(r.dtype);
      auto converted =
          std::make_shared<std::vector<uint8_t>>(n * format::element_size(*options.dtype));
      if (n > 0) format::convert(t.data, r.dtype, converted->data(), *options.dtype, n);
      t.owned = std::move(converted);
      t.data = t.owned->data();
      t.dtype = *options.dtype;
      t.nbytes = t.owned->size();
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Whether the snapshot's shard files can be the export's files as they are: every key whole
// and kept in its stored dtype, every file within max_shard_size.
bool linkable(const Manifest& m, const HfExportOptions& options) {
  if (!options.link || !options.object.empty()) return false;
  for (const TensorRecord& t : m.tensors) {
    if (t.shard) return false;
    if (options.dtype && format::is_floating(t.dtype) && t.dtype != *options.dtype) return false;
  }
  for (const FileRecord& f : m.files) {
    if (f.size - f.data_offset > options.max_shard_size) return false;
  }
  return !m.files.empty();
}

// Writes model.safetensors.index.json into `dir` (when there are several files).
void write_index(const fs::path& dir, const std::map<std::string, std::string>& file_of,
                 uint64_t total_size) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const auto& [key, name] : file_of) weight_map[key] = name;  // key order, as save_pretrained
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}},
                                  {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  const fs::path path = dir / "model.safetensors.index.json";
  write_file(path, [&](int fd, uint64_t* offset) {
    write_all(fd, text.data(), text.size(), path, offset);
  });
}

// Hard-links the shards of `m` into `tmp` under their Hugging Face names. False (with nothing
// left in `tmp`) when the filesystem refuses links; throws for other failures.
bool link_shards(const fs::path& snapshot, const Manifest& m, const fs::path& tmp,
                 HfExportResult& result) {
  const size_t n = m.files.size();
  std::map<std::string, std::string> name_of;
  for (size_t i = 0; i < n; ++i) {
    const std::string name = hf_name(i, n);
    const fs::path from = snapshot / m.files[i].name;
    if (::link(from.c_str(), (tmp / name).c_str()) != 0) {
      const int err = errno;
      if (err == EXDEV || err == EPERM || err == EMLINK || err == ENOTSUP) {
        for (const std::string& linked : result.files) ::unlink((tmp / linked).c_str());
        result = {};
        return false;
      }
      detail::throw_sys_error(-err, "link " + from.string() + " to " + (tmp / name).string());
    }
    name_of[m.files[i].name] = name;
    result.files.push_back(name);
  }
  std::map<std::string, std::string> file_of;
  for (const TensorRecord& t : m.tensors) {
    file_of[t.name] = name_of.at(t.file);
    result.total_size += t.nbytes();
  }
  result.tensors = m.tensors.size();
  if (n > 1) {
    write_index(tmp, file_of, result.total_size);
    result.files.push_back("model.safetensors.index.json");
  }
  result.linked = true;
  return true;
}

// Steps 2-3 without links: loads the selected keys and writes them as new files into `tmp`.
void write_copies(const fs::path& snapshot, const fs::path& tmp, const HfExportOptions& options,
                  HfExportResult& result) {
  const std::shared_ptr<const restore::MappedSnapshot> snap =
      restore::MappedSnapshot::open(snapshot, /*verify=*/true);
  const std::vector<OutFile> files =
      split(read_tensors(*snap, snapshot, options), options.max_shard_size);
  std::map<std::string, std::string> file_of;
  for (const OutFile& f : files) {
    write_safetensors(tmp / f.name, f);
    result.files.push_back(f.name);
    result.total_size += f.bytes;
    result.tensors += f.tensors.size();
    for (const OutTensor& t : f.tensors) file_of[t.key] = f.name;
  }
  if (files.size() > 1) {
    write_index(tmp, file_of, result.total_size);
    result.files.push_back("model.safetensors.index.json");
  }
}

// Throws kHashMismatch naming the first bad chunk of the snapshot, if any.
void check_intact(const fs::path& snapshot) {
  const std::vector<BadChunk> bad = verify(snapshot);
  if (bad.empty()) return;
  const BadChunk& b = bad.front();
  throw_error(
      ErrorCode::kHashMismatch,
      "snapshot " + snapshot.string() + " fails verification: " + b.file + " chunk " +
          std::to_string(b.chunk) + " at offset " + std::to_string(b.offset) + ": " + b.problem +
          (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more bad chunks)" : ""));
}

// The identity (device, inode) of `path` (followed), or nullopt when it cannot be stat'ed.
std::optional<std::pair<dev_t, ino_t>> identity(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

// The identities of `path` and of each directory above it, nearest first; a `path` that does
// not exist starts at its nearest existing ancestor.
std::vector<std::pair<dev_t, ino_t>> identity_chain(const fs::path& path) {
  std::vector<std::pair<dev_t, ino_t>> chain;
  fs::path p = fs::absolute(path).lexically_normal();
  while (true) {
    if (auto id = identity(p)) chain.push_back(*id);
    if (!p.has_relative_path()) break;  // the root
    p = p.parent_path();
  }
  return chain;
}

// Replacing the output must never remove the input: refuses an output that is the snapshot,
// lies inside it or holds it, compared by directory identity (device and inode), so that a
// path through a bind mount or a symbolic link is caught as well as the plain one.
void check_output_apart(const fs::path& snapshot, const fs::path& target) {
  const auto in = identity(snapshot);
  if (!in) return;  // no snapshot there: reading it fails with the reader's error
  const std::vector<std::pair<dev_t, ino_t>> out_chain = identity_chain(target);
  const std::vector<std::pair<dev_t, ino_t>> in_chain = identity_chain(snapshot);
  const auto out = identity(target);
  const bool inside = std::find(out_chain.begin(), out_chain.end(), *in) != out_chain.end();
  const bool holds = out && std::find(in_chain.begin(), in_chain.end(), *out) != in_chain.end();
  if (inside || holds) {
    throw_error(ErrorCode::kInvalidArgument,
                "the output " + target.string() + " is, lies inside or holds the snapshot " +
                    snapshot.string() + ": choose an output outside it");
  }
}

// Whether `name` is a file an export writes.
bool exported_name(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  // model-<5 digits>-of-<5 digits>.safetensors (hf_name)
  const auto digits = [&](size_t at) {
    return std::all_of(name.begin() + at, name.begin() + at + 5,
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  return name.size() == 32 && name.compare(0, 6, "model-") == 0 && digits(6) &&
         name.compare(11, 4, "-of-") == 0 && digits(15) &&
         name.compare(20, 12, ".safetensors") == 0;
}

// An existing output may be replaced only when it is an empty directory, an earlier export
// (nothing but the files an export writes) or a snapshot (a manifest that reads); never a
// file or a directory with the user's files in it.
void check_output_replaceable(const fs::path& target) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  const std::string refuse =
      ": overwrite replaces only an empty directory, an earlier export "
      "or a snapshot; remove it or choose another output";
  if (!fs::is_directory(st)) {
    throw_error(ErrorCode::kAlreadyExists,
                target.string() + " exists and is " +
                    (fs::is_symlink(st) ? "a symbolic link" : "not a directory") + refuse);
  }
  if (fs::exists(target / kManifestName, ec)) {
    try {
      (void)read_manifest(target);
      return;
    } catch (const Error& e) {
      throw_error(ErrorCode::kAlreadyExists, target.string() +
                                                 " holds a MANIFEST.json that does not read (" +
                                                 e.what() + ")" + refuse);
    }
  }
  for (const fs::directory_entry& e : fs::directory_iterator(target, ec)) {
    const std::string name = e.path().filename().string();
    if (!exported_name(name) || !e.is_regular_file(ec) || e.is_symlink(ec)) {
      throw_error(ErrorCode::kAlreadyExists, target.string() + " holds '" + name +
                                                 "', which an export does not write" + refuse);
    }
  }
  if (ec) detail::throw_sys_error(-ec.value(), "list " + target.string());
}

}  // namespace

HfExportResult export_hf(const fs::path& snapshot, const fs::path& out,
                         const HfExportOptions& options) {
  if (options.dtype && !format::is_floating(*options.dtype)) {
    throw_error(ErrorCode::kInvalidArgument,
                "export dtype must be floating (f64, f32, f16 or bf16), not " +
                    std::string(c10::toString(*options.dtype)));
  }
  if (options.max_shard_size == 0) {
    throw_error(ErrorCode::kInvalidArgument, "max_shard_size must be positive");
  }
  const fs::path target = out.has_filename() ? out : out.parent_path();
  check_output_apart(snapshot, target);
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists && !options.overwrite) {
    throw_error(ErrorCode::kAlreadyExists,
                target.string() + " already exists; pass overwrite (--overwrite) to replace it");
  }
  if (exists) check_output_replaceable(target);

  const Manifest manifest = read_manifest(snapshot);
  std::vector<std::string> keys;
  for (const TensorRecord& t : manifest.tensors) keys.push_back(t.name);
  if (!options.object.empty()) {
    format::check_object(keys, options.object, snapshot.string());
  } else {
    // A checkpoint of several objects (model/, optim/, ...) is not one model: writing all its
    // keys would give a model directory whose weights no loader finds.
    const std::vector<std::string> objects = format::objects_of(keys);
    const bool all_under_objects =
        !keys.empty() && std::all_of(keys.begin(), keys.end(), [](const std::string& k) {
          return k.find('/') != std::string::npos;
        });
    if (all_under_objects && objects.size() > 1) {
      std::string list;
      for (const std::string& o : objects) list += (list.empty() ? "" : ", ") + o;
      throw_error(
          ErrorCode::kInvalidArgument,
          "snapshot " + snapshot.string() + " is a checkpoint of " +
              std::to_string(objects.size()) + " objects (" + list +
              "), not one model: choose the one to export with object (--object " +
              (std::binary_search(objects.begin(), objects.end(), "model") ? std::string("model")
                                                                           : objects.front()) +
              ")");
    }
  }
  const bool link = linkable(manifest, options);
  if (link) check_intact(snapshot);

  const std::string id = format::new_save_id();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = parent / ("." + target.filename().string() + ".hf-tmp-" + id);
  const fs::path old = parent / ("." + target.filename().string() + ".hf-old-" + id);
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    detail::throw_sys_error(-errno, "create directory " + tmp.string());
  }
  HfExportResult result;
  try {
    if (!link || !link_shards(snapshot, manifest, tmp, result)) {
      write_copies(snapshot, tmp, options, result);
    }
    fsync_dir(tmp);
    if (exists && ::rename(target.c_str(), old.c_str()) != 0) {
      detail::throw_sys_error(-errno, "move " + target.string() + " aside to " + old.string());
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int err = -errno;
      if (exists) ::rename(old.c_str(), target.c_str());  // put the old output back
      detail::throw_sys_error(err, "rename " + tmp.string() + " to " + target.string());
    }
    fsync_dir(parent);
  } catch (...) {
    detail::remove_tree(tmp.string());
    throw;
  }
  if (exists) detail::remove_tree(old.string());  // the new output is committed already
  return result;
}

}  // namespace tsnap
