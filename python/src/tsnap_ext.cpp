/// \file
/// tsnap._C: the binding of tsnap's C++ engine for the `tsnap` Python package (python/tsnap/).
///
/// It passes flat `{key: tensor}` dicts and JSON strings; the package flattens nested state and
/// keeps the structure in the metadata. Tensors cross without copies: torch's own pybind11
/// casters (torch/extension.h) wrap the same at::Tensor that the Python object holds.
///
/// The GIL: every call that can block (staging, waits, loads, verify, the Snapshotter's and the
/// hook's destructors) and every call that takes a lock the pipeline's threads also take (done,
/// stats) runs with the GIL released, so a background thread that drops the last reference to a
/// tensor whose Python object it owns (and so takes the GIL to free it) never waits on a thread
/// that holds the GIL while waiting on it. No tsnap thread touches a Python object: the hook's
/// callbacks into Python run on the training thread, holding the GIL again for their duration.

#include <torch/csrc/Dtype.h>
#include <torch/extension.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/save.h"
#include "tsnap/save_handle.h"
#include "tsnap/schedule.h"
#include "tsnap/snapshotter.h"

namespace py = pybind11;
using nlohmann::json;

namespace {

// The exception classes of tsnap.Error's hierarchy (created in PYBIND11_MODULE, never freed).
PyObject* g_error = nullptr;
PyObject* g_io_error = nullptr;
PyObject* g_format_error = nullptr;
PyObject* g_invalid_argument = nullptr;

// Sets the Python exception of a tsnap::Error: its class by the code's class, with the C++
// message, and attributes `code` ("hash_mismatch") and `errno` (0 when none).
void set_python_error(const tsnap::Error& e) {
  PyObject* type = g_error;
  switch (tsnap::error_class(e.code())) {
    case tsnap::ErrorClass::kIoError:
      type = g_io_error;
      break;
    case tsnap::ErrorClass::kFormatError:
      type = g_format_error;
      break;
    case tsnap::ErrorClass::kInvalidArgument:
      type = g_invalid_argument;
      break;
    default:
      break;
  }
  // The library's messages are valid UTF-8; decoding never raises all the same (an
  // exception raised here would replace the tsnap.Error the caller catches).
  const std::string what = e.what();
  py::object message = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()), "backslashreplace"));
  if (!message) {
    PyErr_Clear();
    message = py::str("tsnap: (an error whose message could not be decoded)");
  }
  py::object value = py::reinterpret_borrow<py::object>(type)(message);
  value.attr("code") = tsnap::to_string(e.code());
  value.attr("errno") = e.sys_errno();
  PyErr_SetObject(type, value.ptr());
}

// Rethrows `error` (from a handle) so that the translator turns it into a Python exception.
[[noreturn]] void rethrow(const std::exception_ptr& error) { std::rethrow_exception(error); }

std::optional<at::ScalarType> to_dtype(const py::object& dtype) {
  if (dtype.is_none()) return std::nullopt;
  if (!THPDtype_Check(dtype.ptr())) {
    tsnap::throw_error(
        tsnap::ErrorCode::kInvalidArgument,
        std::string("dtype must be a torch.dtype or None, not ") + Py_TYPE(dtype.ptr())->tp_name);
  }
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

tsnap::Staging to_staging(const std::string& staging) {
  if (staging == "eager") return tsnap::Staging::kEager;
  if (staging == "lazy") return tsnap::Staging::kLazy;
  tsnap::throw_error(tsnap::ErrorCode::kInvalidArgument,
                     "staging must be 'eager' or 'lazy', not '" + staging + "'");
}

tsnap::EngineKind to_engine(const std::string& engine) {
  if (engine == "auto") return tsnap::EngineKind::kAuto;
  if (engine == "io_uring") return tsnap::EngineKind::kUring;
  if (engine == "pwrite") return tsnap::EngineKind::kPwrite;
  tsnap::throw_error(tsnap::ErrorCode::kInvalidArgument,
                     "engine must be 'auto', 'io_uring' or 'pwrite', not '" + engine + "'");
}

json to_json(const std::string& text, const char* what) {
  json value = text.empty() ? json::object() : json::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_object()) {
    tsnap::throw_error(tsnap::ErrorCode::kInvalidArgument,
                       std::string(what) + " must be a JSON object");
  }
  return value;
}

