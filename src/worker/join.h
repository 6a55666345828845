// Joining a job (docs/protocol.md sections 1 and 2): connecting to each of its
// aggregators, the join handshake (with the cluster secret's challenge) and
// the wait until every aggregator has started the job. The starts fix what
// the rank works with from then on: the job's chunk size and each
// aggregator's chunks and multicast group.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "control_channel.h"
#include "xagg/communicator.h"

namespace xagg::worker {

// A rank's job on its leaf aggregator and the parent job that leaf joins, or
// (without a root aggregator) the job as configured; rank and world_size are
// the whole job's either way.
struct JobLevel {
  CommunicatorConfig config;
  std::optional<control::ParentJob> parent;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  // A 16-bit SUM's result is the sum / 2^sum_shift (docs/protocol.md section
  // 11); a leaf asks its aggregator for ceil(log2 ranks_per_leaf).
  int sum_shift = 0;
  std::optional<uint32_t> leaf_sum_shift = std::nullopt;
};

// Each aggregator's weight in the job's placement: as configured, or 1 each.
std::vector<uint32_t> weights_of(const CommunicatorConfig& config);

// One of the job's aggregators, as its join reply and its start left it.
struct JoinedAggregator {
  sockaddr_in endpoint{};                       // its control endpoint; its DATA goes to this address too
  control::JoinReply reply;                     // its data and result ports, and this rank's token
  uint32_t chunks = 0;                          // the chunk indexes its start says it holds
  std::optional<in_addr> group = std::nullopt;  // the group it multicasts RESULTs to, if it does
};

struct StartedJob {
  std::vector<std::unique_ptr<ControlChannel>> controls;  // one per aggregator, in the configured order
  std::vector<JoinedAggregator> aggregators;              // in the same order
  control::Start start;  // the job's MTU, chunk size and width, alike from every aggregator

  std::vector<uint64_t> tokens() const;  // per aggregator
};

// Connects to the aggregators at `endpoints` (the configured list's, in its
// order), joins the job on each, asking for `elements`, and waits until every
// one has started it, all within join_timeout. Throws ConfigError for a join
// refused or a path MTU too small, TimeoutError at join_timeout, CommError
// for anything else.
StartedJob join_job(const JobLevel& level, std::span<const sockaddr_in> endpoints, uint64_t elements);

}  // namespace xagg::worker
