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
constexpr size_t kMissingChunksNamed = 8;

}  // namespace

PhaseEngine::PhaseEngine(UdpTransport& transport, PhaseSettings settings, std::function<void()> check_abort)
    : transport_(transport), settings_(settings), check_abort_(std::move(check_abort)) {}

void PhaseEngine::run(const Phase& phase, uint32_t iteration, Clock::time_point deadline) {
  const uint32_t slots = std::min(settings_.window_chunks, phase.chunk_count);
  packets_.resize(size_t{slots} * wire::kPacketBytes);
  slot_chunk_.assign(slots, kNoChunk);
  free_slots_.resize(slots);
  for (uint32_t slot = 0; slot < slots; ++slot) free_slots_[slot] = slots - 1 - slot;
  chunk_slot_.assign(phase.chunk_count, kNoChunk);
  chunk_done_.assign(phase.chunk_count, false);
  chunks_done_ = 0;
  send_queue_.clear();
  last_progress_ = Clock::now();

  wire::Header header{wire::MsgType::Data, settings_.job_id, settings_.token, iteration, 0, settings_.rank,
                      phase.op, 0};
  uint32_t next_chunk = 0;
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
      chunk_slot_[next_chunk] = slot;
      send_queue_.push_back(packet);
    }
    size_t sent = transport_.send(send_queue_);
    send_queue_.erase(send_queue_.begin(), send_queue_.begin() + static_cast<std::ptrdiff_t>(sent));

    auto now = Clock::now();
    if (now >= deadline) throw_timeout(phase, iteration);
    auto until_retransmit = last_progress_ + settings_.retransmit_interval - now;
    auto wait = std::min({std::chrono::ceil<std::chrono::milliseconds>(until_retransmit),
                          std::chrono::ceil<std::chrono::milliseconds>(deadline - now), kMaxPoll});
    transport_.wait(!send_queue_.empty(), std::max(wait, std::chrono::milliseconds{0}));

    while (transport_.receive([&](std::span<const std::byte> packet) { handle_result(packet, phase, iteration); }) ==
           UdpTransport::kBatch) {
    }

    now = Clock::now();
    if (now - last_progress_ >= settings_.retransmit_interval && chunks_done_ < phase.chunk_count) {
      // No result for a whole interval: resend every chunk still in flight
      // (everything queued is in flight, so the queue is rebuilt whole).
      send_queue_.clear();
      for (uint32_t slot = 0; slot < slots; ++slot)
        if (slot_chunk_[slot] != kNoChunk) send_queue_.push_back(slot_packet(slot));
      spdlog::debug("xagg: job {} rank {} iteration {} phase {}: resending {} chunks", settings_.job_id,
                    settings_.rank, iteration, phase.name, send_queue_.size());
      last_progress_ = now;
    }
  }
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
  chunk_done_[offset] = true;
  ++chunks_done_;
  slot_chunk_[slot] = kNoChunk;
  chunk_slot_[offset] = kNoChunk;
  free_slots_.push_back(slot);
  // The slot's packet may still wait in the send queue; it must not be sent
  // after the slot is reused for another chunk.
  std::erase(send_queue_, slot_packet(slot));
  last_progress_ = Clock::now();
}

void PhaseEngine::throw_timeout(const Phase& phase, uint32_t iteration) const {
  std::vector<uint32_t> first_missing;
  for (uint32_t offset = 0; offset < phase.chunk_count && first_missing.size() < kMissingChunksNamed; ++offset)
    if (!chunk_done_[offset]) first_missing.push_back(phase.first_chunk + offset);
  throw TimeoutError(fmt::format(
      "job {} rank {} iteration {} phase {}: timed out with {} of {} chunks missing (first: {})", settings_.job_id,
      settings_.rank, iteration, phase.name, phase.chunk_count - chunks_done_, phase.chunk_count,
      fmt::join(first_missing, ", ")));
}

}  // namespace xagg::worker
