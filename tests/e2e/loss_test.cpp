// The testbed's loss is per wire frame: a TCP flow, whose stack hands its
// veth 64 KB GSO packets, and an XAgg job, one datagram per frame, across the
// same lossy link lose the configured share of their wire frames, in as many
// loss events per frame.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "competing_flow.h"
#include "e2e_support.h"

namespace xagg::e2e {
namespace {

using namespace std::chrono_literals;
using testbed::HostRef;
using testbed::LossCounters;

constexpr double kRate = 0.01;
// Enough frames that the measured rate's standard deviation (0.03% at 100k)
// is far inside the tolerance.
constexpr uint64_t kMinFrames = 100'000;
constexpr uint32_t kMtu = 1500;  // where a GSO packet is the most frames (44)

class LossTest : public OwnTestbedTest<> {
 protected:
  LossTest() : OwnTestbedTest("xagg-loss") {}
};

void expect_faithful(const LossCounters& counters, const char* who) {
  SCOPED_TRACE(who);
  EXPECT_GE(counters.seen, kMinFrames);
  EXPECT_EQ(counters.multi_frame_skbs, 0u) << "the switch saw skbs of several frames: the veths did not segment";
  EXPECT_NEAR(counters.rate(), kRate, 0.002) << counters.dropped << " of " << counters.seen << " frames lost";
  EXPECT_EQ(counters.drop_events, counters.dropped);
}

TEST_F(LossTest, TcpFlowAndXaggJobLoseTheConfiguredShareOfWireFrames) {
  require_root();
  bed_.up(2, {}, kMtu);
  // Worker 0's link only, both directions: the TCP flow and the job's DATA cross it upward.
  testbed::LinkLossPair lossy(bed_.link_of({HostRef::Role::Worker, 0}), kRate);

  LossCounters before = lossy.from_host.counters();
  testbed::FlowReport flow;
  {
    testbed::CompetingFlow tcp(bed_.worker(0), bed_.worker(1), "worker 0 -> worker 1");
    std::this_thread::sleep_for(3s);
    flow = tcp.stop();
  }
  ASSERT_TRUE(flow.error.empty()) << flow.error;
  const LossCounters tcp = lossy.from_host.counters() - before;
  expect_faithful(tcp, "TCP flow");

  cluster_.start_aggregator(Clock::now() + 30s);
  before = lossy.from_host.counters();
  // About 360 elements per DATA frame at this MTU: 8 x 6M elements is 130k frames from each rank.
  const auto results = cluster_.run_workers({.workers = 2, .elements = 6'000'000, .iterations = 8},
                                            Clock::now() + 240s);
  expect_every_element_verified(results, 8);
  const LossCounters xagg = lossy.from_host.counters() - before;
  expect_faithful(xagg, "XAgg job");

  EXPECT_NEAR(tcp.events_per_frame() / xagg.events_per_frame(), 1.0, 0.2)
      << "TCP " << tcp.events_per_frame() << " loss events per frame, XAgg " << xagg.events_per_frame();
  std::cout << "loss per wire frame at MTU " << kMtu << ", " << kRate * 100 << "% set: TCP " << tcp.dropped << " of "
            << tcp.seen << " (" << flow.gbit() << " Gbit/s), XAgg " << xagg.dropped << " of " << xagg.seen << "\n";
}

}  // namespace
}  // namespace xagg::e2e
