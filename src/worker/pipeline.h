// Reliable, pipelined all-reduce through the aggregator. Each operation (a
// Reduction) gets its own range of the job's chunks, so several operations
// are in flight at once: a bucket's data goes out while the previous bucket
// still waits for the slowest rank, and a float32 bucket's data chunks go out
// as soon as their own exponents are agreed, not after all of them.
//
// Chunk placement and tags (docs/protocol.md section 4): operations take
// consecutive chunk ranges in call order, wrapping to chunk 0 when the next
// one does not fit; every rank places the same sequence the same way. A
// chunk's iteration tag counts its earlier uses, so consecutive uses of a
// chunk alternate between its two aggregator cells. An operation starts only
// when every chunk it needs is free here (its previous use finished on this
// rank); that use finished only after every rank had contributed to it, so
// every rank has finished the use before it, whose cell is the one reused.
//
// Loss recovery follows the aggregator: a rank that misses a RESULT resends
// its DATA, which the aggregator answers with the RESULT again. A chunk is
// resent once the retransmission timeout has passed since it was sent and
// since the latest result (TCP restarts its timer on every new
// acknowledgement), with its own exponential backoff, or at once when a chunk
// sent clearly later was already answered, or when results have stopped for
// about two round trips while chunks are in flight (TailProbe), so that a
// loss at a step's tail, which no later result reveals, costs about a round
// trip rather than the retransmit interval. The timeout follows the measured time from sending a chunk to its
// result, which includes waiting for the slowest rank, so that a fast rank
// waiting for a slow one does not flood the aggregator with copies.
//
// Failover (docs/protocol.md section 8): once the aggregators' placement
// changes, every chunk in flight goes out again to its new aggregator under
// its new token, and so does the DATA of each chunk's latest completed use,
// which the pipeline keeps for this: another rank may have missed its result,
// and the new aggregator completes it only with every rank's share. Such a
// courtesy copy is repeated until its result comes or a later use of the
// chunk completes here (then every rank has the earlier one).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "congestion_window.h"
#include "control_channel.h"
#include "shard_placement.h"
#include "tail_probe.h"
#include "udp_transport.h"
#include "wire.h"

namespace xagg::worker {

struct PipelineSettings {
  uint32_t job_id = 0;
  std::vector<uint64_t> tokens;  // per aggregator (shard), from its join reply
  uint16_t rank = 0;
  uint32_t window_chunks = 0;
  std::chrono::milliseconds retransmit_interval{0};
  // An operation still running this long before its deadline (or a progress
  // report) asks the aggregator which ranks have not contributed, so that the
  // answer is in by then.
  std::chrono::milliseconds status_lead{0};
  // An operation running longer than this logs a progress line (what is
  // missing, from which ranks) at every such interval; zero: never.
  std::chrono::milliseconds progress_interval{0};
  // One window slot's bytes: the job's longest packet (its chunk size's), a cache-line multiple.
  size_t slot_bytes = wire::kPacketBytes;
  // What each chunk remembers for Reduction::place: an exponent per block of
  // 16-bit lanes of the job's chunk (docs/protocol.md 5.3 and 11).
  uint32_t memory_per_chunk = 1;
  // Keep each chunk's latest completed DATA for a failover (a job on several aggregators).
  bool keep_completed = false;
  // A two-level job's root (docs/design.md, "Hierarchy"); empty: one level.
  std::string root_aggregator = {};
};

// An aggregator's view of who has not contributed (docs/protocol.md section
// 2, "status"): asked without waiting, answered later.
class ContributionStatus {
 public:
  // Sends aggregator `shard` the question about its chunks (its own indexes)
  // used with this tag and returns its number; failures only mean that no
  // answer comes.
  virtual uint64_t ask(uint32_t shard, uint32_t tag, std::span<const uint32_t> chunks,
                       Clock::time_point deadline) = 0;
  // The answer to that question, if it has come.
  virtual std::optional<control::StatusReply> answer(uint64_t question) const = 0;

