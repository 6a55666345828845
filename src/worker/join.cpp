#include "join.h"

#include <arpa/inet.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "admission.h"
#include "control_waits.h"
#include "inet.h"
#include "wire.h"
#include "xagg/errors.h"

namespace xagg::worker {

namespace {

std::vector<std::unique_ptr<ControlChannel>> connect_all(std::span<const sockaddr_in> endpoints,
                                                         Clock::time_point deadline) {
  std::vector<std::unique_ptr<ControlChannel>> controls;
  for (const sockaddr_in& endpoint : endpoints)
    controls.push_back(std::make_unique<ControlChannel>(endpoint, deadline));
  return controls;
}

// The configured MTU, or the smallest path MTU to the aggregators.
uint32_t rank_mtu(const CommunicatorConfig& config, std::span<const sockaddr_in> endpoints) {
  if (config.mtu != 0) return config.mtu;
  uint32_t mtu = UINT16_MAX;
  for (const sockaddr_in& endpoint : endpoints) mtu = std::min(mtu, path_mtu(endpoint.sin_addr));
  if (mtu < wire::kMinLinkMtu)
    throw ConfigError(fmt::format("job {} rank {}: the path MTU to the aggregators is {}, below the {} XAgg needs",
                                  config.job_id, config.rank, mtu, wire::kMinLinkMtu));
  return mtu;
}

control::JoinReply join_reply(const CommunicatorConfig& config, uint32_t shard, ControlChannel& control,
                              control::JoinRequest& request, Clock::time_point deadline) {
  const std::string& aggregator = config.aggregators[shard];
  auto reply = control.receive(deadline);
  if (!reply)
    throw TimeoutError(fmt::format("job {} rank {}: no join reply from aggregator {} within {} ms", config.job_id,
                                   config.rank, aggregator, config.join_timeout.count()));
  // An aggregator with a cluster secret challenges the first join (protocol.md 2.1).
  if (auto* challenge = std::get_if<control::Challenge>(&*reply); challenge && request.auth.empty()) {
    if (config.cluster_secret.empty())
      throw ConfigError(
          fmt::format("job {} rank {}: aggregator {} requires a cluster secret and this rank has none "
                      "(CommunicatorConfig::cluster_secret, --secret-file, XAGG_SECRET_FILE)",
                      config.job_id, config.rank, aggregator));
    request.auth =
        join_proof(config.cluster_secret, challenge->nonce, request.job_id, request.rank, request.world_size);
    control.send(request, deadline);
    return join_reply(config, shard, control, request, deadline);
  }
  // The aggregator's message counts the elements asked for, which include the placement slack.
  if (auto* error = std::get_if<control::Error>(&*reply))
    throw ConfigError(
        fmt::format("job {} rank {}: join refused by aggregator {}: {} (this rank asked for {} "
                    "elements: max_elements {} plus {} of placement slack, MTU {})",
                    config.job_id, config.rank, aggregator, error->message, request.elements, config.max_elements,
                    request.elements - config.max_elements, request.mtu));
  auto* joined = std::get_if<control::JoinReply>(&*reply);
  if (!joined)
    throw CommError(fmt::format("job {} rank {}: unexpected reply to join from aggregator {}", config.job_id,
                                config.rank, aggregator));
  if (joined->data_port == 0 || joined->result_port == 0)
    throw CommError(fmt::format("job {} rank {}: join reply of aggregator {} unusable: data port {}, result port {}",
                                config.job_id, config.rank, aggregator, joined->data_port, joined->result_port));
  return *joined;
}

// Joins every aggregator (all requests first, so that they wait in parallel).
std::vector<control::JoinReply> join(const JobLevel& level, std::span<const std::unique_ptr<ControlChannel>> controls,
                                     uint64_t elements, uint32_t mtu, Clock::time_point deadline) {
  const CommunicatorConfig& config = level.config;
  std::vector<control::JoinRequest> requests;
  for (uint32_t shard = 0; shard < controls.size(); ++shard) {
    control::JoinRequest request{config.job_id, config.rank, config.world_size, elements, mtu};
    request.parent = level.parent;
    request.wire_bits = config.wire_bits;
    if (config.wire_bits == wire::kNarrowBits) request.sum_shift = level.leaf_sum_shift;
    // Each aggregator checks that every rank places it alike (protocol.md section 6).
    if (controls.size() > 1) {
      request.shard = shard;
      request.weights = weights_of(config);
    }
    controls[shard]->send(request, deadline);
    requests.push_back(std::move(request));
  }
  std::vector<control::JoinReply> replies;
  for (uint32_t shard = 0; shard < controls.size(); ++shard)
    replies.push_back(join_reply(config, shard, *controls[shard], requests[shard], deadline));
  return replies;
}

// Every aggregator in turn, briefly each, so that an error from any one
// ends the wait at once rather than after the others have started. A long
// wait asks the first aggregator not started who has not joined, and logs it.
std::vector<control::Start> wait_for_start(const JobLevel& level,
                                           std::span<const std::unique_ptr<ControlChannel>> controls,
                                           Clock::time_point deadline) {
  const CommunicatorConfig& config = level.config;
  const Clock::time_point begin = Clock::now();
  const std::chrono::milliseconds report_every = progress_interval(config.join_timeout);
  Clock::time_point next_report = begin + report_every;
  std::vector<std::optional<control::Start>> started(controls.size());
  for (size_t waiting = controls.size(); waiting > 0;) {
    for (uint32_t shard = 0; shard < controls.size(); ++shard) {
      if (started[shard]) continue;
      const std::string& aggregator = config.aggregators[shard];
      if (Clock::now() >= deadline)
        throw TimeoutError(fmt::format("job {} rank {}: not every rank joined aggregator {} within {} ms",
                                       config.job_id, config.rank, aggregator, config.join_timeout.count()));
      if (Clock::now() >= next_report) {
        controls[shard]->send(control::StatusRequest{0, {}}, deadline);
        next_report += report_every;
      }
      auto message = controls[shard]->receive(std::min(deadline, Clock::now() + kControlPoll));
      if (!message) continue;
      if (auto* error = std::get_if<control::Error>(&*message))
        throw CommError(controls.size() == 1 ? error->message
                                             : fmt::format("aggregator {}: {}", aggregator, error->message));
      if (auto* status = std::get_if<control::StatusReply>(&*message)) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - begin).count();
        // Every rank of a leaf has joined: its aggregator waits for the root's other leaves.
        if (status->missing_ranks.empty() && level.parent)
          spdlog::warn(
              "xagg: job {} rank {}: waited {} ms for root aggregator {} to start the job: every rank of "
              "leaf {} joined, so another of its {} leaves has not",
              config.job_id, level.rank, waited, level.parent->aggregator, level.parent->leaf, level.parent->leaves);
        else
          spdlog::warn("xagg: job {} rank {}: waited {} ms for ranks {} to join aggregator {}", config.job_id,
                       config.rank, waited, fmt::join(status->missing_ranks, ", "), aggregator);
      }
      if (auto* start = std::get_if<control::Start>(&*message)) {
        started[shard] = *start;
        --waiting;
      }
    }
  }
  std::vector<control::Start> starts;
  for (const std::optional<control::Start>& start : started) starts.push_back(*start);
  return starts;
}

