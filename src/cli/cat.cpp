// `tsnap cat SNAPSHOT KEY`: one tensor's dtype, shape, summary statistics and values, printed
// the way PyTorch prints tensors (4 decimals or scientific notation, aligned columns, and for
// more than 1000 elements only the first and last 3 items of each dimension). Reads through
// the lazy reader: only the chunks under the tensor (or the rows asked for) are read and
// verified; a key stored as pieces (a distributed save of sharded state) is assembled from the
// pieces that overlap what is asked for (cli/keys.h).

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/keys.h"
#include "cli/output.h"
#include "format/layout.h"
#include "tsnap/error.h"
#include "tsnap/reader.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kThreshold = 1000;  // PyTorch's print options: threshold, edgeitems,
constexpr int64_t kEdge = 3;          // linewidth
constexpr size_t kLineWidth = 80;

struct CatOptions {
  fs::path snapshot;
  std::string key;
  std::string object;  // KEY is this checkpoint object's
  std::string rows;  // "START:END"
  bool full = false;
  bool no_verify = false;
};

// The first and last kEdge items of every longer dimension (what a summary shows).
at::Tensor edges(at::Tensor t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t n = t.size(d);
    if (n > 2 * kEdge) t = at::cat({t.narrow(d, 0, kEdge), t.narrow(d, n - kEdge, kEdge)}, d);
  }
  return t;
}

// Every shown value as text, in row-major order, padded to one width.
std::vector<std::string> cells(const at::Tensor& shown) {
  std::vector<std::string> out;
  const int64_t n = shown.numel();
  char text[64];
  if (shown.scalar_type() == at::kBool) {
    const at::Tensor b = shown.contiguous();
    for (int64_t i = 0; i < n; ++i) out.push_back(b.data_ptr<bool>()[i] ? "True" : "False");
  } else if (!at::isFloatingType(shown.scalar_type())) {
    const at::Tensor v = shown.to(at::kLong).contiguous();
    for (int64_t i = 0; i < n; ++i) out.push_back(std::to_string(v.data_ptr<int64_t>()[i]));
  } else {
    const at::Tensor v = shown.to(at::kDouble).contiguous();
    const double* p = v.data_ptr<double>();
    // PyTorch's choice: integral values print as "3.", a wide range or extreme magnitudes
    // switch to scientific notation, anything else prints with 4 decimals.
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    bool integral = true;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(p[i])) continue;
      integral = integral && p[i] == std::ceil(p[i]);
      if (p[i] != 0) {
        lo = std::min(lo, std::abs(p[i]));
        hi = std::max(hi, std::abs(p[i]));
      }
    }
    const bool any = hi > 0;
    const bool sci = any && (hi / lo > 1000 || hi > 1e8 || (!integral && lo < 1e-4));
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(p[i])) {
        out.push_back("nan");
      } else if (std::isinf(p[i])) {
        out.push_back(p[i] > 0 ? "inf" : "-inf");
      } else {
        std::snprintf(text, sizeof text, sci ? "%.4e" : (integral ? "%.0f." : "%.4f"), p[i]);
        out.push_back(text);
      }
    }
  }
  size_t width = 0;
  for (const std::string& c : out) width = std::max(width, c.size());
  for (std::string& c : out) c.insert(0, width - c.size(), ' ');
  return out;
}

// One dimension's items joined: the innermost wrapped at the line width, outer ones one per
// line (a blank line more per level, as PyTorch does); "..." stands for what a summary skips.
std::string block(const std::vector<std::string>& all, const at::Tensor& shown,
                  const std::vector<int64_t>& full_shape, bool summary, int64_t dim, size_t& pos,
                  size_t indent) {
  const int64_t n = shown.size(dim);
  const bool cut = summary && full_shape[dim] > 2 * kEdge;
  std::vector<std::string> items;
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdge) items.push_back(dim + 1 == shown.dim() ? " ..." : "...");
    items.push_back(dim + 1 == shown.dim()
                        ? all[pos++]
                        : block(all, shown, full_shape, summary, dim + 1, pos, indent + 1));
  }
  std::string out = "[";
  if (dim + 1 == shown.dim()) {
    size_t column = indent + 1;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && column + items[i].size() + 2 > kLineWidth) {
        out += ",\n" + std::string(indent + 1, ' ');
        column = indent + 1;
      } else if (i > 0) {
        out += ", ";
        column += 2;
      }
      out += items[i];
      column += items[i].size();
    }
  } else {
    const std::string sep =
        "," + std::string(shown.dim() - dim - 1, '\n') + std::string(indent + 1, ' ');
    for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  }
  return out + "]";
}

std::string values_text(const at::Tensor& t, bool full) {
  const bool summary = !full && t.numel() > kThreshold;
  const at::Tensor shown = summary ? edges(t) : t;
  const std::vector<std::string> all = cells(shown);
  if (t.dim() == 0) return "tensor(" + all[0] + ")";
  if (t.numel() == 0) {
    std::string size;
    for (int64_t d : t.sizes()) size += (size.empty() ? "" : ", ") + std::to_string(d);
    return t.dim() == 1 ? "tensor([])" : "tensor([], size=(" + size + "))";
  }
  size_t pos = 0;
  return "tensor(" + block(all, shown, t.sizes().vec(), summary, 0, pos, 7) + ")";
}

