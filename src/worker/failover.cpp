#include "failover.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace xagg::worker {

Failover::Failover(FailoverSettings settings, std::vector<uint64_t> tokens)
    : settings_(std::move(settings)), tokens_(std::move(tokens)) {
  dead_.assign(settings_.aggregators.size(), false);
  resharded_.resize(settings_.aggregators.size());
}

void Failover::mark_dead(uint32_t aggregator, const std::string& cause) {
  if (dead_[aggregator]) return;
  dead_[aggregator] = true;
  ++epoch_;
  detected_at_ = Clock::now();
  std::ranges::fill(resharded_, std::nullopt);
  spdlog::warn("xagg: job {} rank {}: aggregator {} is dead ({}); {} of {} aggregators left", settings_.job_id,
               settings_.rank, settings_.aggregators[aggregator], cause, std::ranges::count(dead_, false),
               dead_.size());
}

void Failover::learn_failures(uint32_t forwarder, const control::ReshardRequest& notice) {
  for (uint32_t dead : notice.dead)
    if (dead < dead_.size())
      mark_dead(dead, fmt::format("another rank's failover request, forwarded by aggregator {}",
                                  settings_.aggregators[forwarder]));
}

void Failover::take_resharded(uint32_t aggregator, const control::Resharded& resharded) {
  if (resharded.epoch == epoch_) resharded_[aggregator] = resharded;
}

Failover::Step Failover::next_step() {
  const std::vector<uint32_t> survivors = where_dead(false);
  const std::vector<uint32_t> dead = where_dead(true);
  std::vector<uint32_t> weights;
  for (uint32_t aggregator : survivors) weights.push_back(settings_.weights[aggregator]);
  // The same words on every rank: they name only what every rank agrees on.
  if (survivors.empty())
    return Fail{fmt::format("job {}: {} failed and no aggregator of the job is left to take over {} chunks",
                            settings_.job_id, dead_names(), dead.size() == 1 ? "its" : "their")};
  if (requested_epoch_ != epoch_) {
    requested_epoch_ = epoch_;
    give_up_at_ = detected_at_ + settings_.operation_timeout;
    SendRequests send{{}, give_up_at_};
    for (uint32_t place = 0; place < survivors.size(); ++place)
      send.requests.push_back({survivors[place], control::ReshardRequest{epoch_, dead, place, weights}});
    return send;
  }
  const bool answered =
      std::ranges::all_of(survivors, [&](uint32_t aggregator) { return resharded_[aggregator].has_value(); });
  if (!answered) {
    if (Clock::now() < give_up_at_) return AwaitAnswers{};
    std::vector<std::string> silent;
    for (uint32_t aggregator : survivors)
      if (!resharded_[aggregator]) silent.push_back(settings_.aggregators[aggregator]);
    return Fail{
        fmt::format("job {}: {} failed and aggregators {} did not all take over the job's chunks within {} ms "
                    "(no answer from {})",
                    settings_.job_id, dead_names(), fmt::join(names(survivors), ", "),
                    settings_.operation_timeout.count(), fmt::join(silent, ", "))};
  }
  ShardPlacement placement(weights, settings_.job_chunks);
  for (uint32_t place = 0; place < survivors.size(); ++place) {
    const control::Resharded& resharded = *resharded_[survivors[place]];
    if (resharded.chunks != placement.shard_chunks(place))
      return Fail{
          fmt::format("job {}: after {} failed, aggregator {} holds {} chunks, but the job's layout places {} there",
                      settings_.job_id, dead_names(), settings_.aggregators[survivors[place]], resharded.chunks,
                      placement.shard_chunks(place))};
    tokens_[survivors[place]] = resharded.token;
  }
  return MoveChunks{std::move(placement), survivors, tokens_, Clock::now() + settings_.operation_timeout};
}

void Failover::moved() {
  applied_epoch_ = epoch_;
  spdlog::warn("xagg: job {} rank {}: failover to epoch {} done {} ms after the failure was detected: {} moved to {}",
               settings_.job_id, settings_.rank, epoch_,
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - detected_at_).count(), dead_names(),
               fmt::join(names(where_dead(false)), ", "));
}

std::vector<uint32_t> Failover::where_dead(bool dead) const {
  std::vector<uint32_t> aggregators;
  for (uint32_t aggregator = 0; aggregator < dead_.size(); ++aggregator)
    if (dead_[aggregator] == dead) aggregators.push_back(aggregator);
  return aggregators;
}

std::string Failover::dead_names() const {
  const std::vector<uint32_t> dead = where_dead(true);
  return fmt::format("{} {}", dead.size() == 1 ? "aggregator" : "aggregators", fmt::join(names(dead), ", "));
}

std::vector<std::string> Failover::names(const std::vector<uint32_t>& aggregators) const {
  std::vector<std::string> listed;
  for (uint32_t aggregator : aggregators) listed.push_back(settings_.aggregators[aggregator]);
  return listed;
}

}  // namespace xagg::worker