 protected:
  ~ContributionStatus() = default;
};

// Retransmission timeout from send-to-result times, as TCP does (RFC 6298):
// smoothed time plus four deviations, between a floor and kCeilingFactor
// times it. The floor is the retransmit interval but at least kMinFloor: a
// rank whose link is slow but whose compute is fast samples short times
// whenever its own packets complete chunks, and a short floor then resends
// everything that waits for a slower rank, on the link that is already the
// bottleneck. The ceiling matters under loss: a first transmission's result
// may wait for another rank's retransmission, so the samples grow with the
// loss rate and would otherwise slow recovery down.
class RetransmitTimer {
 public:
  static constexpr std::chrono::milliseconds kMinFloor{50};
  explicit RetransmitTimer(Clock::duration retransmit_interval)
      : floor_(std::max<Clock::duration>(retransmit_interval, kMinFloor)), timeout_(floor_) {}
  void sample(Clock::duration send_to_result);
  Clock::duration timeout() const { return timeout_; }
  Clock::duration smoothed() const { return smoothed_; }

 private:
  static constexpr int kCeilingFactor = 8;
  Clock::duration floor_;
  Clock::duration timeout_;
  Clock::duration smoothed_{};
  Clock::duration deviation_{};
  bool sampled_ = false;
};

// A reduction's part in a reduce-scatter (docs/protocol.md section 10): each
// of the N operations of one has a single owner, the only rank that receives
// its values; every other rank gets a header-only RESULT per chunk.
enum class ScatterRole : uint8_t { None, Owner, Other };

// One all-reduce as the pipeline sees it: chunk_count() chunks at consecutive
// indexes, sent in offset order.
class Reduction {
 public:
  // What a chunk's memory holds before any reduction wrote it.
  static constexpr int32_t kNothingRemembered = INT32_MIN;

  virtual ~Reduction() = default;
  virtual uint32_t chunk_count() const = 0;
  // The caller's memory it reads and writes.
  virtual std::span<const std::byte> buffer() const = 0;
  // Called once, when the reduction gets its chunks: per_chunk int32 per
  // chunk (PipelineSettings::memory_per_chunk) that outlives the reduction
  // and is handed to the next one placed there (the same bucket in the next
  // training step). It is the same on every rank as long as what is written
  // depends only on results.
  virtual void place(std::span<int32_t> /*memory*/, uint32_t /*per_chunk*/) {}
  // False while the chunk's input is unknown (a data chunk before its
  // exponents' result); such a chunk holds back this reduction's later ones.
  virtual bool ready(uint32_t offset) const = 0;
  // True for a chunk whose result other chunks wait for (exponents): it goes
  // out ahead of data already queued, so that its round trip overlaps the
  // previous reduction's tail, and a loss of it is repaired sooner.
  virtual bool gating(uint32_t offset) const = 0;
  virtual wire::ElemOp op(uint32_t offset) const = 0;
  // The chunk's part in a reduce-scatter: None when every rank needs its
  // result (exponents, and everything of a plain all-reduce). With Other,
  // consume gets an empty result: the rank writes nothing, but keeps its
  // state in step with the other ranks'.
  virtual ScatterRole scatter_role(uint32_t /*offset*/) const { return ScatterRole::None; }
  // Whether its packets carry 16-bit lanes (docs/protocol.md section 11): its
  // values must then fit int16 (the pipeline clamps them), and its results
  // come as 16-bit lanes widened to int32.
  virtual bool narrow() const { return false; }
  // Fills the payload (room for kMaxChunkElems) and returns how many elements
  // the chunk has, 1 .. kMaxChunkElems: its packets carry no more. consume gets
  // a result of that length. A result may show that chunks already under way
  // carry the wrong input (a data chunk sent with a predicted exponent that
  // did not hold): their offsets go to `redo`, and each is sent again, as a
  // new use of its chunk, on every rank.
  virtual uint32_t fill(uint32_t offset, int32_t* payload) = 0;
  virtual void consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& redo) = 0;
};

// Driven by one thread (the communicator's progress thread).
class Pipeline {
 public:
  using Completion = std::function<void(std::exception_ptr error)>;

  // The job's chunks are those of `placement`, spread over the transport's
  // aggregators (one shard each, in the same order as settings.tokens).
  Pipeline(UdpTransport& transport, ShardPlacement placement, PipelineSettings settings,
           ContributionStatus& contributions);