// min / max / mean / std over the finite values, in slices so that memory stays small.
std::string stats_text(const at::Tensor& t) {
  if (t.numel() == 0 || t.scalar_type() == at::kBool) return "";
  const at::Tensor flat = t.reshape({-1});
  constexpr int64_t kSlice = 1 << 20;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < flat.numel(); i += kSlice) {
    at::Tensor x = flat.narrow(0, i, std::min(kSlice, flat.numel() - i)).to(at::kDouble);
    x = x.masked_select(x.isfinite());
    if (x.numel() == 0) continue;
    finite += x.numel();
    lo = std::min(lo, x.min().item<double>());
    hi = std::max(hi, x.max().item<double>());
    sum += x.sum().item<double>();
    sq += x.square().sum().item<double>();
  }
  char text[160];
  if (finite == 0) return "no finite values";
  const double mean = sum / finite;
  const double var = finite > 1 ? std::max(0.0, (sq - sum * mean) / (finite - 1)) : 0.0;
  std::snprintf(text, sizeof text, "min %.6g  max %.6g  mean %.6g  std %.6g", lo, hi, mean,
                std::sqrt(var));
  std::string out = text;
  if (finite < t.numel()) out += "  (" + std::to_string(t.numel() - finite) + " nan/inf)";
  return out;
}

int run_cat(const CatOptions& options) {
  const SnapshotReader reader = open(options.snapshot, {.verify = !options.no_verify});
  std::string name = options.key;
  if (!options.object.empty()) {
    format::check_object(reader.keys(), options.object, options.snapshot.string());
    name = options.object + "/" + options.key;
  }
  const KeyView key = key_view(reader.manifest(), name, options.snapshot);
  const TensorRecord& r = *key.pieces.front();
  std::optional<std::pair<int64_t, int64_t>> rows;
  std::string rows_text;
  if (!options.rows.empty()) {
    const size_t colon = options.rows.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      rows = {std::stoll(options.rows.substr(0, colon)),
              std::stoll(options.rows.substr(colon + 1))};
    } catch (const std::exception&) {
      throw_error(ErrorCode::kInvalidArgument,
                  "--rows takes START:END (rows along dimension 0), not '" + options.rows + "'");
    }
    rows_text = " rows [" + std::to_string(rows->first) + ", " + std::to_string(rows->second) + ")";
  }
  const at::Tensor t = read_key(reader, options.snapshot, key, !options.no_verify, rows);
  std::cout << "key:    " << key.name << rows_text << '\n'
            << "dtype:  " << dtype_string(r.dtype)
            << (r.source_dtype != r.dtype ? " (saved from " + dtype_string(r.source_dtype) + ")"
                                          : "")
            << '\n'
            << "shape:  " << shape_string(key.read_shape()) << " ("
            << count_of(key.numel(), "element", "elements") << ", " << human_bytes(key.bytes())
            << ")\n";
  if (key.pieces.size() == 1 && !r.shard) {
    std::cout << "file:   " << r.file << " bytes [" << r.begin << ", " << r.end << ")\n";
  } else {
    const Manifest& m = reader.manifest();
    std::cout << "stored: " << count_of(key.pieces.size(), "piece", "pieces")
              << (key.ranks(m).size() == 1 ? " (rank " : " (ranks ") << ranks_string(key.ranks(m))
              << ")\n";
    for (const TensorRecord* p : key.pieces) {
      std::cout << "        " << shape_string(p->shape) << " at " << shape_string(p->shard->offsets)
                << ": " << p->file << " bytes [" << p->begin << ", " << p->end << ")\n";
    }
  }
  const std::string stats = stats_text(t);
  if (!stats.empty()) std::cout << "stats:  " << stats << '\n';
  std::cout << values_text(t, options.full) << '\n';
  return kExitOk;
}

}  // namespace

Command add_cat(CLI::App& app) {
  auto options = std::make_shared<CatOptions>();
  CLI::App* sub = app.add_subcommand("cat", "Print one tensor of a snapshot");
  sub->footer(
      "Print KEY's stored dtype, shape, file and byte range, min/max/mean/std of its finite "
      "values, and its values as PyTorch prints them (more than 1000 elements: the first and "
      "last 3 of each dimension). Only the chunks under the tensor are read, and verified. A "
      "key stored as pieces (a distributed save of sharded state) is printed whole, assembled "
      "from its pieces, which are listed.");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  sub->add_option("KEY", options->key, "Tensor name (see `tsnap inspect`)")->required();
  sub->add_option("--object", options->object,
                  "KEY is checkpoint object NAME's (reads 'NAME/KEY')")
      ->type_name("NAME");
  sub->add_option("--rows", options->rows, "Only rows [START, END) along dimension 0")
      ->type_name("START:END");
  sub->add_flag("--full", options->full, "Print every value, however many");
  sub->add_flag("--no-verify", options->no_verify, "Do not check the chunks' hashes");
  return {sub, [options] { return run_cat(*options); }};
}

}  // namespace tsnap::cli