// Where a key's tensor sits in its global tensor: (global shape, offsets), for the pieces of
// sharded state (DTensor shards); keys without one are whole tensors.
using Shards = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

tsnap::StateDict to_state(const std::map<std::string, at::Tensor>& tensors,
                          const Shards& shards = {}) {
  tsnap::StateDict state;
  for (const auto& [key, tensor] : tensors) {
    std::optional<tsnap::ShardSpec> shard;
    if (const auto it = shards.find(key); it != shards.end()) {
      shard = tsnap::ShardSpec{it->second.first, it->second.second};
    }
    state.insert(key, tensor, std::nullopt, std::move(shard));
  }
  for (const auto& [key, spec] : shards) {
    if (tensors.count(key) == 0) {
      tsnap::throw_error(tsnap::ErrorCode::kInvalidArgument,
                         "shard spec for '" + key + "', which has no tensor");
    }
  }
  return state;
}

// The c10d Store behind a torch.distributed.Store object. torch registers Store with pybind11
// and an intrusive_ptr holder; the cast works because this module shares pybind11's internals
// with torch._C (same pybind11 headers and ABI id: python/CMakeLists.txt).
c10::intrusive_ptr<c10d::Store> to_store(const py::object& store) {
  try {
    return store.cast<c10::intrusive_ptr<c10d::Store>>();
  } catch (const py::cast_error&) {
    tsnap::throw_error(
        tsnap::ErrorCode::kInvalidArgument,
        std::string("store must be a torch.distributed.Store (TCPStore, PrefixStore, ...), not ") +
            Py_TYPE(store.ptr())->tp_name);
  }
}

py::dict to_dict(const tsnap::StateDict& state) {
  py::dict out;
  for (const auto& [key, entry] : state) out[py::str(key)] = entry.tensor;
  return out;
}

// `dtype` is a torch.dtype, None, or (dtype, [(pattern, dtype), ...]) with per-key rules.
tsnap::SaveOptions save_options(const py::object& dtype, const std::string& staging, bool overwrite,
                                int num_shards, uint64_t chunk_bytes) {
  tsnap::SaveOptions options;
  if (py::isinstance<py::tuple>(dtype)) {
    const auto pair = dtype.cast<py::tuple>();
    options.dtype = to_dtype(pair[0]);
    for (const py::handle rule : pair[1]) {
      const auto r = rule.cast<py::tuple>();
      options.dtype_rules.push_back({r[0].cast<std::string>(), to_dtype(r[1])});
    }
  } else {
    options.dtype = to_dtype(dtype);
  }
  options.staging = to_staging(staging);
  options.overwrite = overwrite;
  options.num_shards = num_shards;
  options.chunk_bytes = chunk_bytes;
  return options;
}

tsnap::LoadOptions load_options(std::vector<std::string> include, std::vector<std::string> exclude,
                                bool verify, const std::string& key_prefix, bool allow_unmatched) {
  tsnap::LoadOptions options;
  options.include = std::move(include);
  options.exclude = std::move(exclude);
  options.verify = verify;
  options.key_prefix = key_prefix;
  options.allow_unmatched = allow_unmatched;
  return options;
}

// A Snapshotter whose destruction (which waits for the saves in flight) releases the GIL.
// Hooks (PyPeriodic) refer to it: it refuses to close while one is open.
struct PySnapshotter {
  std::unique_ptr<tsnap::Snapshotter> snapshotter;
  int open_hooks = 0;

