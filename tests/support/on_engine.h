#pragma once
// Builds tsnap objects on a chosen io engine (a fault injector, a gate) through the io layer's
// test hook, for exactly the duration of one construction or call.

#include <memory>
#include <utility>

#include "io/engine_host.h"

namespace tsnap::test_support {

/// Returns make(), with every engine host built meanwhile running `engine`. With C++17's
/// guaranteed elision, `Snapshotter s = on_engine(e, [&] { return Snapshotter(o); });` works.
template <class Make>
auto on_engine(std::shared_ptr<io::Engine> engine, Make make) -> decltype(make()) {
  io::ScopedEngineOverride use(std::move(engine));
  return make();
}

}  // namespace tsnap::test_support
