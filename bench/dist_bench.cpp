// Distributed save benchmark. Ranks on 127.0.0.1 hold the
// same replicated GPT-2-small + Adam state and save it together through a DistGroup
// (bench/dist.h): the aggregate durable throughput of 1, 2, 4 ranks (--ranks) and of one
// process without a group, each against the raw device; the bytes each rank wrote (replicated
// tensors are written once, by one rank); the stall per rank; and the commit latency that
// coordination adds. Points run one after the other, each with --reps saves.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>

#include "bench/dist.h"
#include "bench/options.h"
#include "bench/report.h"
#include "bench/session.h"

namespace tsnap::bench {
namespace {

int run(const BenchOptions& o, char** argv) {
  if (is_dist_rank()) return run_dist_rank(o);
  WorkDir work(o.dir);
  Progress progress;
  DistRunner runner(o, argv, work.path(), progress);
  std::vector<DistPoint> points;
  points.push_back(runner.run(0));
  for (int n : o.ranks) points.push_back(runner.run(n));
  progress.done();
  print_dist_report(o, points);
  return 0;
}

}  // namespace
}  // namespace tsnap::bench

int main(int argc, char** argv) {
  tsnap::bench::BenchOptions o;
  return tsnap::bench::run_program(
      argc, argv, "tsnap_bench_dist",
      "Distributed save benchmark: N ranks on 127.0.0.1 save one replicated state together, "
      "against one process without a group and the raw device (docs/benchmarks.md).",
      o,
      [&](CLI::App& app) {
        tsnap::bench::add_pipeline_options(app, o);
        app.add_option("--ranks", o.ranks, "Numbers of ranks to run, one point each")
            ->delimiter(',')
            ->check(CLI::Range(1, 64))
            ->capture_default_str();
      },
      [&] { return tsnap::bench::run(o, argv); });
}
