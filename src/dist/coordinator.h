#pragma once
// What a distributed save needs from its process group: agreeing on save ids, publishing each
// rank's report, and rank 0's verdict. The pipeline and the periodic hooks see only this
// interface, which a tsnap::DistGroup hands them. Its one implementation is dist_group.cpp's,
// over a c10d Store, and a DistGroup always makes that one itself (nothing can pass another
// in), so tests exercise it over a real store: a TCPStore between rank processes, or a
// HashStore in one process. dist/ sits below pipeline/, which takes a DistGroup in its options.

#include <string>
#include <vector>

namespace tsnap::dist {

/// Thread-safety: every method may be called from several saves' threads at once.
class Coordinator {
 public:
  virtual ~Coordinator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// The id of this rank's save of snapshot `name`: every rank's n-th save of `name` gets the
  /// same id, so ranks agree on a save by its name, not by how many saves came before it (a
  /// rank that skipped or failed to start one save stays in step for the next). Never blocks.
  virtual std::string save_id(const std::string& name) = 0;
  /// Publishes this rank's report on save `id` (its manifest part, or its error).
  virtual void publish(const std::string& id, const std::string& report) = 0;
  /// Rank 0: every rank's report in rank order. Throws tsnap::Error naming the ranks that did not
  /// report within the group's timeout.
  virtual std::vector<std::string> gather(const std::string& id) = 0;
  /// Rank 0: publishes the outcome of save `id`: empty when committed, else the error.
  virtual void decide(const std::string& id, const std::string& outcome) = 0;
  /// Other ranks: rank 0's outcome of save `id`. Throws tsnap::Error when it does not come
  /// within the group's timeout (rank 0 dead or stuck).
  virtual std::string outcome(const std::string& id) = 0;
  /// Other ranks: says this rank needs nothing more of save `id` from the store (it has read
  /// the outcome, or reported its error).
  virtual void acknowledge(const std::string& id) = 0;
  /// Rank 0, after decide(): waits (at most the group's timeout) until `count` ranks have
  /// acknowledged, so that rank 0, which may host the store, does not end before they have
  /// read its verdict. Never throws.
  virtual void await_acknowledgements(const std::string& id, int count) noexcept = 0;
  /// Rank 0, when gather() failed: how many other ranks did report on save `id`. Never throws.
  virtual int reported_others(const std::string& id) noexcept = 0;

  /// Periodic hooks: appends `text` to the group's sequence of triggers (a snapshot due at a
  /// step, decided by one rank, that every rank takes) and returns its index.
  virtual int64_t post_trigger(const std::string& text) = 0;
  /// The trigger at `index` (0-based, in posting order), or "" when none is posted yet.
  /// Never blocks for long: a single round trip.
  virtual std::string poll_trigger(int64_t index) = 0;
};

}  // namespace tsnap::dist
