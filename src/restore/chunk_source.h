#pragma once
// What the two sources of a read have in common (restore/read_chunks.h): the shard files, read
// through an io engine, and a hot image's staging buffers (restore/read_hot_chunks.h). Both give
// chunks to the same processors, which check, hash and scatter them (run_reads).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "io/engine.h"
#include "restore/read_plan.h"
#include "restore/shard_reader.h"
#include "tsnap/load.h"

namespace tsnap::restore {

// Where a load's chunks come from: the shard files, read through an io engine into read
// buffers (FileChunks), or a hot image's staging buffers, in memory already (HotChunks). The
// checks, the hashing and the scatter into the targets (Reads) are the same for both.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Gets chunk `job` of the plan into slot `slot` (a read buffer), then calls done(bytes or
  // -errno), on another thread or at once on this one.
  virtual void fetch(size_t job, int slot, io::Done done) = 0;
  // The bytes of chunk `job`, once fetched into `slot`.
  virtual const uint8_t* data(size_t job, int slot) const = 0;
  // The checks (hashes, error labels) of plan file `file`.
  virtual const ChunkCheck& check(size_t file) const = 0;
  // Chunks read in place: the pieces of chunk `job` (indexes into its pieces, in chunk order)
  // that the fetch put straight into their targets, and the rest of the chunk into the slot's
  // buffer at its offset; null when all of it went to the buffer.
  virtual const std::vector<size_t>* in_place(size_t job) const { return nullptr; }
  // Why the fetch of chunk `job` failed, where the source knows better than an errno (a
  // store's error names the object and the operation); null: the errno says it.
  virtual std::exception_ptr failure(size_t job) const { return nullptr; }
};

/// How many chunks of `plan` a load keeps in flight, each in a buffer of `buf_bytes`: as many
/// as options.read_budget_bytes holds (at least one), or every chunk for an atomic load.
/// Errors: kUnsupported for a chunk over the reader's limit; kInvalidArgument when an atomic
/// load's chunks do not fit the budget.
size_t read_slots(const ReadPlan& plan, const LoadOptions& options, uint64_t buf_bytes);

/// Runs the reads of `plan` from `source` with `slots` fetches at once and `extra` processor
/// threads besides the caller's, then (atomic) scatters them into `targets`; throws the first
/// error (in_place: naming the targets already written).
void run_reads(const ReadPlan& plan, const std::vector<Target>& targets, ChunkSource& source,
               const LoadOptions& options, bool in_place, size_t slots, size_t extra);

}  // namespace tsnap::restore
