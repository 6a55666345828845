// Control-plane messages between workers and the aggregator daemon: one JSON
// object per line over TCP (docs/protocol.md, "Control protocol").
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "wire.h"

namespace xagg::control {

// One version for both protocols: a worker that joins speaks this data
// protocol too (XAGG_VERSION, packet sizes in bpf/include/xagg_wire.h), so an
// older one is refused at join instead of sending packets that are dropped.
inline constexpr int kProtocolVersion = 9;
inline constexpr size_t kMaxLineBytes = 4096;  // longer lines are refused
inline constexpr size_t kMaxStatusChunks = 16;  // chunks one status request may ask about
inline constexpr uint32_t kMaxShardWeight = 1000;  // an aggregator's weight in a sharded job

// A rank of a two-level job names the parent (root) aggregator that its
// aggregator, a leaf, joins as rank `leaf` of `leaves` (docs/protocol.md
// section 9). Every rank of the leaf's job must name the same.
struct ParentJob {
  std::string aggregator;  // "IPv4" or "IPv4:port" of the parent's control endpoint
  uint32_t leaf = 0;
  uint32_t leaves = 0;     // 1 .. XAGG_MAX_WORKERS
  bool operator==(const ParentJob&) const = default;
};

struct JoinRequest {  // worker (or leaf aggregator) -> aggregator
  uint32_t job_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t elements = 0;  // largest tensor the job will all-reduce
  // The smallest MTU on this rank's paths to the job's aggregators: the job's
  // packets fit the smallest over all ranks (docs/protocol.md section 1).
  uint32_t mtu = 0;
  // A job over several aggregators: this aggregator's place in the ranks'
  // list and every aggregator's weight, which every rank must give alike
  // (section 6); empty weights (the fields absent): a job on one aggregator.
  uint32_t shard = 0;
  std::vector<uint32_t> weights = {};
  // Proof of the cluster secret for the nonce of the aggregator's Challenge
  // (admission.h); empty (the field absent) until challenged.
  std::string auth = {};
  std::optional<ParentJob> parent = {};  // set: the job is a leaf of a two-level job
  // A leaf aggregator joining its parent: the UDP port its DATA comes from and
  // RESULTs must go to (its data port); 0 (absent): the job's result port.
  uint16_t listen_port = 0;
  // The job's wire width (docs/protocol.md section 11): wire::kWideBits
  // (absent) or wire::kNarrowBits, twice the elements per chunk.
  uint32_t wire_bits = wire::kWideBits;
  // A 16-bit SUM's result is the sum / 2^sum_shift, at least ceil(log2
  // world_size), at most kMaxSumShift; absent: ceil(log2 world_size). The
  // leaves of a two-level job give ceil(log2 ranks per leaf), so that a
  // smaller last leaf sums on the same scale.
  std::optional<uint32_t> sum_shift = {};
};
inline constexpr uint32_t kMaxSumShift = 6;  // ceil(log2 XAGG_MAX_WORKERS)

// Aggregator -> worker: the answer to a join without `auth` when the
// aggregator has a cluster secret; the worker joins again with the proof.
struct Challenge {
  std::string nonce;  // 32 lower-case hex digits, fresh per connection
};

struct JoinReply {  // aggregator -> worker, right after a valid join
  uint64_t token = 0;        // per-job secret for every DATA packet
  uint16_t data_port = 0;    // aggregator's UDP port for DATA
  uint16_t result_port = 0;  // UDP port the worker must send from and listen on
  std::string broadcast;     // IPv4 address RESULT broadcasts are sent to
};

// Aggregator -> every worker, once all ranks have joined: the job's layout,
// fixed from the joins (docs/protocol.md section 1), and how its RESULTs
// come, which depends on where all of its ranks are (section 2).
struct Start {
  uint32_t mtu = 0;             // the smallest of the ranks' and the aggregator's
  uint32_t chunk_elements = 0;  // elements per chunk, for that MTU
  uint32_t chunks = 0;          // chunk indexes this aggregator holds for the job
  wire::ResultMode results = wire::ResultMode::Broadcast;
  std::string group = {};       // Multicast: the IPv4 group every rank joins; otherwise empty
  uint32_t wire_bits = wire::kWideBits;  // the job's, as every rank joined with
  bool operator==(const Start&) const = default;
};
struct Leave {};  // worker -> aggregator: done, release the job once all leave

// Worker -> aggregator, when an all-reduce is about to miss its deadline:
// which ranks have not contributed to these chunks of this iteration?
struct StatusRequest {
  uint32_t iteration = 0;
  std::vector<uint32_t> chunks;  // 0 .. kMaxStatusChunks chunk indexes; none: who has not joined?
};

// Shares of one chunk and iteration that belong to all-reduces of different
// sizes: the ranks' tensors differ (docs/protocol.md section 2).
struct SizeConflict {
  uint32_t elements = 0;       // the all-reduce's size (mod 2^32) of the shares added
  uint32_t rank = 0;           // a rank whose share was refused
  uint32_t rank_elements = 0;  // that share's all-reduce size
  bool operator==(const SizeConflict&) const = default;
};

// Aggregator -> worker, the answer to a StatusRequest.
struct StatusReply {
  uint32_t iteration = 0;
  std::vector<uint32_t> missing_ranks;  // ascending; empty when every rank contributed
  std::optional<SizeConflict> size_conflict;  // the first one among the chunks asked about
};

// Worker -> aggregator, every fifth of the worker's aggregator_dead_after:
// an aggregator that does not answer with Pong is dead (protocol.md section 8).
struct Ping {};
struct Pong {};

// Worker -> aggregator, after one or more of a sharded job's aggregators
// died: place the job's chunks on the survivors (docs/protocol.md section 8).
// Every rank sends it to every surviving aggregator; the aggregator forwards
// the first request of an epoch to the job's other ranks (a rank that has not
// seen the failure learns it so) and applies it once every rank asked alike.
struct ReshardRequest {
  uint32_t epoch = 0;              // the number of dead aggregators: 1 after the first failure
  std::vector<uint32_t> dead;      // their places in the job's original list, ascending
  uint32_t shard = 0;              // this aggregator's place among the survivors
  std::vector<uint32_t> weights;   // the survivors' weights, in list order
  bool operator==(const ReshardRequest&) const = default;
};

// Aggregator -> every rank, once all asked alike: the job's cells here are
// new, for the survivors' placement, under a new token.
struct Resharded {
  uint32_t epoch = 0;
  uint64_t token = 0;
  uint32_t chunks = 0;  // chunk indexes this aggregator now holds
};

struct Error {  // either direction; the sender closes the connection after it
  std::string message;
};

using Message = std::variant<JoinRequest, Challenge, JoinReply, Start, Leave, StatusRequest, StatusReply,
                             Ping, Pong, ReshardRequest, Resharded, Error>;

struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One line without the trailing newline.
std::string encode(const Message& message);
// Throws ProtocolError naming what is wrong with the line.
Message decode(std::string_view line);

}  // namespace xagg::control
