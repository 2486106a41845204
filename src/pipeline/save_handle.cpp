#include "tsnap/save_handle.h"

#include <nlohmann/json.hpp>

#include "pipeline/save_state.h"
#include "tsnap/error.h"

namespace tsnap {
namespace detail {

void SaveState::mark_staged(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (staged) return;
    staged = true;
    stage_error = e;
  }
  cv.notify_all();
}

void SaveState::complete(std::exception_ptr e) {
  std::vector<std::function<void(std::exception_ptr)>> to_run;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    if (!staged) {
      staged = true;
      stage_error = e;
    }
    done = true;
    error = e;
    to_run.swap(callbacks);
  }
  cv.notify_all();
  for (auto& fn : to_run) fn(e);
}

}  // namespace detail

namespace {

detail::SaveState& state_of(const std::shared_ptr<detail::SaveState>& s) {
  if (!s) throw_error(ErrorCode::kInvalidArgument, "empty SaveHandle");
  return *s;
}

}  // namespace

void SaveHandle::wait() const {
  detail::SaveState& s = state_of(state_);
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.done) s.owner.check("this save's Snapshotter");
  s.cv.wait(lock, [&] { return s.done; });
  if (s.error) std::rethrow_exception(s.error);
}

bool SaveHandle::wait_for(std::chrono::milliseconds timeout) const {
  detail::SaveState& s = state_of(state_);
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.done) s.owner.check("this save's Snapshotter");
  return s.cv.wait_for(lock, timeout, [&] { return s.done; });
}

bool SaveHandle::done() const {
  detail::SaveState& s = state_of(state_);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.done;
}

void SaveHandle::wait_staged() const {
  detail::SaveState& s = state_of(state_);
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.staged) s.owner.check("this save's Snapshotter");
  s.cv.wait(lock, [&] { return s.staged; });
  if (s.stage_error) std::rethrow_exception(s.stage_error);
}

void SaveHandle::on_complete(std::function<void(std::exception_ptr)> fn) const {
  detail::SaveState& s = state_of(state_);
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.done) {
    s.callbacks.push_back(std::move(fn));
    return;
  }
  std::exception_ptr e = s.error;
  lock.unlock();
  fn(e);
}

SaveStats SaveHandle::stats() const {
  detail::SaveState& s = state_of(state_);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

std::filesystem::path SaveHandle::path() const { return state_of(state_).path; }

std::exception_ptr SaveHandle::error() const {
  detail::SaveState& s = state_of(state_);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.error;
}

void to_json(nlohmann::json& out, const SaveStats& s) {
  out = {{"stall_s", s.stall_s},
         {"stage_s", s.stage_s},
         {"write_s", s.write_s},
         {"commit_s", s.commit_s},
         {"total_s", s.total_s},
         {"coordinate_s", s.coordinate_s},
         {"bytes", s.bytes},
         {"written_bytes", s.written_bytes},
         {"linked_bytes", s.linked_bytes},
         {"reused_bytes", s.reused_bytes},
         {"tensor_bytes", s.tensor_bytes},
         {"chunks", s.chunks},
         {"files", s.files},
         {"tensors", s.tensors},
         {"buffer_waits", s.buffer_waits},
         {"buffers_reused", s.buffers_reused},
         {"engine", s.engine},
         {"direct", s.direct},
         {"leftover", s.leftover},
         {"unchanged_since", s.unchanged_since},
         {"unchanged_tensors", s.unchanged_tensors},
         {"stale", s.stale},
         {"throughput_gbps", s.throughput_gbps()}};
}

}  // namespace tsnap
