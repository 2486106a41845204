// `tsnap cat SNAPSHOT KEY`: one tensor's dtype, shape, summary statistics and values, printed
// the way PyTorch prints tensors (4 decimals or scientific notation, aligned columns, and for
// more than 1000 elements only the first and last 3 items of each dimension). Reads through
// the snapshot's mapping, without LibTorch: only the chunks under the tensor (or the rows asked
// for) are read and verified; a key stored as pieces (a distributed save of sharded state) is
// assembled from the pieces that overlap what is asked for (cli/keys.h).

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
#include "format/dtype.h"
#include "format/layout.h"
#include "tsnap/error.h"

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
  std::string rows;    // "START:END"
  bool full = false;
  bool no_verify = false;
};

// The elements a print shows: every one, or for a summary the first and last kEdge items of
// every longer dimension; their shape, and their row-major indices in the tensor.
struct Shown {
  std::vector<int64_t> shape;
  std::vector<int64_t> index;
};

Shown shown_elements(const std::vector<int64_t>& shape, bool summary) {
  Shown s;
  std::vector<std::vector<int64_t>> picks(shape.size());
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t n = shape[d];
    for (int64_t i = 0; i < n; ++i) {
      if (summary && n > 2 * kEdge && i == kEdge) i = n - kEdge;
      picks[d].push_back(i);
    }
    s.shape.push_back(static_cast<int64_t>(picks[d].size()));
    count *= s.shape.back();
  }
  // Row-major walk over the picks (an odometer over the dimensions).
  std::vector<size_t> at(shape.size(), 0);
  for (int64_t k = 0; k < count; ++k) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + picks[d][at[d]];
    s.index.push_back(flat);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++at[d] < picks[d].size()) break;
      at[d] = 0;
    }
  }
  return s;
}

// Every shown value as text, in row-major order, padded to one width.
std::vector<std::string> cells(const Values& v, const std::vector<int64_t>& index) {
  std::vector<std::string> out;
  char text[64];
  if (v.dtype == at::kBool) {
    for (int64_t i : index) out.push_back(v.integer(i) ? "True" : "False");
  } else if (!format::is_floating(v.dtype)) {
    for (int64_t i : index) out.push_back(std::to_string(v.integer(i)));
  } else {
    std::vector<double> p;
    for (int64_t i : index) p.push_back(v.real(i));
    // PyTorch's choice: integral values print as "3.", a wide range or extreme magnitudes
    // switch to scientific notation, anything else prints with 4 decimals.
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    bool integral = true;
    for (double x : p) {
      if (!std::isfinite(x)) continue;
      integral = integral && x == std::ceil(x);
      if (x != 0) {
        lo = std::min(lo, std::abs(x));
        hi = std::max(hi, std::abs(x));
      }
    }
    const bool any = hi > 0;
    const bool sci = any && (hi / lo > 1000 || hi > 1e8 || (!integral && lo < 1e-4));
    for (double x : p) {
      if (std::isnan(x)) {
        out.push_back("nan");
      } else if (std::isinf(x)) {
        out.push_back(x > 0 ? "inf" : "-inf");
      } else {
        std::snprintf(text, sizeof text, sci ? "%.4e" : (integral ? "%.0f." : "%.4f"), x);
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
std::string block(const std::vector<std::string>& all, const std::vector<int64_t>& shown,
                  const std::vector<int64_t>& full_shape, bool summary, int64_t dim, size_t& pos,
                  size_t indent) {
  const int64_t dims = static_cast<int64_t>(shown.size());
  const int64_t n = shown[dim];
  const bool cut = summary && full_shape[dim] > 2 * kEdge;
  std::vector<std::string> items;
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdge) items.push_back(dim + 1 == dims ? " ..." : "...");
    items.push_back(dim + 1 == dims
                        ? all[pos++]
                        : block(all, shown, full_shape, summary, dim + 1, pos, indent + 1));
  }
  std::string out = "[";
  if (dim + 1 == dims) {
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
    const std::string sep = "," + std::string(dims - dim - 1, '\n') + std::string(indent + 1, ' ');
    for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  }
  return out + "]";
}

std::string values_text(const Values& v, bool full) {
  if (v.shape.empty()) return "tensor(" + cells(v, {0})[0] + ")";
  if (v.numel() == 0) {
    std::string size;
    for (int64_t d : v.shape) size += (size.empty() ? "" : ", ") + std::to_string(d);
    return v.shape.size() == 1 ? "tensor([])" : "tensor([], size=(" + size + "))";
  }
  const bool summary = !full && v.numel() > kThreshold;
  const Shown shown = shown_elements(v.shape, summary);
  size_t pos = 0;
  return "tensor(" + block(cells(v, shown.index), shown.shape, v.shape, summary, 0, pos, 7) + ")";
}

// min / max / mean / std over the finite values.
std::string stats_text(const Values& v) {
  if (v.numel() == 0 || v.dtype == at::kBool) return "";
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < v.numel(); ++i) {
    const double x = v.real(i);
    if (!std::isfinite(x)) continue;
    ++finite;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sq += x * x;
  }
  char text[160];
  if (finite == 0) return "no finite values";
  const double mean = sum / finite;
  const double var = finite > 1 ? std::max(0.0, (sq - sum * mean) / (finite - 1)) : 0.0;
  std::snprintf(text, sizeof text, "min %.6g  max %.6g  mean %.6g  std %.6g", lo, hi, mean,
                std::sqrt(var));
  std::string out = text;
  if (finite < v.numel()) out += "  (" + std::to_string(v.numel() - finite) + " nan/inf)";
  return out;
}

int run_cat(const CatOptions& options) {
  const std::shared_ptr<const restore::MappedSnapshot> snap =
      restore::MappedSnapshot::open(options.snapshot, !options.no_verify);
  std::string name = options.key;
  if (!options.object.empty()) {
    format::check_object(key_names(snap->manifest()), options.object, options.snapshot.string());
    name = options.object + "/" + options.key;
  }
  const KeyView key = key_view(snap->manifest(), name, options.snapshot);
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
  const Values t = read_key(*snap, key, rows);
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
    const Manifest& m = snap->manifest();
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
  sub->add_option("--object", options->object, "KEY is checkpoint object NAME's (reads 'NAME/KEY')")
      ->type_name("NAME");
  sub->add_option("--rows", options->rows, "Only rows [START, END) along dimension 0")
      ->type_name("START:END");
  sub->add_flag("--full", options->full, "Print every value, however many");
  sub->add_flag("--no-verify", options->no_verify, "Do not check the chunks' hashes");
  return {sub, [options] { return run_cat(*options); }};
}

}  // namespace tsnap::cli
