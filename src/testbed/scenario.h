// Heterogeneous-cluster scenarios (scenarios/*.json; format in docs/evaluation.md):
// the file's settings and their network part applied to a testbed. One
// implementation for `xagg bench hetero` and `xagg train --scenario`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "impairment.h"
#include "shaping.h"
#include "testbed.h"

namespace xagg::testbed {

struct Scenario {
  std::string name;
  uint32_t workers = 4;
  std::string model = "resnet50";
  double gradient_scale = 1.0;  // fraction of every tensor's elements actually sent
  double bucket_mb = 25;        // DDP's default bucket size, applied to the scaled bytes
  std::vector<double> compute_ms;
  double compute_jitter = 0;    // each iteration's compute time is scaled by U(1-j, 1+j)
  Layout layout;                        // "aggregators": K or "colocated"
  std::vector<double> worker_gbit;      // co-located: each host's link
  std::vector<double> aggregator_gbit;  // one per dedicated aggregator (0: unshaped); empty when co-located
  double loss = 0;
  uint32_t mtu = kLinkMtu;  // every link's
  std::vector<std::string> systems{"xagg", "switch", "switch-jumbo", "tcp-ps", "gloo"};
};

// Reads and validates a scenario file; throws std::runtime_error naming what is wrong.
Scenario load_scenario(const std::filesystem::path& file);

// The scenario's network on a testbed that is up with scenario.workers workers
// in scenario.layout (throws std::runtime_error for another layout): tbf on
// every shaped link and, with a loss rate, cls_bpf drops on every link. Both
// are removed on destruction.
class ScenarioNetwork {
 public:
  ScenarioNetwork(const Testbed& testbed, const Scenario& scenario);

  // Frames seen and dropped by the loss filters; nullopt without loss.
  std::optional<LossCounters> loss_counters() const;

 private:
  static const Testbed& checked(const Testbed& testbed, const Scenario& scenario);

  Shaping shaping_;
  std::optional<Impairment> loss_;
};

}  // namespace xagg::testbed
