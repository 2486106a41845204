#pragma once
/// \file
/// The on-disk layout of a snapshot root (docs/format.md §1), in one place: which names a
/// snapshot may have, the ids of saves, the names of temporary directories and how to recognise
/// them, the names periodic snapshots get from their step, the metadata key that holds the
/// step, the creation timestamp's spelling, and which of two snapshots is the newer.
/// Writers (pipeline, policy) and readers (restore, the tool) all use these; none spells a name
/// itself.

#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tsnap {
struct Manifest;
struct FileRecord;
}  // namespace tsnap

namespace tsnap::format {

/// Throws InvalidArgument unless `name` can be a snapshot directory under a root: non-empty, at
/// most 200 bytes, no '/' or NUL, not starting with '.' (those are temporaries), not "." or "..".
void check_snapshot_name(const std::string& name);

/// A new save id, unique across processes and time: "<16 hex digits of ns since the epoch>-<8 hex
/// digits>". Thread-safe.
std::string new_save_id();

/// The id of the `n`-th save (from 0) of snapshot `name` by the group of ranks whose id is `run`
/// (itself made by `new_save_id`): every rank computes the same id, with no round trip. Its
/// first part is the run's; throws InvalidArgument when `run` is not a save id.
std::string group_save_id(const std::string& run, const std::string& name, uint64_t n);

/// The temporary directory of snapshot `name` while save `id` writes it: ".<name>.tmp-<id>".
std::string temporary_name(const std::string& name, const std::string& id);

/// True if readers must treat the directory entry `entry` as a temporary directory, never as a
/// snapshot: it starts with '.' and holds ".tmp-" (`tsnap ls` shows it as temporary).
bool looks_temporary(const std::string& entry);

/// True if `entry` is exactly a tsnap temporary, ".<name>.tmp-<id>" with a non-empty name and an
/// id as `new_save_id` makes them: only these may a writer remove (other dot-directories under a
/// root are not tsnap's, even when `looks_temporary`).
bool is_temporary(const std::string& entry);

/// The name of the periodic snapshot after `step` optimizer steps: "step-%08lld".
std::string step_name(int64_t step);

/// The step of a periodic snapshot's name, or nullopt when `name` is not exactly `step_name`
/// of some step (one spelling per step).
std::optional<int64_t> parse_step_name(const std::string& name);

/// Globs of the optimizer moments that training changes at every step
/// (tsnap::optimizer_moment_keys(), which the torch-free tool needs too).
std::vector<std::string> optimizer_moment_globs();

/// The user-metadata key that records a snapshot's training step.
inline constexpr const char* kStepKey = "step";

/// The step recorded under kStepKey in a manifest's user metadata, if it is an integer.
std::optional<int64_t> step_of(const nlohmann::json& metadata);

/// The manifest's `created` spelling: ISO 8601 UTC with milliseconds, "2026-11-29T18:00:00.123Z".
std::string utc_timestamp(std::chrono::system_clock::time_point t);

/// The Unix time in seconds of a `created` spelling: "YYYY-MM-DDTHH:MM:SS[.1 to 9 digits]Z", UTC,
/// from 1970 on; nullopt for anything else.
std::optional<int64_t> parse_utc_timestamp(const std::string& text);

/// What decides which of two committed snapshots is the newer: the step first (a snapshot
/// without one is older than any with one), then the creation time.
struct SnapshotAge {
  std::optional<int64_t> step;
  int64_t created_unix_ns = 0;
};

/// True if `a` is newer than `b` (used by `latest()` and `PeriodicSnapshots::resume`).
bool newer(const SnapshotAge& a, const SnapshotAge& b);
/// The age of the snapshot whose manifest is `m`.
SnapshotAge age_of(const Manifest& m);
/// File `f`'s chunk `c` (< f.chunk_hashes.size()): where it begins and its length (the last
/// one may be short).
uint64_t chunk_offset(const FileRecord& f, uint64_t c);
uint64_t chunk_length(const FileRecord& f, uint64_t c);

/// Checkpoint objects: keys "<object>/<key>". The objects among `keys` (the part before the
/// first '/'), sorted, without repeats.
std::vector<std::string> objects_of(const std::vector<std::string>& keys);

/// Throws InvalidArgument(kKeyNotFound) when no key of `keys` (of the snapshot `snapshot`) is
/// under "<object>/", naming the objects there are.
void check_object(const std::vector<std::string>& keys, const std::string& object,
                  const std::string& snapshot);

}  // namespace tsnap::format
