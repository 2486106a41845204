#include "state/apply.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common/shape.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

template <class List, class Fn>
void append_list(std::ostringstream& out, const char* what, const List& items, Fn&& item) {
  if (items.empty()) return;
  if (out.tellp() > 0) out << "; ";
  out << items.size() << ' ' << what << ": ";
  for (size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << item(items[i]);
}

// The kinds of dtype between which apply converts freely.
const char* dtype_kind(at::ScalarType t) {
  if (t == at::kBool) return "bool";
  if (at::isComplexType(t)) return "complex";
  if (at::isFloatingType(t)) return "floating";
  return "integer";
}

}  // namespace

std::string ApplyReport::to_string() const {
  std::ostringstream out;
  auto same = [](const std::string& s) -> const std::string& { return s; };
  append_list(out, "missing", missing, same);
  append_list(out, "unexpected", unexpected, same);
  append_list(out, "mismatched", mismatched,
              [](const Mismatch& m) { return m.key + " (" + m.reason + ")"; });
  return out.tellp() > 0 ? out.str() : "ok";
}

namespace detail {

bool ApplyPlan::copy(const std::string& key, const StateEntry& entry,
                     const at::Tensor& destination) {
  const at::Tensor& source = entry.tensor;
  if (std::string(dtype_kind(source.scalar_type())) != dtype_kind(destination.scalar_type())) {
    mismatch(key, std::string("dtype ") + c10::toString(source.scalar_type()) + " in state, " +
                      c10::toString(destination.scalar_type()) + " in object");
    return false;
  }
  at::Tensor target = destination;
  if (entry.shard) {
    const ShardSpec& shard = *entry.shard;
    if (at::IntArrayRef(shard.global_shape) != destination.sizes()) {
      mismatch(key, "global shape " + shape_string(shard.global_shape) + " in state, " +
                        shape_string(destination.sizes()) + " in object");
      return false;
    }
    bool inside =
        shard.offsets.size() == shard.global_shape.size() && source.dim() == destination.dim();
    for (int64_t d = 0; inside && d < source.dim(); ++d) {
      inside = shard.offsets[d] >= 0 && shard.offsets[d] + source.size(d) <= destination.size(d);
    }
    if (!inside) {
      mismatch(key, "piece of shape " + shape_string(source.sizes()) + " at offsets " +
                        shape_string(shard.offsets) + " lies outside " +
                        shape_string(destination.sizes()));
      return false;
    }
    for (int64_t d = 0; d < source.dim(); ++d) {
      target = target.narrow(d, shard.offsets[d], source.size(d));
    }
  } else if (source.sizes() != destination.sizes()) {
    mismatch(key, "shape " + shape_string(source.sizes()) + " in state, " +
                      shape_string(destination.sizes()) + " in object");
    return false;
  }
  then(key, [source, target] { target.copy_(source); });
  return true;
}

ApplyReport ApplyPlan::finish(bool strict, const std::string& what) {
  std::sort(report_.missing.begin(), report_.missing.end());
  std::sort(report_.unexpected.begin(), report_.unexpected.end());
  std::sort(report_.mismatched.begin(), report_.mismatched.end(),
            [](const Mismatch& a, const Mismatch& b) { return a.key < b.key; });
  if (strict && !report_.ok()) {
    const auto code =
        report_.mismatched.empty() ? ErrorCode::kKeyNotFound : ErrorCode::kShapeMismatch;
    throw_error(code, what + " (strict) changed nothing: " + report_.to_string());
  }
  at::NoGradGuard no_grad;
  for (auto& [key, action] : actions_) {
    action();
    if (!key.empty()) report_.applied.push_back(key);
  }
  actions_.clear();
  std::sort(report_.applied.begin(), report_.applied.end());
  return std::move(report_);
}

void plan_tensors(const std::vector<std::pair<std::string, at::Tensor>>& destinations,
                  const StateDict& state, const std::string& prefix, ApplyPlan& plan) {
  std::set<std::string> known;
  for (const auto& [key, tensor] : destinations) {
    known.insert(key);
    if (!state.contains(key)) {
      plan.missing(prefix + key);
    } else {
      plan.copy(prefix + key, state.entry(key), tensor);
    }
  }
  for (const auto& [key, entry] : state) {
    if (!known.count(key)) plan.unexpected(prefix + key);
  }
}

}  // namespace detail
}  // namespace tsnap
