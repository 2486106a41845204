#pragma once
// A rank's report on its part of a distributed save, and rank 0's merge of them into the
// snapshot's manifest. A report is JSON: {"name", "replicated": ["key dtype shape", ...], and
// either "manifest": the rank's manifest part as text, or "error": {"code", "message"}}.

#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tsnap::dist {
class Coordinator;
}  // namespace tsnap::dist

namespace tsnap::pipeline {

/// `e` as {"code": <ErrorCode>, "message": ...}; an exception that is not a tsnap::Error is
/// kInternal.
nlohmann::json error_json(std::exception_ptr e);

/// The error `j` (from error_json) describes, rebuilt as the tsnap::Error subclass of its code.
std::exception_ptr error_from_json(const nlohmann::json& j);

/// Rank `rank`'s error `error` (from error_json) as the other ranks get it: kPeerFailed, its
/// message prefixed with "rank <rank> failed (<its code>): ".
nlohmann::json peer_failed(const nlohmann::json& error, int rank);

/// A rank that cannot take part in save `id` (its save_async threw, or a periodic hook learned
/// of the snapshot too late) reports `error` at once: rank 0 decides the save failed, another
/// rank posts its error for rank 0; either way the other ranks fail now, not on the timeout,
/// and every rank's sequence of save ids stays in step. Never throws.
void report_no_part(dist::Coordinator& coordinator, const std::string& id, const std::string& name,
                    std::exception_ptr error) noexcept;

/// Rank 0: the manifest text of the snapshot that `reports` (one per rank, in rank order)
/// make together, with user `metadata`. Checked as a reader would check it before it is
/// returned. Throws the first failed rank's error (its message prefixed with its rank);
/// Error(kPeerFailed) when the ranks disagree on the name or the replicated tensors, or when their
/// pieces do not fit together (overlap, different global shapes, a key both replicated and
/// sharded).
std::string merge_parts(const std::vector<std::string>& reports, const nlohmann::json& metadata);

}  // namespace tsnap::pipeline
