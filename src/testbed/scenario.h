// Heterogeneous-cluster scenarios (scenarios/*.json; format in docs/evaluation.md):
// the file's settings and their network part applied to a testbed. One
// implementation for `xagg bench hetero` and `xagg train --scenario`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "competing_flow.h"
#include "ecn_marker.h"
#include "impairment.h"
#include "shaping.h"
#include "testbed.h"

namespace xagg::testbed {

// "competing_flows": a bulk TCP flow from one host to another for the whole run.
struct CompetingFlowSpec {
  HostRef from;
  HostRef to;
  std::string label() const;  // "worker 1 -> aggregator 0"
};

// "ecn_marking": the phantom-queue CE marker on both directions of a host's link.
struct EcnMarkingSpec {
  HostRef link;
  double threshold_kb = 0;     // marks while the phantom queue holds more (1 KB = 1000 bytes)
  double rate_fraction = 1.0;  // the phantom queue drains at this fraction of the link's rate
};

struct Scenario {
  std::string name;
  uint32_t workers = 4;
  std::string model = "resnet50";
  double gradient_scale = 1.0;  // fraction of every tensor's elements actually sent
  double bucket_mb = 25;        // DDP's default bucket size, applied to the scaled bytes
  std::vector<double> compute_ms;
  double compute_jitter = 0;    // each iteration's compute time is scaled by U(1-j, 1+j)
  Layout layout;                        // "aggregators": K, "colocated", ... or "auto" until planned (src/plan)
  std::vector<double> worker_gbit;      // co-located: each host's link
  // One per dedicated aggregator (0: unshaped); empty when co-located; with
  // "auto", one per host free to be a dedicated aggregator.
  std::vector<double> aggregator_gbit;
  double loss = 0;
  uint32_t mtu = kLinkMtu;  // every link's
  std::vector<CompetingFlowSpec> competing_flows;
  std::vector<EcnMarkingSpec> ecn_marking;
  std::vector<std::string> systems{"xagg", "switch", "switch-jumbo", "tcp-ps", "gloo"};
  // Bits per element on the wire of the systems that can send 16 (`xagg bench
  // hetero` runs xagg as xagg16, gloo as gloo16); 32 or 16.
  uint32_t wire_bits = 32;
};

// Throws std::invalid_argument unless both hosts exist in a testbed of this
// shape and the flow crosses at least one link (a co-located worker and its
// host's aggregator do not).
void check_competing_flow(const CompetingFlowSpec& flow, uint32_t workers, const Layout& layout);

// Checks competing_flows and ecn_marking against the rest of the scenario (its
// workers, layout and link rates); throws std::runtime_error naming the entry.
void check_congestion_fields(const Scenario& scenario);

// The rate of a host's link in the scenario (0: not shaped).
double link_gbit(const Scenario& scenario, HostRef link);

// Reads and validates a scenario file; throws std::runtime_error naming what is wrong.
Scenario load_scenario(const std::filesystem::path& file);

// The scenario's network on a testbed that is up with scenario.workers workers
// in scenario.layout (throws std::runtime_error for another layout): tbf on
// every shaped link, with a loss rate cls_bpf drops on every link, ECN markers
// on the links the scenario names and its competing flows, started here and
// running until destruction, which removes everything.
class ScenarioNetwork {
 public:
  ScenarioNetwork(const Testbed& testbed, const Scenario& scenario);

  // The loss filters (their counters); null without loss.
  const Impairment* impairment() const { return loss_ ? &*loss_ : nullptr; }
  // In the scenario's order.
  const std::vector<std::unique_ptr<LinkMarking>>& markings() const { return markings_; }
  std::vector<std::unique_ptr<CompetingFlow>>& flows() { return flows_; }

 private:
  static const Testbed& checked(const Testbed& testbed, const Scenario& scenario);

  // Torn down in reverse: flows stop before the markers, loss filters and qdiscs go.
  Shaping shaping_;
  std::optional<Impairment> loss_;
  std::vector<std::unique_ptr<LinkMarking>> markings_;
  std::vector<std::unique_ptr<CompetingFlow>> flows_;
};

}  // namespace xagg::testbed
