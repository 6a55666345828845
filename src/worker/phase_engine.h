// Reliable all-reduce of one contiguous range of chunks through the
// aggregator ("a phase"): sends DATA for up to window chunks at a time, keeps
// each sent packet to resend it, and consumes each chunk's RESULT once. Loss
// recovery follows the aggregator: a rank that misses a RESULT resends its
// DATA, which the aggregator answers with the RESULT again. A chunk is resent
// once it is older than the retransmission timeout, with its own exponential
// backoff, even while other results keep arriving: on a slow link results
// never stop coming, and waiting for a pause left lost chunks for the end of
// the phase. The timeout follows the measured time from sending a chunk to
// its result, which includes waiting for the slowest rank, so that a fast
// rank waiting for a slow one does not flood the aggregator with copies.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "control_channel.h"
#include "udp_transport.h"
#include "wire.h"

namespace xagg::worker {

struct PhaseSettings {
  uint32_t job_id = 0;
  uint64_t token = 0;
  uint16_t rank = 0;
  uint32_t window_chunks = 0;
  std::chrono::milliseconds retransmit_interval{0};
  // A phase still running this long before its deadline asks the aggregator
  // which ranks have not contributed, so that the answer is in by the deadline.
  std::chrono::milliseconds status_lead{0};
};

// The aggregator's view of who has not contributed (docs/protocol.md section
// 2, "status"): asked without waiting, answered later.
class ContributionStatus {
 public:
  // Sends the question; failures only mean that no answer comes.
  virtual void ask(uint32_t iteration, std::span<const uint32_t> chunks, Clock::time_point deadline) = 0;
  // The ranks missing in the latest answer about iteration, if it has come.
  virtual std::optional<std::vector<uint32_t>> answer(uint32_t iteration) const = 0;

 protected:
  ~ContributionStatus() = default;
};

// Retransmission timeout from send-to-result times, as TCP does (RFC 6298):
// smoothed time plus four deviations, between the configured interval and
// kCeilingFactor times it. The ceiling matters under loss: a first
// transmission's result may wait for another rank's retransmission, so the
// samples grow with the loss rate and would otherwise slow recovery down.
class RetransmitTimer {
 public:
  explicit RetransmitTimer(Clock::duration floor) : floor_(floor), timeout_(floor) {}
  void sample(Clock::duration send_to_result);
  Clock::duration timeout() const { return timeout_; }

 private:
  static constexpr int kCeilingFactor = 8;
  Clock::duration floor_;
  Clock::duration timeout_;
  Clock::duration smoothed_{};
  Clock::duration deviation_{};
  bool sampled_ = false;
};

struct Phase {
  std::string_view name;  // for error messages
  uint32_t first_chunk = 0;
  uint32_t chunk_count = 0;
  wire::ElemOp op = wire::ElemOp::Sum;
  // Called with the chunk's offset in the phase (0 .. chunk_count-1) and the
  // kChunkElems-long payload to fill, resp. the result to consume.
  std::function<void(uint32_t offset, int32_t* payload)> fill;
  std::function<void(uint32_t offset, const int32_t* result)> consume;
};

class PhaseEngine {
 public:
  // check_abort throws to end a running phase (an error from the aggregator).
  PhaseEngine(UdpTransport& transport, PhaseSettings settings, ContributionStatus& contributions,
              std::function<void()> check_abort);

  // Returns once every chunk's result was consumed; throws TimeoutError at the
  // deadline (naming the ranks the aggregator still waits for), CommError on
  // transport failure, or what check_abort throws.
  void run(const Phase& phase, uint32_t iteration, Clock::time_point deadline);

 private:
  static constexpr uint32_t kNoChunk = UINT32_MAX;

  // A packet waiting to be sent; stale once its slot holds another chunk.
  struct QueuedPacket {
    uint32_t slot;
    uint32_t offset;
  };

  std::byte* slot_packet(uint32_t slot) { return packets_.data() + size_t{slot} * wire::kPacketBytes; }
  void send_queued();
  void stamp_sent(size_t entries, size_t sent);
  Clock::duration scan_period() const;
  void queue_overdue(Clock::time_point now);
  void handle_result(std::span<const std::byte> packet, const Phase& phase, uint32_t iteration);
  std::vector<uint32_t> first_missing_chunks(const Phase& phase) const;
  [[noreturn]] void throw_timeout(const Phase& phase, uint32_t iteration) const;

  UdpTransport& transport_;
  PhaseSettings settings_;
  ContributionStatus& contributions_;
  std::function<void()> check_abort_;

  // Per in-flight slot: the shadow copy of its DATA packet and its chunk offset.
  std::vector<std::byte> packets_;
  std::vector<uint32_t> slot_chunk_;
  std::vector<Clock::time_point> slot_sent_at_;
  std::vector<uint8_t> slot_resends_;
  std::vector<uint32_t> free_slots_;
  // Per chunk offset of the running phase: its slot while in flight.
  std::vector<uint32_t> chunk_slot_;
  std::vector<bool> chunk_done_;
  uint32_t chunks_done_ = 0;
  std::deque<QueuedPacket> send_queue_;
  std::vector<const std::byte*> send_batch_;
  Clock::time_point next_resend_scan_;
  Clock::time_point newest_answered_send_;  // latest send time of a first transmission answered
  RetransmitTimer timer_;  // kept across phases: later phases start with what was learned
};

}  // namespace xagg::worker
