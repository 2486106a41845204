// `tsnap ls ROOT`: the snapshot directories under a root, committed or not.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>

#include "cli/commands.h"
#include "cli/output.h"
#include "format/s3_root.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"

namespace tsnap::cli {
namespace {

// The number of keys of `m` (a key stored as pieces has one record per piece).
size_t key_count(const Manifest& m) {
  std::set<std::string> keys;
  for (const TensorRecord& t : m.tensors) keys.insert(t.name);
  return keys.size();
}

namespace fs = std::filesystem;

struct LsOptions {
  fs::path root;
  bool json = false;
};

const char* status_name(const Listed& entry) {
  if (entry.committed) return "committed";
  return entry.temporary ? "temporary" : "corrupt";
}

std::string status_text(const Listed& entry) {
  if (entry.committed || entry.temporary) return status_name(entry);
  return "corrupt: " + plain_message(entry.problem);
}

// Bytes of the regular files in `dir`: what an uncommitted directory occupies.
uint64_t disk_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uint64_t size = it->file_size(size_ec);
      if (!size_ec) total += size;
    }
  }
  return total;
}

// A snapshot's bytes: its shard files and its manifest (what `du` would count, less blocks).
uint64_t size_of(const Listed& entry) {
  if (!entry.manifest) return disk_bytes(entry.path);
  return entry.manifest->total_bytes() + manifest_bytes(entry.path);
}

// Bytes of the shard files that an incremental save took whole from an earlier snapshot (hard
// links: shared with it, not new space).
uint64_t reused_of(const Listed& entry) {
  uint64_t total = 0;
  if (entry.manifest) {
    for (const FileRecord& f : entry.manifest->files) {
      if (!f.reused_from.empty()) total += f.size;
    }
  }
  return total;
}

nlohmann::json to_json(const Listed& entry) {
  nlohmann::json j = {{"name", entry.name},
                      {"path", entry.path.string()},
                      {"status", status_name(entry)},
                      {"bytes", size_of(entry)},
                      {"reused_bytes", reused_of(entry)},
                      {"written_bytes", size_of(entry) - reused_of(entry)}};
  if (!entry.problem.empty()) j["problem"] = plain_message(entry.problem);
  if (const auto& m = entry.manifest) {
    j["id"] = m->id;
    j["created"] = m->created;
    j["created_unix_ns"] = m->created_unix_ns;
    j["tensors"] = key_count(*m);
    j["files"] = m->files.size();
    j["world_size"] = m->world_size;
    j["metadata"] = m->metadata;
  }
  return j;
}

int run_ls(const LsOptions& options) {
  const bool s3 = format::is_s3(options.root);
  if (!s3 && !fs::is_directory(options.root)) {
    throw_error(ErrorCode::kNotFound, "not a directory: " + options.root.string());
  }
  // A snapshot given for its root: say so, and show its own line of its root's listing.
  bool is_snapshot = !s3 && fs::exists(options.root / "MANIFEST.json");
  if (s3) {
    try {
      (void)read_manifest(options.root);
      is_snapshot = true;
    } catch (const Error& e) {
      // a root (a bucket, a prefix without a manifest); a corrupt manifest shows in the listing
    }
  }
  const fs::path dir = options.root.has_filename() ? options.root : options.root.parent_path();
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  std::vector<Listed> entries = list(is_snapshot ? parent : options.root);
  if (is_snapshot) {
    const std::string name = dir.filename().string();
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const Listed& e) { return e.name != name; }),
                  entries.end());
    if (!options.json) {
      std::cerr << options.root.string()
                << " is a snapshot, not a root of snapshots (its contents: tsnap inspect "
                << options.root.string() << "); its line in the listing of its root:\n";
    }
  }
  if (options.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Listed& entry : entries) out.push_back(to_json(entry));
    std::cout << out.dump(2) << '\n';
    return kExitOk;
  }
  if (entries.empty()) {
    std::cerr << "no snapshots under " << options.root.string() << '\n';
    return kExitOk;
  }
  Table table({"NAME", "CREATED", "SIZE", "REUSED", "TENSORS", "RANKS", "STATUS"});
  for (size_t c : {2, 3, 4, 5}) table.set_numeric(c);
  for (const Listed& entry : entries) {
    const auto& m = entry.manifest;
    table.add_row({entry.name, m ? local_time(m->created_unix_ns) : "-",
                   human_bytes(size_of(entry)),
                   reused_of(entry) > 0 ? human_bytes(reused_of(entry)) : "-",
                   m ? std::to_string(key_count(*m)) : "-", m ? std::to_string(m->world_size) : "-",
                   status_text(entry)});
  }
  table.print(std::cout);
  return kExitOk;
}

}  // namespace

Command add_ls(CLI::App& app) {
  auto options = std::make_shared<LsOptions>();
  CLI::App* sub = app.add_subcommand("ls", "List the snapshots under a root directory");
  sub->footer(
      "List every snapshot directory under ROOT, oldest first: committed snapshots, temporary "
      "directories of unfinished saves, and directories whose manifest is missing or corrupt. "
      "SIZE counts the shard files and the manifest; REUSED is the part of it that an incremental "
      "save took whole from an earlier snapshot (hard links: no new space). TENSORS counts keys (a "
      "key stored as pieces by several ranks counts once); RANKS is the world size of the save "
      "that wrote it.");
  sub->add_option("ROOT", options->root, "Directory that holds the snapshots")
      ->required()
      ->type_name("DIR");
  sub->add_flag("--json", options->json, "Print a JSON array instead of a table");
  return {sub, [options] { return run_ls(*options); }};
}

}  // namespace tsnap::cli
