#include "stage/hot_image.h"

#include <map>
#include <utility>

#include "tsnap/error.h"

namespace tsnap::stage {

HotImage::HotImage(HotImages& registry, StagingPool& pool, uint64_t seq, std::string name,
                   std::filesystem::path path, const plan::Plan& plan)
    : registry_(registry), pool_(pool), seq_(seq), name_(std::move(name)), path_(std::move(path)) {
  bufs_.resize(plan.files.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    names_.push_back(plan.files[f].name);
    bufs_[f].assign(plan.files[f].num_chunks(), -1);
    missing_ += bufs_[f].size();
  }
}

HotImage::~HotImage() {
  abandon();
  registry_.gone();
}

bool HotImage::keep(size_t file, uint64_t chunk, int buf) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_ || file >= bufs_.size() || chunk >= bufs_[file].size() ||
      bufs_[file][chunk] >= 0) {
    return false;
  }
  bufs_[file][chunk] = buf;
  --missing_;
  return true;
}

bool HotImage::whole() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !abandoned_;
}

void HotImage::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_ = true;
  for (std::vector<int>& chunks : bufs_) {
    for (int& b : chunks) {
      if (b >= 0) pool_.release(b);
      b = -1;
    }
  }
}

bool HotImage::complete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !abandoned_ && missing_ == 0;
}

void HotImage::commit(Manifest manifest) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (manifest.files.size() != bufs_.size()) return;  // not this image's save: never install
    std::map<std::string, size_t> by_name;
    for (size_t f = 0; f < names_.size(); ++f) by_name.emplace(names_[f], f);
    plan_file_.clear();
    for (const FileRecord& file : manifest.files) {
      const auto it = by_name.find(file.name);
      if (it == by_name.end()) return;
      plan_file_.push_back(it->second);
    }
    manifest_ = std::make_shared<const Manifest>(std::move(manifest));
  }
  registry_.install(shared_from_this());
}

size_t HotImage::file_index(const FileRecord& file) const {
  const std::vector<FileRecord>& files = manifest_->files;
  if (files.empty() || &file < files.data() || &file >= files.data() + files.size()) {
    throw_error(ErrorCode::kInvalidArgument,
                "file record " + file.name + " is not one of hot image " + path_.string());
  }
  return plan_file_[static_cast<size_t>(&file - files.data())];
}

const uint8_t* HotImage::chunk(const FileRecord& file, uint64_t chunk) const {
  const size_t f = file_index(file);
  std::lock_guard<std::mutex> lock(mu_);
  const int b = chunk < bufs_[f].size() ? bufs_[f][chunk] : -1;
  if (b < 0) {
    throw_error(ErrorCode::kInternal, "hot image " + path_.string() + " lacks chunk " +
                                          std::to_string(chunk) + " of " + file.name);
  }
  return pool_.data(b);
}

uint8_t* HotImage::chunk_for_test(const FileRecord& file, uint64_t chunk) {
  return const_cast<uint8_t*>(this->chunk(file, chunk));
}

HotImages::~HotImages() {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<HotImage> last = std::move(installed_);
  lock.unlock();
  last.reset();  // outside mu_: its destructor calls gone()
  lock.lock();
  cv_.wait(lock, [&] { return live_ == 0; });
}

std::shared_ptr<HotImage> HotImages::begin(const plan::Plan& plan, std::string name,
                                           std::filesystem::path path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto image =
      std::make_shared<HotImage>(*this, pool_, next_seq_++, std::move(name), std::move(path), plan);
  ++live_;
  // Forget the images that are gone, then remember this one.
  std::vector<std::weak_ptr<HotImage>> alive;
  for (std::weak_ptr<HotImage>& w : building_) {
    if (!w.expired()) alive.push_back(std::move(w));
  }
  alive.push_back(image);
  building_ = std::move(alive);
  return image;
}

void HotImages::install(std::shared_ptr<HotImage> image) {
  std::shared_ptr<HotImage> dropped;  // destroyed after mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = building_.begin(); it != building_.end(); ++it) {
    if (it->lock() == image) {
      building_.erase(it);
      break;
    }
  }
  if (!image->complete() || (installed_ && installed_->seq_ > image->seq_)) return;
  dropped = std::move(installed_);
  installed_ = std::move(image);
}

void HotImages::reclaim() {
  std::shared_ptr<HotImage> dropped;
  std::vector<std::shared_ptr<HotImage>> building;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (installed_) {
      dropped = std::move(installed_);
    } else if (!keep_building_) {
      for (const std::weak_ptr<HotImage>& w : building_) {
        if (std::shared_ptr<HotImage> image = w.lock()) building.push_back(std::move(image));
      }
      // Abandoned under mu_, so that none of them can be installed meanwhile.
      for (const std::shared_ptr<HotImage>& image : building) image->abandon();
    }
  }
  // `dropped` gives its buffers back here unless a load pins it (then when that load ends).
}

void HotImages::gone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --live_;
  }
  cv_.notify_all();
}

HotSnapshot HotImages::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!installed_) return {};
  return detail::HotAccess::make(std::make_shared<const HotSnapshot::Impl>(HotSnapshot::Impl{
      installed_->name(), installed_->path(), installed_->manifest(), installed_}));
}

}  // namespace tsnap::stage

namespace tsnap {
namespace detail {

HotSnapshot HotAccess::make(std::shared_ptr<const HotSnapshot::Impl> impl) {
  HotSnapshot s;
  s.impl_ = std::move(impl);
  return s;
}

std::shared_ptr<stage::HotImage> HotAccess::pin(const HotSnapshot& snapshot) {
  if (!snapshot.impl_) {
    throw_error(ErrorCode::kInvalidArgument,
                "empty HotSnapshot: the Snapshotter had no hot snapshot (keep_hot off, no save "
                "committed yet, or evicted)");
  }
  std::shared_ptr<stage::HotImage> image = snapshot.impl_->image.lock();
  if (!image) {
    throw_error(ErrorCode::kNotFound,
                "hot snapshot " + snapshot.impl_->path.string() +
                    " is no longer in memory: a later save replaced it or needed its staging "
                    "buffers; load it from its directory instead",
                ENOENT);
  }
  return image;
}

}  // namespace detail

namespace {

const HotSnapshot::Impl& checked(const std::shared_ptr<const HotSnapshot::Impl>& impl) {
  if (!impl) throw_error(ErrorCode::kInvalidArgument, "empty HotSnapshot");
  return *impl;
}

}  // namespace

const std::string& HotSnapshot::name() const { return checked(impl_).name; }
const std::filesystem::path& HotSnapshot::path() const { return checked(impl_).path; }
const Manifest& HotSnapshot::manifest() const { return *checked(impl_).manifest; }
bool HotSnapshot::resident() const { return impl_ && !impl_->image.expired(); }

}  // namespace tsnap