  // Starts the reduction if its chunks are free and no running reduction's
  // buffer overlaps its own; false (and nothing done) otherwise. `done` is
  // called exactly once: with null after every result was consumed, with a
  // TimeoutError at the deadline, or with the error passed to fail_all.
  // `sequence` numbers operations in error messages.
  bool try_start(std::unique_ptr<Reduction>& reduction, uint64_t sequence, Clock::time_point deadline,
                 Completion done);

  // No operation runs and no courtesy copy waits for its result.
  bool idle() const { return running_.empty() && courtesies_.empty(); }

  // The job's chunks move to `placement`, whose shard s is the transport's
  // aggregator aggregator_of_shard[s], under `tokens` (per transport
  // aggregator); what has no result here goes out again there, and courtesy
  // copies are repeated until their result comes, at the latest until
  // courtesy_until.
  void move_to(ShardPlacement placement, std::vector<uint32_t> aggregator_of_shard, std::vector<uint64_t> tokens,
               Clock::time_point courtesy_until);

  // The next reduction is placed at chunk 0 (a new training step).
  void restart_placement() { next_free_chunk_ = 0; }

  // Sends what the window allows, waits for results (at most until a
  // retransmission, status question or deadline is due, or wake_fd is
  // readable), consumes them and resends overdue chunks. Throws CommError on
  // transport failure.
  void progress(int wake_fd);

  // Ends every running operation with error.
  void fail_all(std::exception_ptr error);

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Running {
    std::unique_ptr<Reduction> reduction;
    uint64_t sequence = 0;
    uint32_t total = 0;  // elements of the all-reduce mod 2^32, in every packet (protocol.md 3.1)
    uint32_t first_chunk = 0;
    Clock::time_point started;
    Clock::time_point deadline;
    Clock::time_point checkpoint;  // the next progress report, or the deadline
    Completion done;
    uint32_t next_offset = 0;  // the next chunk to send for the first time
    uint32_t chunks_done = 0;
    // Per aggregator: results come back in send order only along one path.
    std::vector<uint32_t> answered_up_to;              // 1 + the highest offset with a result
    std::vector<uint32_t> answered_up_to_at_last_scan;  // its value at the previous resend scan
    uint32_t in_flight = 0;    // its chunks holding a slot
    bool out_of_order = false;  // a later operation has chunks in flight (fill_window)
    std::optional<uint64_t> question;  // about its missing contributions, once asked
    uint32_t question_shard = 0;       // the aggregator asked
  };
  struct Slot {
    Running* running = nullptr;  // null while free
    uint32_t offset = 0;
    uint32_t use = 0;            // bumped on every reuse, to spot stale queued sends
    uint32_t elements = 0;       // in its packet
    bool narrow = false;         // as 16-bit lanes
    uint32_t shard = 0;          // the aggregator its chunk goes to
    uint8_t resends = 0;
    bool redone = false;         // sent again after later chunks: their results say nothing about its loss
    Clock::time_point sent_at;   // zero until it actually leaves
  };
  struct Redo {
    Running* running;
    uint32_t offset;
  };
  struct QueuedSend {
    uint32_t slot;
    uint32_t use;
  };
  // A completed use's DATA sent again after a failover, for ranks without its result.
  struct Courtesy {
    uint32_t chunk;
    uint32_t tag;
    Clock::time_point due;
    uint32_t sends = 0;
  };

