#include "phase_engine.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "xagg/communicator.h"

namespace xagg::worker {
namespace {

// Longest single wait, so that aggregator errors and deadlines are noticed
// promptly even with a long retransmit interval.
constexpr std::chrono::milliseconds kMaxPoll{10};
// Missing chunks named in a timeout error, and asked about in the status request.
constexpr size_t kMissingChunksNamed = 8;
static_assert(kMissingChunksNamed <= control::kMaxStatusChunks);
// A chunk's n-th resend waits retransmit_interval * 2^min(n, kMaxBackoffShift).
constexpr uint32_t kMaxBackoffShift = 2;
// Overdue chunks are looked for this many times per retransmit interval.
constexpr int kResendScansPerInterval = 4;
// Packets handed to the transport per call.
constexpr size_t kSendBatch = 512;

std::string describe_ranks(const std::optional<std::vector<uint32_t>>& ranks) {
  if (!ranks) return "unknown (no answer from the aggregator)";
  if (ranks->empty()) return "none";
  return fmt::format("{}", fmt::join(*ranks, ", "));
}

}  // namespace

void RetransmitTimer::sample(Clock::duration send_to_result) {
  if (!sampled_) {
    smoothed_ = send_to_result;
    deviation_ = send_to_result / 2;
    sampled_ = true;
  } else {
    Clock::duration error = send_to_result > smoothed_ ? send_to_result - smoothed_ : smoothed_ - send_to_result;
    deviation_ = (3 * deviation_ + error) / 4;
    smoothed_ = (7 * smoothed_ + send_to_result) / 8;
  }
  timeout_ = std::clamp(smoothed_ + 4 * deviation_, floor_, kCeilingFactor * floor_);
}

PhaseEngine::PhaseEngine(UdpTransport& transport, PhaseSettings settings, ContributionStatus& contributions,
                         std::function<void()> check_abort)
    : transport_(transport),
      settings_(settings),
      contributions_(contributions),
      check_abort_(std::move(check_abort)),
      timer_(settings.retransmit_interval) {}

void PhaseEngine::run(const Phase& phase, uint32_t iteration, Clock::time_point deadline) {
  const uint32_t slots = std::min(settings_.window_chunks, phase.chunk_count);
  packets_.resize(size_t{slots} * wire::kPacketBytes);
  slot_chunk_.assign(slots, kNoChunk);
  slot_sent_at_.assign(slots, {});
  slot_resends_.assign(slots, 0);
  free_slots_.resize(slots);
  for (uint32_t slot = 0; slot < slots; ++slot) free_slots_[slot] = slots - 1 - slot;
  chunk_slot_.assign(phase.chunk_count, kNoChunk);
  chunk_done_.assign(phase.chunk_count, false);
  chunks_done_ = 0;
  send_queue_.clear();
  next_resend_scan_ = Clock::now() + scan_period();
  newest_answered_send_ = {};

  wire::Header header{wire::MsgType::Data, settings_.job_id, settings_.token, iteration, 0, settings_.rank,
                      phase.op, 0};
  uint32_t next_chunk = 0;
  const Clock::time_point ask_at = deadline - settings_.status_lead;
  bool asked = false;
  while (chunks_done_ < phase.chunk_count) {
    check_abort_();
    for (; next_chunk < phase.chunk_count && !free_slots_.empty(); ++next_chunk) {
      uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      std::byte* packet = slot_packet(slot);
      header.chunk = phase.first_chunk + next_chunk;
      wire::encode_header(header, {packet, wire::kHeaderBytes});
      phase.fill(next_chunk, wire::payload(packet));
      slot_chunk_[slot] = next_chunk;
      slot_sent_at_[slot] = {};  // stamped when it actually leaves
      slot_resends_[slot] = 0;
      chunk_slot_[next_chunk] = slot;
      send_queue_.push_back({slot, next_chunk});
    }
    send_queued();

    auto now = Clock::now();
    if (!asked && now >= ask_at) {
      contributions_.ask(iteration, first_missing_chunks(phase), deadline);
      asked = true;
    }
    if (now >= deadline) throw_timeout(phase, iteration);
    auto wait = std::min({std::chrono::ceil<std::chrono::milliseconds>(next_resend_scan_ - now),
                          std::chrono::ceil<std::chrono::milliseconds>((asked ? deadline : ask_at) - now), kMaxPoll});
    transport_.wait(!send_queue_.empty(), std::max(wait, std::chrono::milliseconds{0}));

    while (transport_.receive([&](std::span<const std::byte> packet) { handle_result(packet, phase, iteration); }) ==
           UdpTransport::kBatch) {
    }

    now = Clock::now();
    if (now >= next_resend_scan_) {
      queue_overdue(now);
      next_resend_scan_ = now + scan_period();
    }
  }
}

void PhaseEngine::send_queued() {
  while (!send_queue_.empty()) {
    // Gather the front of the queue, skipping packets whose chunk completed meanwhile.
    send_batch_.clear();
    size_t entries = 0;
    for (; entries < send_queue_.size() && send_batch_.size() < kSendBatch; ++entries) {
      const QueuedPacket& queued = send_queue_[entries];
      if (slot_chunk_[queued.slot] == queued.offset) send_batch_.push_back(slot_packet(queued.slot));
    }
    size_t sent = transport_.send(send_batch_);
    stamp_sent(entries, sent);
    if (sent == send_batch_.size()) {
      send_queue_.erase(send_queue_.begin(), send_queue_.begin() + static_cast<std::ptrdiff_t>(entries));
      continue;
    }
    // The socket is full: drop what went out (and the stale entries before it), keep the rest.
    size_t consumed = 0;
    for (size_t valid = 0; valid < sent; ++consumed)
      if (slot_chunk_[send_queue_[consumed].slot] == send_queue_[consumed].offset) ++valid;
    send_queue_.erase(send_queue_.begin(), send_queue_.begin() + static_cast<std::ptrdiff_t>(consumed));
    return;
  }
}

Clock::duration PhaseEngine::scan_period() const {
  return std::max<Clock::duration>(timer_.timeout() / kResendScansPerInterval, std::chrono::milliseconds{1});
}

void PhaseEngine::stamp_sent(size_t entries, size_t sent) {
  // The first `sent` valid entries among the first `entries` of the queue went out now.
  auto now = Clock::now();
  for (size_t i = 0, stamped = 0; i < entries && stamped < sent; ++i) {
    const QueuedPacket& queued = send_queue_[i];
    if (slot_chunk_[queued.slot] != queued.offset) continue;
    slot_sent_at_[queued.slot] = now;
    ++stamped;
  }
}

void PhaseEngine::queue_overdue(Clock::time_point now) {
  // Every rank sends chunks in the same order, so results come back in about
  // that order: a chunk still unanswered although one sent clearly later was
  // answered has lost a packet (ours, another rank's, or the result) and is
  // resent at once instead of after the timeout.
  const auto reorder_margin = std::max<Clock::duration>(std::chrono::milliseconds{5}, timer_.timeout() / 4);
  size_t resent = 0;
  for (uint32_t slot = 0; slot < slot_chunk_.size(); ++slot) {
    if (slot_chunk_[slot] == kNoChunk || slot_sent_at_[slot] == Clock::time_point{}) continue;  // not sent yet
    auto patience = timer_.timeout() * (1 << std::min<uint32_t>(slot_resends_[slot], kMaxBackoffShift));
    bool overtaken = slot_resends_[slot] == 0 && slot_sent_at_[slot] + reorder_margin < newest_answered_send_;
    if (now - slot_sent_at_[slot] < patience && !overtaken) continue;
    send_queue_.push_back({slot, slot_chunk_[slot]});
    slot_sent_at_[slot] = now;  // not queued again before its patience has passed anew
    if (slot_resends_[slot] < kMaxBackoffShift) ++slot_resends_[slot];
    ++resent;
  }
  if (resent > 0)
    spdlog::debug("xagg: job {} rank {}: resending {} overdue chunks", settings_.job_id, settings_.rank, resent);
}

void PhaseEngine::handle_result(std::span<const std::byte> packet, const Phase& phase, uint32_t iteration) {
  wire::Decoded decoded = wire::decode_packet(packet);
  if (!decoded.header) return;
  const wire::Header& header = *decoded.header;
  if (header.type != wire::MsgType::Result || header.job_id != settings_.job_id ||
      header.token != settings_.token || header.iteration != iteration || header.op != phase.op ||
      header.chunk < phase.first_chunk || header.chunk - phase.first_chunk >= phase.chunk_count)
    return;
  uint32_t offset = header.chunk - phase.first_chunk;
  uint32_t slot = chunk_slot_[offset];
  // A result can only answer a chunk that was sent; duplicates are dropped.
  if (chunk_done_[offset] || slot == kNoChunk) return;
  phase.consume(offset, wire::payload(packet.data()));
  // Karn's rule: a resent chunk's time may measure either copy.
  if (slot_resends_[slot] == 0) {
    timer_.sample(Clock::now() - slot_sent_at_[slot]);
    newest_answered_send_ = std::max(newest_answered_send_, slot_sent_at_[slot]);
  }
  chunk_done_[offset] = true;
  ++chunks_done_;
  slot_chunk_[slot] = kNoChunk;
  chunk_slot_[offset] = kNoChunk;
  free_slots_.push_back(slot);  // a queued copy of its packet is now stale and skipped
}

std::vector<uint32_t> PhaseEngine::first_missing_chunks(const Phase& phase) const {
  std::vector<uint32_t> missing;
  for (uint32_t offset = 0; offset < phase.chunk_count && missing.size() < kMissingChunksNamed; ++offset)
    if (!chunk_done_[offset]) missing.push_back(phase.first_chunk + offset);
  return missing;
}

void PhaseEngine::throw_timeout(const Phase& phase, uint32_t iteration) const {
  throw TimeoutError(fmt::format(
      "job {} rank {} iteration {} phase {}: timed out with {} of {} chunks missing (first: {}); ranks that did not "
      "contribute: {}",
      settings_.job_id, settings_.rank, iteration, phase.name, phase.chunk_count - chunks_done_, phase.chunk_count,
      fmt::join(first_missing_chunks(phase), ", "), describe_ranks(contributions_.answer(iteration))));
}

}  // namespace xagg::worker
