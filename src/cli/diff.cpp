// `tsnap diff A B`: which tensors of two snapshots differ and by how much. Like diff(1), it
// exits 0 when they hold the same tensors with the same values and 1 when anything differs.
// Tensors are read from the snapshots' mappings (verified chunks, no LibTorch) and compared in
// slices, bytes first, so that equal tensors cost one memcmp. A key stored as pieces
// (a distributed save of sharded state) is compared whole, assembled from its pieces: so a
// snapshot and its consolidated copy are identical.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/keys.h"
#include "cli/output.h"
#include "common/glob.h"
#include "format/layout.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSlice = 1 << 20;  // elements compared at once

struct DiffOptions {
  fs::path a, b;
  double atol = 0;
  bool no_verify = false;
  std::string object, a_object, b_object;  // compare these checkpoint objects' keys
  bool unchanged = false;                  // list the identical tensors too
};

// The step a snapshot holds: its manifest's, else its metadata's (periodic snapshots).
std::optional<int64_t> snapshot_step(const Manifest& m) {
  return m.step ? m.step : format::step_of(m.metadata);
}

// The keys of one side: every key, or those of checkpoint object `object` without its prefix;
// by the name shown, the key stored.
std::map<std::string, std::string> side_keys(const Manifest& m, const std::string& object,
                                             const fs::path& snapshot) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> keys = key_names(m);
  if (!object.empty()) format::check_object(keys, object, snapshot.string());
  const std::string prefix = object.empty() ? "" : object + "/";
  for (const std::string& k : keys) {
    if (k.compare(0, prefix.size(), prefix) == 0) out.emplace(k.substr(prefix.size()), k);
  }
  return out;
}

struct Difference {
  double max_abs = 0;  ///< inf where one side is nan and the other not, or infinities differ
  int64_t elements = 0;
};

// Compares two tensors of one shape element by element. nan equals nan here: a diff reports
// changed values, and a nan that stayed a nan did not change.
Difference compare(const Values& a, const Values& b) {
  const bool same_dtype = a.dtype == b.dtype;
  const int64_t n = a.numel();
  Difference d;
  for (int64_t i = 0; i < n; i += kSlice) {
    const int64_t m = std::min(kSlice, n - i);
    if (same_dtype && std::memcmp(a.at(i), b.at(i), m * a.element_bytes()) == 0) continue;
    for (int64_t j = i; j < i + m; ++j) {
      const double x = a.real(j), y = b.real(j);
      double abs = std::abs(x - y);
      if (x == y || (std::isnan(x) && std::isnan(y))) {
        abs = 0;
      } else if (std::isnan(x) != std::isnan(y)) {
        abs = std::numeric_limits<double>::infinity();
      }
      d.max_abs = std::max(d.max_abs, abs);
      d.elements += abs > 0;
    }
  }
  return d;
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

int run_diff(const DiffOptions& options) {
  const auto ra = restore::MappedSnapshot::open(options.a, !options.no_verify);
  const auto rb = restore::MappedSnapshot::open(options.b, !options.no_verify);
  const auto in_a = side_keys(
      ra->manifest(), options.a_object.empty() ? options.object : options.a_object, options.a);
  const auto in_b = side_keys(
      rb->manifest(), options.b_object.empty() ? options.object : options.b_object, options.b);
  std::vector<std::string> keys;
  for (const auto& [k, stored] : in_a) keys.push_back(k);
  for (const auto& [k, stored] : in_b) {
    if (in_a.count(k) == 0) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());

  Table table({"", "TENSOR", "DIFFERENCE"});
  std::vector<std::string> identical;
  int64_t only_a = 0, only_b = 0, differ = 0, common = 0;
  for (const std::string& k : keys) {
    if (in_b.count(k) == 0) {
      table.add_row({"-", k, "only in A"});
      ++only_a;
      continue;
    }
    if (in_a.count(k) == 0) {
      table.add_row({"+", k, "only in B"});
      ++only_b;
      continue;
    }
    ++common;
    const KeyView kx = key_view(ra->manifest(), in_a.at(k), options.a);
    const KeyView ky = key_view(rb->manifest(), in_b.at(k), options.b);
    const TensorRecord &x = *kx.pieces.front(), &y = *ky.pieces.front();
    std::string dtypes;
    if (x.dtype != y.dtype)
      dtypes = " (" + dtype_string(x.dtype) + " vs " + dtype_string(y.dtype) + ")";
    if (kx.read_shape() != ky.read_shape()) {
      table.add_row({"!", k,
                     "shape " + shape_string(kx.read_shape()) + " vs " +
                         shape_string(ky.read_shape()) + dtypes});
      ++differ;
      continue;
    }
    const Difference d = compare(read_key(*ra, kx), read_key(*rb, ky));
    if (d.elements == 0 && dtypes.empty()) {
      identical.push_back(k);
      if (options.unchanged) table.add_row({"=", k, "identical"});
      continue;
    }
    if (d.max_abs <= options.atol && dtypes.empty()) continue;
    table.add_row({"!", k,
                   "max abs diff " + number(d.max_abs) + " in " + std::to_string(d.elements) +
                       " of " + count_of(kx.numel(), "element", "elements") + dtypes});
    ++differ;
  }
  if (!table.empty()) table.print(std::cout);
  // A snapshot of a later step whose optimizer moments are identical holds stale state.
  const std::optional<int64_t> step_a = snapshot_step(ra->manifest()),
                               step_b = snapshot_step(rb->manifest());
  if (step_a && step_b && *step_a != *step_b) {
    std::vector<std::string> stale;
    for (const std::string& k : identical) {
      for (const std::string& pattern : format::optimizer_moment_globs()) {
        if (detail::glob_match(pattern, in_b.at(k))) {
          stale.push_back(k);
          break;
        }
      }
    }
    if (!stale.empty()) {
      std::cout << "warning: steps " << *step_a << " and " << *step_b << " hold "
                << count_of(static_cast<int64_t>(stale.size()), "identical optimizer moment",
                            "identical optimizer moments")
                << " (stale state?): ";
      for (size_t i = 0; i < stale.size() && i < 3; ++i) std::cout << (i ? ", " : "") << stale[i];
      std::cout << (stale.size() > 3 ? ", ...\n" : "\n");
    }
  }
  if (only_a + only_b + differ == 0) {
    std::cout << "identical: " << count_of(common, "tensor", "tensors") << '\n';
    return kExitOk;
  }
  std::cout << differ << " of " << count_of(common, "common tensor", "common tensors")
            << " differ, " << identical.size() << " identical; " << only_a << " only in A, "
            << only_b << " only in B\n";
  return kExitFailed;
}

}  // namespace