// Every aggregator must give the job's MTU and chunk size alike, and the width every rank joined with.
void check_starts(const CommunicatorConfig& config, std::span<const control::Start> starts) {
  for (uint32_t shard = 0; shard < starts.size(); ++shard) {
    const control::Start& start = starts[shard];
    // An aggregator's own interface also caps the MTU; the ranks' paths cap it alike everywhere.
    if (start.chunk_elements != starts[0].chunk_elements)
      throw CommError(
          fmt::format("job {} rank {}: aggregators {} and {} fix the job's MTU at {} and {} ({} and {} "
                      "elements per chunk): give the aggregators' interfaces the same MTU",
                      config.job_id, config.rank, config.aggregators[0], config.aggregators[shard], starts[0].mtu,
                      start.mtu, starts[0].chunk_elements, start.chunk_elements));
    if (start.wire_bits != config.wire_bits)
      throw CommError(fmt::format("job {} rank {}: aggregator {} started the job with wire_bits {}, not {}",
                                  config.job_id, config.rank, config.aggregators[shard], start.wire_bits,
                                  config.wire_bits));
    if (start.chunk_elements != wire::chunk_elements_for(start.mtu, config.wire_bits))
      throw CommError(fmt::format("job {} rank {}: aggregator {} gives {} elements per chunk for MTU {}, not {}",
                                  config.job_id, config.rank, config.aggregators[shard], start.chunk_elements,
                                  start.mtu, wire::chunk_elements_for(start.mtu, config.wire_bits)));
  }
}

// A multicast start's group (checked when it was decoded); none for the other modes.
std::optional<in_addr> multicast_group_of(const control::Start& start) {
  if (start.results != wire::ResultMode::Multicast) return std::nullopt;
  in_addr group{};
  inet_pton(AF_INET, start.group.c_str(), &group);
  return group;
}

}  // namespace

std::vector<uint32_t> weights_of(const CommunicatorConfig& config) {
  if (!config.aggregator_weights.empty()) return config.aggregator_weights;
  return std::vector<uint32_t>(config.aggregators.size(), 1);
}

std::vector<uint64_t> StartedJob::tokens() const {
  std::vector<uint64_t> tokens;
  for (const JoinedAggregator& aggregator : aggregators) tokens.push_back(aggregator.reply.token);
  return tokens;
}

StartedJob join_job(const JobLevel& level, std::span<const sockaddr_in> endpoints, uint64_t elements) {
  const Clock::time_point deadline = Clock::now() + level.config.join_timeout;
  std::vector<std::unique_ptr<ControlChannel>> controls = connect_all(endpoints, deadline);
  const uint32_t mtu = rank_mtu(level.config, endpoints);
  const std::vector<control::JoinReply> replies = join(level, controls, elements, mtu, deadline);
  const std::vector<control::Start> starts = wait_for_start(level, controls, deadline);
  check_starts(level.config, starts);
  std::vector<JoinedAggregator> aggregators;
  for (uint32_t shard = 0; shard < starts.size(); ++shard)
    aggregators.push_back({endpoints[shard], replies[shard], starts[shard].chunks, multicast_group_of(starts[shard])});
  return {std::move(controls), std::move(aggregators), starts[0]};
}

}  // namespace xagg::worker
