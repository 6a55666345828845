// Failover (docs/protocol.md section 8): which of a sharded job's aggregators
// are dead, and moving the job's chunks to the survivors. An epoch counts the
// aggregators known dead; for each, every rank asks every survivor to take its
// place in the survivors' placement, and once all have answered with their
// new chunks and tokens, the pipeline moves there.
//
// Not synchronised: the communicator's monitor threads report deaths and
// answers, and its progress thread takes the steps, under one lock of the
// communicator's, so that a change and the wakeup it triggers cannot cross.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "control_channel.h"
#include "shard_placement.h"

namespace xagg::worker {

struct FailoverSettings {
  uint32_t job_id = 0;
  uint32_t rank = 0;                     // the job's rank on its aggregators
  std::vector<std::string> aggregators;  // the configured list, for messages
  std::vector<uint32_t> weights;         // per aggregator of the list
  uint32_t job_chunks = 0;
  // How long the survivors have to answer, from the failure's detection, and
  // how long courtesy copies are repeated once the chunks moved.
  std::chrono::milliseconds operation_timeout{0};
};

class Failover {
 public:
  // Every survivor gets its request, each sent within `deadline`.
  struct SendRequests {
    struct Request {
      uint32_t aggregator;
      control::ReshardRequest request;
    };
    std::vector<Request> requests;
    Clock::time_point deadline;
  };
  // Some survivors have not answered yet, and there is still time.
  struct AwaitAnswers {};
  // The job cannot go on; every rank gives the same message.
  struct Fail {
    std::string message;
  };
  // The survivors hold the job's chunks: the pipeline moves to `placement`,
  // whose shard s is aggregator survivors[s], under `tokens` (per aggregator of
  // the list), and repeats courtesy copies until courtesy_until. Then moved().
  struct MoveChunks {
    ShardPlacement placement;
    std::vector<uint32_t> survivors;
    std::vector<uint64_t> tokens;
    Clock::time_point courtesy_until;
  };
  using Step = std::variant<SendRequests, AwaitAnswers, Fail, MoveChunks>;

  // `tokens`: per aggregator of the list, from its join reply.
  Failover(FailoverSettings settings, std::vector<uint64_t> tokens);

  bool is_dead(uint32_t aggregator) const { return dead_[aggregator]; }
  // A new epoch unless the aggregator was known dead already.
  void mark_dead(uint32_t aggregator, const std::string& cause);
  // Another rank asked a survivor to go without these aggregators: so does
  // this one. `forwarder` passed the request on.
  void learn_failures(uint32_t forwarder, const control::ReshardRequest& notice);
  // A survivor's answer; one for an epoch past is ignored.
  void take_resharded(uint32_t aggregator, const control::Resharded& resharded);

  // An epoch whose failover has not moved the pipeline yet.
  bool pending() const { return epoch_ != applied_epoch_; }
  // What the pending epoch's failover does next.
  Step next_step();
  // The pipeline moved as the pending epoch's MoveChunks said.
  void moved();

 private:
  // The aggregators of the list that are known dead, or (false) the survivors, in list order.
  std::vector<uint32_t> where_dead(bool dead) const;
  std::string dead_names() const;
  std::vector<std::string> names(const std::vector<uint32_t>& aggregators) const;

  FailoverSettings settings_;
  std::vector<uint64_t> tokens_;                              // per aggregator, of the latest epoch
  std::vector<bool> dead_;                                    // per aggregator of the list
  uint32_t epoch_ = 0;                                        // aggregators known dead
  uint32_t applied_epoch_ = 0;                                // the pipeline's placement is this epoch's
  uint32_t requested_epoch_ = 0;                              // reshard requests sent for this epoch
  std::vector<std::optional<control::Resharded>> resharded_;  // per aggregator, at epoch_
  Clock::time_point detected_at_;                             // the latest failure
  Clock::time_point give_up_at_;                              // of the current epoch's failover
};

}  // namespace xagg::worker