Command add_diff(CLI::App& app) {
  auto options = std::make_shared<DiffOptions>();
  CLI::App* sub = app.add_subcommand("diff", "Compare the tensors of two snapshots");
  sub->footer(
      "List the tensors that differ between snapshots A and B: keys only in one of them (-, +), "
      "and common keys whose shape or dtype differs or whose values differ by more than --atol "
      "(!), with the largest absolute difference and how many elements differ (nan equals "
      "nan). --object NAME compares checkpoint object NAME's keys of both, without the 'NAME/' "
      "prefix; --a-object/--b-object pick one side's object, e.g. a checkpoint's model against "
      "its export (bare keys). --unchanged lists the identical tensors too (=); when the "
      "snapshots hold different steps, optimizer moments that are identical are flagged as "
      "stale state. Exit status, like diff(1): 0 identical, 1 different (or an error).");
  sub->add_option("A", options->a, "First snapshot directory")->required()->type_name("DIR");
  sub->add_option("B", options->b, "Second snapshot directory")->required()->type_name("DIR");
  sub->add_option("--atol", options->atol, "Values within this absolute difference are equal")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--no-verify", options->no_verify, "Do not check the chunks' hashes");
  sub->add_flag("-u,--unchanged", options->unchanged,
                "List the identical tensors too (=), e.g. to find state that stopped updating");
  sub->add_option("--object", options->object,
                  "Compare only checkpoint object NAME's keys ('NAME/KEY' shown as 'KEY')")
      ->type_name("NAME");
  sub->add_option("--a-object", options->a_object,
                  "Object of A to compare (e.g. against B's bare keys: an export)")
      ->type_name("NAME");
  sub->add_option("--b-object", options->b_object, "Object of B to compare")->type_name("NAME");
  return {sub, [options] { return run_diff(*options); }};
}

}  // namespace tsnap::cli
