// The staging stage: the pool's fixed, aligned, reused buffers and its backpressure, and
// fill_chunk's byte image (header, converted slices, chunk boundaries) against the plan.

#include "stage/staging_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "plan/plan.h"
#include "stage/fill.h"
#include "stage/staging_reserve.h"
#include "support/test_util.h"

namespace tsnap::stage {
namespace {

TEST(StagingPool, BuffersAreAlignedDistinctAndReused) {
  StagingPool pool(3, 8192, /*pinned=*/false);
  EXPECT_EQ(pool.count(), 3u);
  EXPECT_EQ(pool.buffer_bytes(), 8192u);
  std::set<int> taken;
  for (int i = 0; i < 3; ++i) {
    const int b = pool.acquire();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.data(b)) % 4096, 0u);
    EXPECT_FALSE(pool.used_before(b));
    taken.insert(b);
  }
  EXPECT_EQ(taken.size(), 3u);
  EXPECT_EQ(pool.in_use(), 3u);
  for (int b : taken) pool.release(b);
  EXPECT_EQ(pool.in_use(), 0u);
  const int again = pool.acquire();
  EXPECT_TRUE(taken.count(again));
  EXPECT_TRUE(pool.used_before(again));
  pool.release(again);
}

TEST(StagingPool, AcquireWaitsForARelease) {
  StagingPool pool(1, 4096, /*pinned=*/false);
  const int held = pool.acquire();
  std::atomic<bool> got{false};
  bool waited = false;
  std::thread waiter([&] {
    pool.release(pool.acquire(&waited));
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(got.load());  // backpressure: no buffer until one comes back
  pool.release(held);
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_TRUE(waited);
}

TEST(StagingPool, FaultsInInTheBackgroundThenCallsDoneAndKeepsContents) {
  StagingPool pool(8, 1 << 20, /*pinned=*/false);
  std::promise<void> done;
  // An acquire right away races the background thread for a buffer: whoever comes first
  // faults it in, and the other waits or skips it.
  pool.fault_in_background(/*background_priority=*/true, [&] { done.set_value(); });
  const int b = pool.acquire();
  std::memset(pool.data(b), 0xab, pool.buffer_bytes());
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(pool.data(b)[pool.buffer_bytes() - 1], 0xab);  // faulting in keeps what was written
  pool.release(b);
  for (size_t i = 0; i < pool.count(); ++i) {
    const int c = pool.acquire();
    if (c != b) EXPECT_EQ(pool.data(c)[4096 * 3], 0) << c;  // fresh anonymous memory
  }
}

// Every page of the pool is resident once fault_in_now returns (what lets a Snapshotter's
// first save copy into warm pages), and a buffer already in use keeps its bytes.
TEST(StagingPool, FaultInNowMakesEveryPageResidentAndKeepsContents) {
  StagingPool pool(6, 1 << 20, /*pinned=*/false);
  const int b = pool.acquire();
  std::memset(pool.data(b), 0x5a, pool.buffer_bytes());
  pool.fault_in_now();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < pool.count(); ++i) {
    const size_t pages = pool.buffer_bytes() / page;
    std::vector<unsigned char> resident(pages);
    ASSERT_EQ(::mincore(pool.data(static_cast<int>(i)), pool.buffer_bytes(), resident.data()), 0);
    for (size_t p = 0; p < pages; ++p)
      ASSERT_TRUE(resident[p] & 1) << "buffer " << i << " page " << p;
  }
  EXPECT_EQ(pool.data(b)[pool.buffer_bytes() - 1], 0x5a);
  pool.release(b);
  pool.fault_in_now();  // nothing left to do
}

// Whether every page of the pool's buffers is resident.
bool all_resident(const StagingPool& pool) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < pool.count(); ++i) {
    std::vector<unsigned char> resident(pool.buffer_bytes() / page);
    if (::mincore(pool.data(static_cast<int>(i)), pool.buffer_bytes(), resident.data()) != 0) {
      return false;
    }
    for (unsigned char r : resident) {
      if (!(r & 1)) return false;
    }
  }
  return true;
}

