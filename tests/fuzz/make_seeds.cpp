// Writes the seed corpora of the fuzz targets from real snapshots:
//   tsnap_fuzz_seeds <corpus dir>   (scripts/fuzz.sh --seeds; tests/fuzz/corpus/ is committed)
// Each snapshot below is saved with tsnap::save into a temporary directory; its shard files
// become seeds of `header`, its MANIFEST.json a seed of `manifest`, and the whole directory
// (fuzz_util.h's container) a seed of `snapshot`. Small on purpose: a few KB each.

#include <ATen/ATen.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "fuzz_util.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"

namespace tsnap::fuzz {
namespace {

std::string read_file(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) fail("cannot read " + path);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    fail("cannot write " + path);
  }
  std::fclose(f);
}

// The files of snapshot directory `dir`, sorted by name (MANIFEST.json first).
std::vector<File> files_of(const std::string& dir) {
  std::vector<File> files;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) fail("cannot list " + dir);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") files.push_back({name, read_file(dir + "/" + name)});
  }
  ::closedir(d);
  std::sort(files.begin(), files.end(),
            [](const File& a, const File& b) { return a.name < b.name; });
  return files;
}

struct Seed {
  const char* name;
  StateDict state;
  SaveOptions options;
  nlohmann::json metadata = nlohmann::json::object();
};

std::vector<Seed> seeds() {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<Seed> out;

  Seed small{"small", {}, {.num_shards = 1, .chunk_bytes = 4096}};
  small.state.insert("w", at::arange(15, f32).reshape({3, 5}));
  small.state.insert("step", at::scalar_tensor(7, at::kLong));
  small.state.insert("mask", at::arange(4, at::kInt).remainder(3).eq(0));
  small.state.insert("empty", at::empty({0, 3}, at::kHalf));
  small.state.insert("b", at::linspace(-1, 1, 7, f32).to(at::kBFloat16));
  out.push_back(std::move(small));

  // Two shards, a tensor stored as bf16 and one rank's piece of a global tensor.
  Seed two{"converted-2shards", {}, {.num_shards = 2, .chunk_bytes = 4096}};
  two.state.insert("model.weight", at::linspace(0, 1, 64, f32), at::kBFloat16);
  two.state.insert("model.bytes", at::arange(300, at::kInt).to(at::kByte));
  two.state.insert("piece", at::ones({2, 2}, at::kDouble), std::nullopt,
                   ShardSpec{.global_shape = {4, 2}, .offsets = {2, 0}});
  two.metadata = {{"step", 5}, {"note", "seed"}};
  out.push_back(std::move(two));

  // A shard of several chunks.
  Seed chunks{"multichunk", {}, {.num_shards = 1, .chunk_bytes = 4096}};
  chunks.state.insert("big", at::arange(1100, f32));
  chunks.state.insert("small", at::arange(3, at::kShort));
  out.push_back(std::move(chunks));
  return out;
}

int run(const std::string& corpus) {
  std::string tmp = "/tmp/tsnap-seeds-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) fail("cannot create a temporary directory");
  for (const char* target : {"header", "manifest", "snapshot"}) {
    ::mkdir((corpus + "/" + target).c_str(), 0755);
  }
  for (Seed& s : seeds()) {
    const std::string dir = tmp + "/" + s.name;
    save(dir, s.state, s.metadata, s.options);
    const std::vector<File> files = files_of(dir);
    for (const File& f : files) {
      if (f.name == kManifestName) {
        write_file(corpus + "/manifest/" + s.name + ".json", f.bytes);
      } else {
        write_file(corpus + "/header/" + s.name + "-" + f.name, f.bytes);
      }
    }
    write_file(corpus + "/snapshot/" + s.name + ".snap", pack(files));
    std::printf("seeds: %s (%zu files)\n", s.name, files.size());
  }
  tsnap::detail::remove_tree(tmp);
  return 0;
}

}  // namespace
}  // namespace tsnap::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  return tsnap::fuzz::run(argv[1]);
}
