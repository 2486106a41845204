#pragma once
// Hot images (SnapshotterOptions::staging.keep_hot, tsnap/hot_snapshot.h): a committed snapshot's
// staged chunks kept in the staging pool's buffers after their writes, so that it can be loaded
// again from memory. The write path (pipeline/) fills an image, the read path (restore/) reads one:
// the type lives here, below both.
//
// Life of an image:
//   1. begin(): a save with keep_hot starts one (building). As each chunk's write completes
//      (io thread), keep() takes the buffer instead of the pool getting it back.
//   2. commit(): once the save has committed, the image (complete, with the manifest as
//      committed) replaces the installed one, unless a newer save's image is installed already.
//      A failed save never commits: its image's buffers go back when the job drops it.
//   3. The installed image is dropped when a newer one replaces it or when staging starves:
//      the pool calls reclaim() when it has no free buffer, which first evicts the installed
//      image and, if the pool is still starved on the next try, abandons the images still being
//      built (their buffers go back at once; their saves complete without an image). Nothing
//      kept can starve a save, so a keep_hot save never deadlocks on its own buffers.
// Readers pin an image (shared_ptr) for the length of one load only (the public handle holds a
// weak_ptr), and an image's buffers go back to the pool when its last owner drops it: a reader
// never sees a buffer reused under it, and a starved save waits at most for the loads running.
// Lock order: HotImages::mu_ -> HotImage::mu_ -> the pool's.

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/hidden.h"
#include "plan/plan.h"
#include "stage/staging_pool.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/manifest.h"

namespace tsnap::stage {

class HotImages;

/// One snapshot's chunks in staging buffers. Thread-safe. Owned by shared_ptr: the building
/// save, the registry (once installed) and the loads running on it.
class HotImage : public std::enable_shared_from_this<HotImage> {
 public:
  HotImage(HotImages& registry, StagingPool& pool, uint64_t seq, std::string name,
           std::filesystem::path path, const plan::Plan& plan);
  ~HotImage();  // gives every kept buffer back to the pool
  HotImage(const HotImage&) = delete;
  HotImage& operator=(const HotImage&) = delete;

  /// Building: takes buffer `buf`, which holds chunk `chunk` of plan file `file` as written.
  /// Returns false when the image was abandoned (the caller then releases the buffer).
  bool keep(size_t file, uint64_t chunk, int buf);
  /// Building: whether the image was never abandoned (with HotImages::keep_building, for a
  /// snapshot agent, it never is: a save handed over keeps its buffers until it is dropped).
  bool whole() const;
  /// The save committed `manifest` (whose files are the plan's, in any order: a manifest read
  /// back lists them by name): installs the image if it holds every chunk and no newer image
  /// is installed.
  void commit(Manifest manifest);

  const std::string& name() const { return name_; }
  const std::filesystem::path& path() const { return path_; }
  /// After commit: the manifest as committed, shared with the public handles.
  const std::shared_ptr<const Manifest>& manifest() const { return manifest_; }
  /// After commit: the bytes of chunk `chunk` of `file` (a record of manifest()), whose length
  /// the manifest gives. Valid while the caller owns the image.
  const uint8_t* chunk(const FileRecord& file, uint64_t chunk) const;
  /// Tests only: the same bytes, writable (to corrupt a buffer).
  uint8_t* chunk_for_test(const FileRecord& file, uint64_t chunk);

 private:
  friend class HotImages;
  /// Gives every kept buffer back now; later keeps refuse. Never on an installed image.
  void abandon();
  bool complete() const;
  size_t file_index(const FileRecord& file) const;

  HotImages& registry_;
  StagingPool& pool_;
  const uint64_t seq_;  // save order: a newer image wins
  const std::string name_;
  const std::filesystem::path path_;
  std::shared_ptr<const Manifest> manifest_;
  mutable std::mutex mu_;
  bool abandoned_ = false;
  std::vector<std::vector<int>> bufs_;  // per plan file, per chunk: the buffer, -1 until kept
  std::vector<std::string> names_;      // per plan file: its name
  std::vector<size_t> plan_file_;       // after commit: per manifest file, its plan file
  size_t missing_ = 0;                  // chunks not kept yet
};

/// A Snapshotter's hot images: the installed one (the last committed) and those being built.
/// Thread-safe. Must outlive every image: its destructor drops the installed image and waits
/// for the loads that still pin one (bounded by their length).
class HotImages {
 public:
  explicit HotImages(StagingPool& pool) : pool_(pool) {}
  ~HotImages();
  HotImages(const HotImages&) = delete;
  HotImages& operator=(const HotImages&) = delete;

  /// A new image for a save of `plan` as `name` at `path` (building).
  std::shared_ptr<HotImage> begin(const plan::Plan& plan, std::string name,
                                  std::filesystem::path path);
  /// The public handle of the installed image (empty when there is none).
  HotSnapshot snapshot() const;
  /// The pool has no free buffer (StagingPool's reclaim hook): evicts the installed image or,
  /// when there is none, abandons the images being built (unless keep_building()).
  void reclaim();
  /// With a snapshot agent: reclaim() never abandons an image being built, so that every
  /// save's image is whole when it is handed over; a starved save waits instead, for the
  /// buffers of a save that commits (then installed, then evicted). Needs a pool that holds a
  /// whole save (the Snapshotter checks). Before the first save.
  void keep_building() { keep_building_ = true; }

 private:
  friend class HotImage;
  void install(std::shared_ptr<HotImage> image);
  void gone();  // an image was destroyed

  StagingPool& pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<HotImage> installed_;
  std::vector<std::weak_ptr<HotImage>> building_;
  uint64_t next_seq_ = 0;
  size_t live_ = 0;  // images not destroyed yet
  bool keep_building_ = false;
};

}  // namespace tsnap::stage

namespace tsnap {

/// What a public handle refers to.
struct TSNAP_HIDDEN HotSnapshot::Impl {
  std::string name;
  std::filesystem::path path;
  std::shared_ptr<const Manifest> manifest;
  std::weak_ptr<stage::HotImage> image;
};

namespace detail {

/// The internals' access to a HotSnapshot.
struct HotAccess {
  static HotSnapshot make(std::shared_ptr<const HotSnapshot::Impl> impl);
  /// Pins the image for one load. Errors: InvalidArgument for an empty handle,
  /// IoError(kNotFound) once it was evicted.
  static std::shared_ptr<stage::HotImage> pin(const HotSnapshot& snapshot);
};

}  // namespace detail
}  // namespace tsnap