  std::byte* slot_packet(uint32_t slot) { return packets_.data() + size_t{slot} * settings_.slot_bytes; }
  size_t slot_packet_bytes(uint32_t slot) const {
    return wire::packet_bytes(slots_[slot].elements, slots_[slot].narrow);
  }
  bool queued_is_current(const QueuedSend& queued) const {
    return slots_[queued.slot].running != nullptr && slots_[queued.slot].use == queued.use;
  }
  uint32_t tag_of(uint32_t chunk) const { return uses_[chunk] - 1; }
  // The transport's index of the aggregator holding the job chunk.
  uint32_t aggregator_of(uint32_t chunk) const { return aggregator_of_shard_[placement_.shard_of(chunk)]; }
  // Sets the DATA packet's token and chunk for the chunk's aggregator; the rest stays.
  void readdress(std::span<std::byte> packet, uint32_t chunk) const;
  void send_courtesies(Clock::time_point now);
  // A free slot, while the congestion window allows another chunk in flight
  // (or regardless of it, for a chunk out of the common order: fill_window).
  bool may_load(bool out_of_order) const {
    return !free_slots_.empty() && (out_of_order || slots_.size() - free_slots_.size() < congestion_.chunks());
  }
  uint32_t take_free_slot() {
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  // Loads what the window allows, sending every kFillBatch chunks on the way.
  void fill_window();
  void queue_gating_sends();
  // Encodes the chunk's DATA into the slot and queues it; a queued older copy becomes stale.
  void load_slot(uint32_t slot_index, Running& running, uint32_t offset, bool redone);
  void redo(Running& running, uint32_t offset);
  // Sends queued packets until the socket is full; false if it filled up.
  bool send_queued();
  void stamp_sent(size_t entries, size_t sent);
  Clock::duration scan_period() const;
  Clock::time_point next_wakeup() const;
  void queue_overdue(Clock::time_point now);
  // Resends the chunks in flight that have waited longest (TailProbe).
  void queue_probe(Clock::time_point now);
  void handle_result(std::span<const std::byte> packet, uint32_t shard);
  void check_deadlines(Clock::time_point now);
  Clock::time_point next_checkpoint(Clock::time_point now, Clock::time_point deadline) const;
  // What `running` still waits for, from whom, as the latest status answer says.
  std::string describe_missing(const Running& running) const;
  void finish(std::list<Running>::iterator running, std::exception_ptr error);
  // Up to kMissingChunksNamed chunks without a result, all of one tag and one
  // aggregator; those in flight first.
  std::vector<uint32_t> first_missing_chunks(const Running& running) const;
  std::exception_ptr timeout_error(const Running& running) const;
  // An error naming both sizes if the latest status answer says that ranks
  // all-reduce tensors of different sizes.
  std::exception_ptr size_error(const Running& running) const;

  UdpTransport& transport_;
  ShardPlacement placement_;
  std::vector<uint32_t> aggregator_of_shard_;  // placement shard -> transport aggregator
  std::vector<uint32_t> shard_of_aggregator_;  // transport aggregator -> placement shard, kNone: dead
  PipelineSettings settings_;
  ContributionStatus& contributions_;

  std::list<Running> running_;  // in start order, which is the order of sending
  uint32_t next_free_chunk_ = 0;   // placement cursor
  std::vector<uint32_t> uses_;     // per job chunk: uses started so far
  std::vector<uint32_t> chunk_slot_;  // per job chunk: its slot while in flight
  std::vector<bool> chunk_done_;      // per job chunk: result consumed in its current use
  std::vector<int32_t> chunk_memory_;  // per job chunk: Reduction::place's memory
  // Per job chunk (settings.keep_completed): the DATA of its latest completed use.
  std::vector<std::vector<std::byte>> completed_data_;
  std::deque<Courtesy> courtesies_;
  Clock::time_point courtesy_until_;

  std::vector<std::byte> packets_;  // per slot: the shadow copy of its DATA packet
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<QueuedSend> send_queue_;
  std::vector<QueuedSend> gating_sends_;  // filled by fill_window, queued ahead of the rest
  std::deque<Redo> redo_waiting_;         // chunks to send again once a slot is free
  std::vector<uint32_t> redo_offsets_;    // scratch for Reduction::consume
  std::vector<int32_t> lanes_;            // scratch: a narrow chunk's values as int32
  std::vector<UdpTransport::Outgoing> send_batch_;
  Clock::time_point next_resend_scan_;
  // Per aggregator: the latest send time of a first transmission answered.
  std::vector<Clock::time_point> newest_answered_send_;
  Clock::time_point last_result_at_;        // when the latest result for a chunk in flight came
  // Results dropped as broken, named in timeout errors: an aggregator that
  // keeps answering wrongly otherwise shows only as a timeout.
  uint64_t undecodable_results_ = 0;
  uint64_t mismatched_results_ = 0;  // for a chunk in flight, but of another op or length
  RetransmitTimer timer_;
  MinRoundTrip min_round_trip_;
  TailProbe tail_probe_;
  CongestionWindow congestion_;
};

}  // namespace xagg::worker