  tsnap::Snapshotter& get() {
    if (!snapshotter) {
      tsnap::throw_error(tsnap::ErrorCode::kCancelled, "the Snapshotter is closed");
    }
    return *snapshotter;
  }
  void close() {
    if (open_hooks > 0) {
      tsnap::throw_error(tsnap::ErrorCode::kBusy,
                         "the Snapshotter has an open PeriodicSnapshots: close the hook first");
    }
    py::gil_scoped_release release;
    snapshotter.reset();
  }
  ~PySnapshotter() {
    if (snapshotter && PyGILState_Check()) {
      close();
    }
  }
};

// Waits for `handle` with the GIL released, in slices, so that Ctrl-C interrupts the wait
// (KeyboardInterrupt; the save goes on). Returns whether it completed within `timeout` (seconds,
// negative for none); rethrows the save's error.
bool wait_handle(const tsnap::SaveHandle& handle, double timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    auto slice = std::chrono::milliseconds(100);
    if (timeout >= 0) {
      const double left =
          timeout - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        py::gil_scoped_release release;
        if (!handle.done()) return false;
        break;
      }
      slice = std::min(slice, std::chrono::milliseconds(static_cast<int64_t>(left * 1000) + 1));
    }
    bool done;
    {
      py::gil_scoped_release release;
      done = handle.wait_for(slice);
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  py::gil_scoped_release release;
  if (auto error = handle.error()) rethrow(error);
  return true;
}

// The periodic hook with Python callbacks. The callables live here, not in the C++ hook's
// std::functions (which capture `this`), so they are only ever copied or freed with the GIL.
class PyPeriodic {
 public:
  PyPeriodic(PySnapshotter& snapshotter, py::object make_state, tsnap::ScheduleOptions schedule,
             tsnap::PeriodicOptions options)
      : make_state_(std::move(make_state)), owner_(&snapshotter) {
    tsnap::Snapshotter& snap = snapshotter.get();
    tsnap::Schedule checked(std::move(schedule));
    py::gil_scoped_release release;
    hook_ = std::make_unique<tsnap::PeriodicSnapshots>(
        snap, std::move(checked), [this] { return make_checkpoint(); }, std::move(options));
    ++owner_->open_hooks;
  }
  ~PyPeriodic() {
    if (hook_ && PyGILState_Check()) close();
  }

  int64_t resume(py::object apply) {
    apply_ = std::move(apply);
    int64_t step;
    {
      py::gil_scoped_release release;
      step = hook().resume([this](tsnap::Checkpoint& c) {
        py::gil_scoped_acquire acquire;
        apply_(to_dict(c.state()), c.metadata().dump());
      });
    }
    apply_ = py::none();
    return step;
  }
  void after_step(int64_t step) {
    py::gil_scoped_release release;
    hook().after_step(step);
  }
  void before_optimizer_step() {
    py::gil_scoped_release release;
    hook().before_optimizer_step();
  }
  bool stop_requested() { return hook().stop_requested(); }
  int stop_signal() { return hook().stop_signal(); }
  tsnap::PeriodicStats finish() {
    py::gil_scoped_release release;
    return hook().finish();
  }
  tsnap::PeriodicStats stats() {
    py::gil_scoped_release release;
    return hook().stats();
  }
  void close() {
    if (!hook_) return;
    {
      py::gil_scoped_release release;
      hook_.reset();
    }
    --owner_->open_hooks;
  }

 private:
  tsnap::PeriodicSnapshots& hook() {
    if (!hook_) tsnap::throw_error(tsnap::ErrorCode::kCancelled, "the hook is closed");
    return *hook_;
  }
  // On the training thread, inside after_step (which released the GIL).
  tsnap::Checkpoint make_checkpoint() {
    py::gil_scoped_acquire acquire;
    py::tuple made = make_state_();
    tsnap::Checkpoint checkpoint;
    // (tensors, metadata) or (tensors, metadata, shards): pieces of DTensors (tsnap/_dist.py).
    checkpoint.state() = to_state(made[0].cast<std::map<std::string, at::Tensor>>(),
                                  made.size() > 2 ? made[2].cast<Shards>() : Shards{});
    checkpoint.metadata() = to_json(made[1].cast<std::string>(), "metadata");
    return checkpoint;
  }