// The next pool takes reserved memory, resized to its size, its pages already faulted in; a
// reservation smaller than the pool is grown, and a new one replaces the last.
TEST(StagingReserve, TheNextPoolTakesTheReservationFaultedIn) {
  reserve(8 << 20, /*wait=*/true);
  reserve(6 << 20, /*wait=*/true);  // replaces the first
  EXPECT_EQ(reserved_bytes(), 6u << 20);
  {
    StagingPool pool(4, 1 << 20, /*pinned=*/false);
    EXPECT_EQ(reserved_bytes(), 0u);
    EXPECT_TRUE(all_resident(pool));  // before any fault_in_now
    for (size_t i = 0; i < pool.count(); ++i) {
      const int b = pool.acquire();
      EXPECT_EQ(pool.data(b)[pool.buffer_bytes() - 1], 0);
      std::memset(pool.data(b), 0x11 * (b + 1), pool.buffer_bytes());
    }
  }
  StagingPool fresh(2, 1 << 20, /*pinned=*/false);  // nothing reserved: a pool of its own
  EXPECT_EQ(reserved_bytes(), 0u);

  reserve(2 << 20, /*wait=*/true);
  StagingPool grown(6, 1 << 20, /*pinned=*/false);
  EXPECT_EQ(reserved_bytes(), 0u);
  grown.fault_in_now();
  EXPECT_TRUE(all_resident(grown));
  std::set<int> distinct;
  for (size_t i = 0; i < grown.count(); ++i) {
    const int b = grown.acquire();
    std::memset(grown.data(b), b, grown.buffer_bytes());
    distinct.insert(b);
  }
  EXPECT_EQ(distinct.size(), 6u);
  for (int b : distinct) EXPECT_EQ(grown.data(b)[grown.buffer_bytes() - 1], b) << b;
}

// A pool made while the reservation is still being faulted in stops that and faults in the
// rest itself; reserve(0) releases a reservation nobody took.
TEST(StagingReserve, APoolTakesAReservationMidwayAndZeroReleases) {
  reserve(256 << 20, /*wait=*/false);
  {
    StagingPool pool(8, 1 << 20, /*pinned=*/false);
    EXPECT_EQ(reserved_bytes(), 0u);
    pool.fault_in_now();
    EXPECT_TRUE(all_resident(pool));
  }
  reserve(4 << 20, /*wait=*/false);
  EXPECT_EQ(reserved_bytes(), 4u << 20);
  reserve(0, /*wait=*/false);
  EXPECT_EQ(reserved_bytes(), 0u);
}

// The background collapse into huge pages (of a pool larger than kSmallPool) waits while a
// save stages, and finishes once no save does.
TEST(StagingPool, BackgroundCollapseWaitsWhileASaveStages) {
  StagingPool pool(2 * StagingPool::kSmallPool / (8 << 20), 8 << 20, /*pinned=*/false);
  pool.fault_in_now();
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  {
    const StagingPool::Staging staging(pool);
    pool.fault_in_background(/*background_priority=*/false, [&] { done.set_value(); });
    EXPECT_EQ(finished.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  }
  EXPECT_EQ(finished.wait_for(std::chrono::seconds(60)), std::future_status::ready);
}

TEST(StagingPool, StoppedBackgroundThreadNeverCallsDoneAfterwards) {
  StagingPool pool(64, 1 << 20, /*pinned=*/false);
  std::atomic<int> calls{0};
  pool.fault_in_background(false, [&] { ++calls; });
  pool.stop_background();
  const int seen = calls.load();
  EXPECT_LE(seen, 1);
  pool.fault_in_background(false, [&] { ++calls; });  // a stopped pool starts nothing again
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), seen);
  // Buffers the thread did not reach are faulted in by their first acquire().
  const int b = pool.acquire();
  std::memset(pool.data(b), 1, pool.buffer_bytes());
  pool.release(b);
}

TEST(FillChunk, ChunksReassembleTheHeaderAndTheConvertedTensors) {
  StateDict sd;
  sd.insert("a", test_support::make_tensor(at::kFloat, {3000}, 1));
  sd.insert("b", test_support::make_tensor(at::kLong, {700}, 2));
  SaveOptions o;
  o.dtype = at::kBFloat16;
  const plan::Plan p = plan::make_plan(sd, o, 4096, "fill", 1);
  const plan::PlannedFile& file = p.files[0];
  const Sources sources = prepare_sources(file);
  std::string image(file.size, '\0');
  std::vector<uint8_t> buf(4096);
  for (uint64_t c = 0; c < file.num_chunks(); ++c) {
    const uint64_t len = fill_chunk(file, sources, c, buf.data());
    ASSERT_EQ(len, file.chunk_end(c) - file.chunk_begin(c));
    std::memcpy(image.data() + file.chunk_begin(c), buf.data(), len);
  }
  EXPECT_EQ(image.substr(0, file.data_offset), file.header);
  for (const plan::PlannedTensor& t : file.tensors) {
    const at::Tensor expected = sd.at(t.name).to(t.dtype).contiguous();
    ASSERT_EQ(t.nbytes(), static_cast<uint64_t>(expected.nbytes())) << t.name;
    EXPECT_EQ(std::memcmp(image.data() + t.begin, expected.data_ptr(), t.nbytes()), 0) << t.name;
  }
}

}  // namespace
}  // namespace tsnap::stage