  py::object make_state_;
  PySnapshotter* owner_;  // kept alive by the Python object (py::keep_alive)
  py::object apply_ = py::none();
  std::unique_ptr<tsnap::PeriodicSnapshots> hook_;
};

py::dict record_dict(const tsnap::SnapshotRecord& r) {
  py::dict d;
  d["step"] = r.step;
  d["name"] = r.name;
  d["reason"] = tsnap::to_string(r.reason);
  d["blocked_s"] = r.blocked_s;
  d["save"] = r.save;
  d["committed"] = r.committed;
  d["error"] = r.error;
  d["deleted"] = r.deleted;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tsnap's C++ engine (use the tsnap package, not this module)";
  m.attr("TORCH_BUILD_VERSION") = TSNAP_TORCH_BUILD_VERSION;

  g_error = PyErr_NewException("tsnap.Error", PyExc_RuntimeError, nullptr);
  g_io_error = PyErr_NewException("tsnap.IoError", g_error, nullptr);
  g_format_error = PyErr_NewException("tsnap.FormatError", g_error, nullptr);
  py::tuple invalid_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewException("tsnap.InvalidArgument", invalid_bases.ptr(), nullptr);
  m.attr("Error") = py::handle(g_error);
  m.attr("IoError") = py::handle(g_io_error);
  m.attr("FormatError") = py::handle(g_format_error);
  m.attr("InvalidArgument") = py::handle(g_invalid_argument);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tsnap::Error& e) {
      set_python_error(e);
    }
  });

  py::class_<tsnap::SaveStats>(m, "SaveStats", "Figures of one save; times in seconds.")
      .def_readonly("stall_s", &tsnap::SaveStats::stall_s)
      .def_readonly("stage_s", &tsnap::SaveStats::stage_s)
      .def_readonly("write_s", &tsnap::SaveStats::write_s)
      .def_readonly("commit_s", &tsnap::SaveStats::commit_s)
      .def_readonly("total_s", &tsnap::SaveStats::total_s)
      .def_readonly("bytes", &tsnap::SaveStats::bytes)
      .def_readonly("written_bytes", &tsnap::SaveStats::written_bytes)
      .def_readonly("linked_bytes", &tsnap::SaveStats::linked_bytes)
      .def_readonly("reused_bytes", &tsnap::SaveStats::reused_bytes)
      .def_readonly("tensor_bytes", &tsnap::SaveStats::tensor_bytes)
      .def_readonly("chunks", &tsnap::SaveStats::chunks)
      .def_readonly("files", &tsnap::SaveStats::files)
      .def_readonly("tensors", &tsnap::SaveStats::tensors)
      .def_readonly("buffer_waits", &tsnap::SaveStats::buffer_waits)
      .def_readonly("buffers_reused", &tsnap::SaveStats::buffers_reused)
      .def_readonly("engine", &tsnap::SaveStats::engine)
      .def_readonly("direct", &tsnap::SaveStats::direct)
      .def_readonly("unchanged_since", &tsnap::SaveStats::unchanged_since)
      .def_readonly("unchanged_tensors", &tsnap::SaveStats::unchanged_tensors)
      .def_readonly("stale", &tsnap::SaveStats::stale)
      .def_property_readonly("throughput_gbps", &tsnap::SaveStats::throughput_gbps)
      .def("__repr__", [](const tsnap::SaveStats& s) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "SaveStats(stall_s=%.4f, total_s=%.4f, bytes=%llu, engine='%s%s', "
                      "%.2f GB/s)",
                      s.stall_s, s.total_s, static_cast<unsigned long long>(s.bytes),
                      s.engine.c_str(), s.direct ? "+O_DIRECT" : "", s.throughput_gbps());
        return std::string(line);
      });

  py::class_<tsnap::SaveHandle>(m, "SaveHandle")
      .def("wait", &wait_handle, py::arg("timeout") = -1.0)
      .def("done",
           [](const tsnap::SaveHandle& h) {
             py::gil_scoped_release release;
             return h.done();
           })
      .def("wait_staged",
           [](const tsnap::SaveHandle& h) {
             py::gil_scoped_release release;
             h.wait_staged();
           })
      .def_property_readonly("stats",
                             [](const tsnap::SaveHandle& h) {
                               py::gil_scoped_release release;
                               return h.stats();
                             })
      .def_property_readonly("path", [](const tsnap::SaveHandle& h) { return h.path().string(); });

  // Held by shared_ptr: the Snapshotters made with it share it (SnapshotterOptions::group).
  py::class_<tsnap::DistGroup, std::shared_ptr<tsnap::DistGroup>>(m, "DistGroup")
      .def(py::init([](const py::object& store, int rank, int world_size, double timeout,
                       const std::string& prefix) {
             tsnap::DistOptions options;
             options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
             options.prefix = prefix;
             c10::intrusive_ptr<c10d::Store> s = to_store(store);
             py::gil_scoped_release release;  // waits for rank 0 to publish the group's id
             return std::make_shared<tsnap::DistGroup>(std::move(s), rank, world_size,
                                                       std::move(options));
           }),
           py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
           py::arg("prefix"))
      .def_property_readonly("rank", &tsnap::DistGroup::rank)
      .def_property_readonly("world_size", &tsnap::DistGroup::world_size);

  py::class_<PySnapshotter>(m, "Snapshotter")
      .def(
          py::init([](const std::string& root, uint64_t staging_budget, uint64_t chunk_bytes,
                      int stage_threads, int io_threads, unsigned queue_depth,
                      const std::string& engine, bool direct_io, int max_in_flight, bool fail_fast,
                      bool incremental, bool keep_hot, const std::string& durable_root,
                      uint64_t drain_bytes_per_second, int local_keep_last, const py::object& group,
                      bool node_local, const std::string& agent, bool agent_fall_back) {
            tsnap::SnapshotterOptions options;
            options.root = root;
            options.staging.budget_bytes = staging_budget;
            options.chunk_bytes = chunk_bytes;
            options.staging.threads = stage_threads;
            options.io.threads = io_threads;
            options.io.queue_depth = queue_depth;
            options.io.engine = to_engine(engine);
            options.io.direct_io = direct_io;
            options.max_in_flight = max_in_flight;
            options.in_flight =
                fail_fast ? tsnap::InFlightPolicy::kFailFast : tsnap::InFlightPolicy::kWait;
            options.incremental = incremental;
            options.staging.keep_hot = keep_hot;
            options.tier.durable_root = durable_root;
            options.tier.bytes_per_second = drain_bytes_per_second;
            options.tier.local_keep_last = local_keep_last;
            options.tier.node_local = node_local;
            options.agent.socket = agent;
            options.agent.fall_back = agent_fall_back;
            if (!group.is_none()) options.group = group.cast<std::shared_ptr<tsnap::DistGroup>>();
            auto out = std::make_unique<PySnapshotter>();
            py::gil_scoped_release release;
            out->snapshotter = std::make_unique<tsnap::Snapshotter>(std::move(options));
            return out;
          }),
          py::arg("root"), py::arg("staging_budget"), py::arg("chunk_bytes"),
          py::arg("stage_threads"), py::arg("io_threads"), py::arg("queue_depth"),
          py::arg("engine"), py::arg("direct_io"), py::arg("max_in_flight"), py::arg("fail_fast"),
          py::arg("incremental"), py::arg("keep_hot"), py::arg("durable_root"),
          py::arg("drain_bytes_per_second"), py::arg("local_keep_last"),
          py::arg("group") = py::none(), py::arg("node_local") = false, py::arg("agent") = "",
          py::arg("agent_fall_back") = false)
      .def(
          "save_async",
          [](PySnapshotter& self, const std::string& name,
             const std::map<std::string, at::Tensor>& tensors, const std::string& metadata,
             const py::object& dtype, const std::string& staging, bool overwrite, int num_shards,
             uint64_t chunk_bytes, const py::object& incremental, const Shards& shards,
             std::optional<int64_t> step, std::vector<std::string> must_change,
             bool fail_if_stale) {
            const tsnap::StateDict state = to_state(tensors, shards);
            const json meta = to_json(metadata, "metadata");
            tsnap::SaveOptions options =
                save_options(dtype, staging, overwrite, num_shards, chunk_bytes);
            if (!incremental.is_none()) options.incremental = incremental.cast<bool>();
            options.step = step;
            options.stale.must_change = std::move(must_change);
            options.stale.fail = fail_if_stale;
            tsnap::Snapshotter& snap = self.get();
            py::gil_scoped_release release;
            return snap.save_async(name, state, meta, options);
          },
          py::arg("name"), py::arg("tensors"), py::arg("metadata"), py::arg("dtype"),
          py::arg("staging"), py::arg("overwrite"), py::arg("num_shards"), py::arg("chunk_bytes"),
          py::arg("incremental"), py::arg("shards") = Shards{}, py::arg("step") = py::none(),
          py::arg("must_change") = std::vector<std::string>{}, py::arg("fail_if_stale") = false)
      .def(
          "abandon",
          [](PySnapshotter& self, const std::string& name, const std::string& reason) {
            tsnap::Snapshotter& snap = self.get();
            py::gil_scoped_release release;
            snap.abandon(name, reason);
          },
          py::arg("name"), py::arg("reason"))
      .def(
          "prepare",
          [](PySnapshotter& self, const std::map<std::string, at::Tensor>& tensors,
             const py::object& dtype, int num_shards, uint64_t chunk_bytes, const Shards& shards) {
            const tsnap::StateDict state = to_state(tensors, shards);
            const tsnap::SaveOptions options =
                save_options(dtype, "eager", false, num_shards, chunk_bytes);
            tsnap::Snapshotter& snap = self.get();
            py::gil_scoped_release release;
            snap.prepare(state, options);
          },
          py::arg("tensors"), py::arg("dtype"), py::arg("num_shards"), py::arg("chunk_bytes"),
          py::arg("shards") = Shards{})
      .def("wait_all",
           [](PySnapshotter& self) {
             tsnap::Snapshotter& snap = self.get();
             py::gil_scoped_release release;
             snap.wait_all();
           })
      .def("load_hot",
           [](PySnapshotter& self, std::vector<std::string> include,
              std::vector<std::string> exclude) -> py::object {
             const tsnap::HotSnapshot hot = self.get().hot_snapshot();
             if (!hot) return py::none();
             const tsnap::LoadOptions options =
                 load_options(std::move(include), std::move(exclude), true, "", false);
             tsnap::StateDict state;
             {
               py::gil_scoped_release release;
               state = tsnap::load(hot, options);
             }
             return py::make_tuple(hot.name(), hot.manifest().metadata.dump(), to_dict(state));
           })
      .def("drain_wait",
           [](PySnapshotter& self) {
             tsnap::Snapshotter& snap = self.get();
             py::gil_scoped_release release;
             snap.drain_wait();
           })
      .def("latest",
           [](PySnapshotter& self) -> py::object {
             std::optional<std::filesystem::path> p;
             {
               tsnap::Snapshotter& snap = self.get();
               py::gil_scoped_release release;
               p = snap.latest();
             }
             if (!p) return py::none();
             return py::str(p->string());
           })
      .def("close", &PySnapshotter::close)
      .def_property_readonly("root", [](PySnapshotter& self) { return self.get().root().string(); })
      .def_property_readonly("engine", [](PySnapshotter& self) { return self.get().engine_name(); })
      .def_property_readonly("staging_budget",
                             [](PySnapshotter& self) { return self.get().staging_budget_bytes(); });

  m.def(
      "save",
      [](const std::string& path, const std::map<std::string, at::Tensor>& tensors,
         const std::string& metadata, const py::object& dtype, bool overwrite, int num_shards,
         const Shards& shards) {
        const tsnap::StateDict state = to_state(tensors, shards);
        const json meta = to_json(metadata, "metadata");
        const tsnap::SaveOptions options = save_options(dtype, "eager", overwrite, num_shards, 0);
        py::gil_scoped_release release;
        return tsnap::save(path, state, meta, options);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"), py::arg("dtype"),
      py::arg("overwrite"), py::arg("num_shards"), py::arg("shards") = Shards{});

  m.def("load", [](const std::string& path, std::vector<std::string> include,
                   std::vector<std::string> exclude, bool verify, const std::string& key_prefix,
                   bool allow_unmatched) {
    const tsnap::LoadOptions options =
        load_options(std::move(include), std::move(exclude), verify, key_prefix, allow_unmatched);
    tsnap::StateDict state;
    {
      py::gil_scoped_release release;
      state = tsnap::load(path, options);
    }
    return to_dict(state);
  });

  m.def(
      "load_into",
      [](const std::string& path, const std::map<std::string, at::Tensor>& dest,
         std::vector<std::string> include, std::vector<std::string> exclude, bool verify,
         const std::string& key_prefix, bool allow_unmatched, bool require_every_key, bool atomic,
         const Shards& shards) {
        tsnap::LoadOptions options = load_options(std::move(include), std::move(exclude), verify,
                                                  key_prefix, allow_unmatched);
        options.require_every_key = require_every_key;
        options.atomic = atomic;
        tsnap::StateDict state = to_state(dest, shards);
        tsnap::LoadReport report;
        {
          py::gil_scoped_release release;
          report = tsnap::load_into(path, state, options);
        }
        py::dict out;
        out["loaded"] = report.loaded;
        out["not_in_destination"] = report.not_in_destination;
        out["bytes_read"] = report.bytes_read;
        out["engine"] = report.engine;
        out["seconds"] = report.seconds;
        return out;
      },
      py::arg("path"), py::arg("dest"), py::arg("include"), py::arg("exclude"), py::arg("verify"),
      py::arg("key_prefix"), py::arg("allow_unmatched"), py::arg("require_every_key"),
      py::arg("atomic"), py::arg("shards") = Shards{});

  m.def("metadata", [](const std::string& path) {
    json metadata;
    {
      py::gil_scoped_release release;
      metadata = tsnap::read_manifest(path).metadata;
    }
    return metadata.dump();
  });

  m.def(
      "reserve_staging",
      [](uint64_t bytes, bool wait) {
        py::gil_scoped_release release;
        tsnap::reserve_staging_memory(bytes, wait);
      },
      py::arg("nbytes"), py::arg("wait"));
  m.def("reserved_staging_bytes", &tsnap::reserved_staging_bytes);

  m.def("latest", [](const std::string& root) -> std::optional<std::string> {
    std::optional<std::filesystem::path> found;
    {
      py::gil_scoped_release release;
      found = tsnap::latest(root);
    }
    if (!found) return std::nullopt;
    return found->string();
  });

  m.def("verify", [](const std::string& path) {
    std::vector<tsnap::BadChunk> bad;
    {
      py::gil_scoped_release release;
      bad = tsnap::verify(path);
    }
    py::list out;
    for (const auto& b : bad) {
      py::dict d;
      d["file"] = b.file;
      d["chunk"] = b.chunk;
      d["offset"] = b.offset;
      d["problem"] = b.problem;
      out.append(d);
    }
    return out;
  });

  py::class_<tsnap::PeriodicStats>(m, "PeriodicStats")
      .def_property_readonly("snapshots",
                             [](const tsnap::PeriodicStats& s) {
                               py::list out;
                               for (const auto& r : s.snapshots) out.append(record_dict(r));
                               return out;
                             })
      .def_readonly("skipped", &tsnap::PeriodicStats::skipped)
      .def_readonly("failed", &tsnap::PeriodicStats::failed)
      .def_readonly("deleted", &tsnap::PeriodicStats::deleted)
      .def_property_readonly("stall_s", &tsnap::PeriodicStats::stall_s)
      .def_property_readonly("bytes", &tsnap::PeriodicStats::bytes);

  py::class_<PyPeriodic>(m, "PeriodicSnapshots")
      .def(
          py::init([](PySnapshotter& snapshotter, py::object make_state, int64_t every_steps,
                      double every_seconds, std::vector<int> on_signals, int keep_last,
                      int64_t keep_every_steps, const py::object& dtype, const std::string& staging,
                      bool wait_when_busy, bool log, std::vector<int64_t> at_steps, bool continuous,
                      double min_interval_seconds, double max_overhead, double keep_every_seconds,
                      int keep_best, std::string best_metric, const std::string& best_mode,
                      bool keep_without_metric, bool stale_check,
                      std::vector<std::string> must_change, bool fail_if_stale) {
            tsnap::ScheduleOptions schedule;
            schedule.every_steps = every_steps;
            schedule.every_seconds = every_seconds;
            schedule.on_signals = std::move(on_signals);
            schedule.keep_last = keep_last;
            schedule.keep_every_steps = keep_every_steps;
            schedule.at_steps = std::move(at_steps);
            schedule.continuous = continuous;
            schedule.min_interval_seconds = min_interval_seconds;
            schedule.max_overhead = max_overhead;
            schedule.keep_every_seconds = keep_every_seconds;
            schedule.keep_best = keep_best;
            schedule.best_metric = std::move(best_metric);
            if (best_mode != "min" && best_mode != "max") {
              tsnap::throw_error(tsnap::ErrorCode::kInvalidArgument,
                                 "best_mode must be 'min' or 'max', not '" + best_mode + "'");
            }
            schedule.best_mode = best_mode == "max" ? tsnap::ScheduleOptions::Mode::kMax
                                                    : tsnap::ScheduleOptions::Mode::kMin;
            schedule.keep_without_metric = keep_without_metric;
            tsnap::PeriodicOptions options;
            options.save = save_options(dtype, staging, true, 0, 0);
            options.when_busy = wait_when_busy ? tsnap::WhenBusy::kWait : tsnap::WhenBusy::kSkip;
            options.stale_check = stale_check;
            options.save.stale.must_change = std::move(must_change);
            options.save.stale.fail = fail_if_stale;
            if (!log) options.log = nullptr;
            return std::make_unique<PyPeriodic>(snapshotter, std::move(make_state),
                                                std::move(schedule), std::move(options));
          }),
          py::arg("snapshotter"), py::arg("make_state"), py::arg("every_steps"),
          py::arg("every_seconds"), py::arg("on_signals"), py::arg("keep_last"),
          py::arg("keep_every_steps"), py::arg("dtype"), py::arg("staging"),
          py::arg("wait_when_busy"), py::arg("log"), py::arg("at_steps"), py::arg("continuous"),
          py::arg("min_interval_seconds"), py::arg("max_overhead"), py::arg("keep_every_seconds"),
          py::arg("keep_best"), py::arg("best_metric"), py::arg("best_mode"),
          py::arg("keep_without_metric"), py::arg("stale_check"), py::arg("must_change"),
          py::arg("fail_if_stale"), py::keep_alive<1, 2>())
      .def("resume", &PyPeriodic::resume)
      .def("after_step", &PyPeriodic::after_step)
      .def("before_optimizer_step", &PyPeriodic::before_optimizer_step)
      .def_property_readonly("stop_requested", &PyPeriodic::stop_requested)
      .def_property_readonly("stop_signal", &PyPeriodic::stop_signal)
      .def("finish", &PyPeriodic::finish)
      .def("stats", &PyPeriodic::stats)
      .def("close", &PyPeriodic::close);
}
