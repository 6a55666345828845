#include "pipeline.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "xagg/errors.h"

namespace xagg::worker {
namespace {

// Longest single wait, so that aggregator errors and new operations are
// noticed promptly even with a long retransmit interval.
constexpr std::chrono::milliseconds kMaxPoll{10};
// Missing chunks named in a timeout error, and asked about in the status request.
constexpr size_t kMissingChunksNamed = 8;
static_assert(kMissingChunksNamed <= control::kMaxStatusChunks);
// A chunk's n-th resend waits its patience (the learned timeout, or the
// retransmit interval for urgent chunks) * 2^min(n, kMaxBackoffShift).
constexpr uint32_t kMaxBackoffShift = 2;
// Overdue chunks are looked for this many times per retransmission timeout,
// and at least this often (the reordering an overtaken chunk is allowed).
constexpr int kResendScansPerInterval = 4;
constexpr std::chrono::milliseconds kMaxScanPeriod{10};
// Results may overtake each other by this many chunks of an operation (the
// aggregator's CPUs, the bridge) before the later one means a loss.
constexpr uint32_t kReorderChunks = 64;
// Packets handed to the transport per call.
constexpr size_t kSendBatch = 512;
// Chunks encoded between sends: a bucket's first packets leave while the rest
// is still being quantized, so an idle link starts a bucket at once.
constexpr uint32_t kFillBatch = 64;

std::string describe_ranks(const std::optional<control::StatusReply>& answer) {
  if (!answer) return "unknown (no answer from the aggregator)";
  if (answer->missing_ranks.empty()) return "none";
  return fmt::format("{}", fmt::join(answer->missing_ranks, ", "));
}

// Compared as addresses: the buffers may belong to unrelated objects.
bool overlap(std::span<const std::byte> a, std::span<const std::byte> b) {
  const auto begin = [](std::span<const std::byte> bytes) { return reinterpret_cast<uintptr_t>(bytes.data()); };
  return begin(a) < begin(b) + b.size() && begin(b) < begin(a) + a.size();
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

std::vector<uint32_t> identity(uint32_t count) {
  std::vector<uint32_t> values(count);
  for (uint32_t value = 0; value < count; ++value) values[value] = value;
  return values;
}

Pipeline::Pipeline(UdpTransport& transport, ShardPlacement placement, PipelineSettings settings,
                   ContributionStatus& contributions)
    : transport_(transport),
      placement_(std::move(placement)),
      aggregator_of_shard_(identity(placement_.shards())),
      shard_of_aggregator_(aggregator_of_shard_),
      settings_(std::move(settings)),
      contributions_(contributions),
      uses_(placement_.job_chunks(), 0),
      chunk_slot_(placement_.job_chunks(), kNone),
      chunk_done_(placement_.job_chunks(), false),
      chunk_memory_(size_t{placement_.job_chunks()} * settings_.memory_per_chunk, Reduction::kNothingRemembered),
      completed_data_(settings_.keep_completed ? placement_.job_chunks() : 0),
      packets_(size_t{settings_.window_chunks} * settings_.slot_bytes),
      slots_(settings_.window_chunks),
      free_slots_(settings_.window_chunks),
      newest_answered_send_(transport.aggregator_count()),
      timer_(settings_.retransmit_interval),
      tail_probe_(settings_.retransmit_interval),
      congestion_(settings_.window_chunks) {
  // Lowest slot first, so that a small operation touches little of the window.
  for (uint32_t slot = 0; slot < settings_.window_chunks; ++slot) free_slots_[slot] = settings_.window_chunks - 1 - slot;
  lanes_.resize(wire::kMaxChunkElems);
}

bool Pipeline::try_start(std::unique_ptr<Reduction>& reduction, uint64_t sequence, Clock::time_point deadline,
                         Completion done) {
  const uint32_t count = reduction->chunk_count();
  if (count == 0) {
    done(nullptr);
    return true;
  }
  const uint32_t first = next_free_chunk_ + count <= placement_.job_chunks() ? next_free_chunk_ : 0;
  for (const Running& running : running_) {
    uint32_t other_first = running.first_chunk;
    if (first < other_first + running.reduction->chunk_count() && other_first < first + count) return false;
    // Run together, this one would send input that the running one is still
    // to overwrite with its results, and overwrite those results itself.
    if (overlap(reduction->buffer(), running.reduction->buffer())) return false;
  }
  next_free_chunk_ = first + count;
  for (uint32_t chunk = first; chunk < first + count; ++chunk) {
    ++uses_[chunk];
    chunk_done_[chunk] = false;
  }
  if (running_.empty()) next_resend_scan_ = Clock::now() + scan_period();
  const uint32_t per_chunk = settings_.memory_per_chunk;
  reduction->place(std::span<int32_t>(chunk_memory_).subspan(size_t{first} * per_chunk, size_t{count} * per_chunk),
                   per_chunk);
  const std::vector<uint32_t> none_answered(transport_.aggregator_count(), 0);
  const auto total = static_cast<uint32_t>(reduction->buffer().size() / sizeof(int32_t));
  running_.push_back({.reduction = std::move(reduction),
                      .sequence = sequence,
                      .total = total,
                      .first_chunk = first,
                      .started = Clock::now(),
                      .deadline = deadline,
                      .checkpoint = next_checkpoint(Clock::now(), deadline),
                      .done = std::move(done),
                      .answered_up_to = none_answered,
                      .answered_up_to_at_last_scan = none_answered,
                      .in_flight = 0,
                      .out_of_order = false,
                      .question = std::nullopt,
                      .question_shard = 0});
  return true;
}

void Pipeline::progress(int wake_fd) {
  fill_window();
  send_queued();
  auto now = Clock::now();
  check_deadlines(now);
  if (idle()) return;

  auto wait = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(next_wakeup() - now),
                         std::chrono::milliseconds{0}, kMaxPoll);
  transport_.wait(!send_queue_.empty(), wait, wake_fd);
  while (transport_.receive(
      [this](std::span<const std::byte> packet, uint32_t shard) { handle_result(packet, shard); })) {
  }

  now = Clock::now();
  send_courtesies(now);
  if (now >= next_resend_scan_) {
    queue_overdue(now);
    next_resend_scan_ = now + scan_period();
  }
  if (slots_.size() > free_slots_.size())
    if (auto probe_due = tail_probe_.due(min_round_trip_.get()); probe_due && now >= *probe_due) queue_probe(now);
}

void Pipeline::fail_all(std::exception_ptr error) {
  while (!running_.empty()) finish(running_.begin(), error);
  courtesies_.clear();
}

void Pipeline::move_to(ShardPlacement placement, std::vector<uint32_t> aggregator_of_shard,
                       std::vector<uint64_t> tokens, Clock::time_point courtesy_until) {
  placement_ = std::move(placement);
  aggregator_of_shard_ = std::move(aggregator_of_shard);
  std::ranges::fill(shard_of_aggregator_, kNone);
  for (uint32_t shard = 0; shard < aggregator_of_shard_.size(); ++shard)
    shard_of_aggregator_[aggregator_of_shard_[shard]] = shard;
  settings_.tokens = std::move(tokens);
  const auto now = Clock::now();
  // What was queued or answered belongs to the cells of the earlier epoch.
  send_queue_.clear();
  gating_sends_.clear();
  std::ranges::fill(newest_answered_send_, Clock::time_point{});
  for (Running& running : running_) {
    std::ranges::fill(running.answered_up_to, 0);
    std::ranges::fill(running.answered_up_to_at_last_scan, 0);
  }
  for (uint32_t slot_index = 0; slot_index < slots_.size(); ++slot_index) {
    Slot& slot = slots_[slot_index];
    if (slot.running == nullptr) continue;
    const uint32_t chunk = slot.running->first_chunk + slot.offset;
    readdress({slot_packet(slot_index), slot_packet_bytes(slot_index)}, chunk);
    slot.shard = aggregator_of(chunk);
    slot.resends = 0;
    slot.sent_at = {};
    send_queue_.push_back({slot_index, slot.use});
  }
  courtesies_.clear();
  for (uint32_t chunk = 0; chunk < completed_data_.size(); ++chunk) {
    if (completed_data_[chunk].empty()) continue;
    readdress(completed_data_[chunk], chunk);
    courtesies_.push_back({chunk, wire::decode_packet(completed_data_[chunk]).header->iteration, now});
  }
  courtesy_until_ = courtesy_until;
  last_result_at_ = now;
  next_resend_scan_ = now + scan_period();
  spdlog::info("xagg: job {} rank {}: chunks moved to {} aggregators; {} in flight and {} completed uses sent again",
               settings_.job_id, settings_.rank, placement_.shards(), send_queue_.size(), courtesies_.size());
}

void Pipeline::readdress(std::span<std::byte> packet, uint32_t chunk) const {
  wire::Header header = *wire::decode_packet(packet).header;
  header.token = settings_.tokens[aggregator_of(chunk)];
  header.chunk = placement_.local_index(chunk);
  wire::encode_header(header, packet.first(wire::kHeaderBytes));
}

void Pipeline::send_courtesies(Clock::time_point now) {
  if (courtesies_.empty()) return;
  if (now >= courtesy_until_) {
    spdlog::debug("xagg: job {} rank {}: {} completed uses unanswered since the failover, no longer sent",
                  settings_.job_id, settings_.rank, courtesies_.size());
    courtesies_.clear();
    return;
  }
  std::vector<UdpTransport::Outgoing> due;
  for (Courtesy& courtesy : courtesies_) {
    if (now < courtesy.due || due.size() == kSendBatch) continue;
    const std::vector<std::byte>& data = completed_data_[courtesy.chunk];
    due.push_back({data, aggregator_of(courtesy.chunk)});
    courtesy.due = now + settings_.retransmit_interval * (1 << std::min(courtesy.sends, kMaxBackoffShift));
    ++courtesy.sends;
  }
  // A full socket only delays them to their next turn.
  if (!due.empty()) transport_.send(due);
}

void Pipeline::fill_window() {
  // Every rank sends chunks in one order: operations in start order, each in
  // offset order. Chunks that go out of that order here (a redone one, or an
  // operation's chunks once a later operation's are in flight: they went
  // while this one waited for its exponents) may be what the other ranks'
  // windows wait for before those later chunks can complete; the congestion
  // window must not hold them back, or the ranks wait on one another.
  while (!free_slots_.empty() && !redo_waiting_.empty()) {
    Running& running = *redo_waiting_.front().running;
    load_slot(take_free_slot(), running, redo_waiting_.front().offset, true);
    ++running.in_flight;
    redo_waiting_.pop_front();
  }
  bool later_in_flight = false;
  for (auto running = running_.rbegin(); running != running_.rend(); ++running) {
    running->out_of_order = later_in_flight;
    later_in_flight = later_in_flight || running->in_flight > 0;
  }
  // Earlier operations first; one waiting for its exponents lets later ones use the window.
  uint32_t loaded = 0;
  bool socket_has_room = true;  // once it is full, sends wait for progress() to poll
  for (Running& running : running_) {
    Reduction& reduction = *running.reduction;
    for (; may_load(running.out_of_order) && running.next_offset < reduction.chunk_count() &&
           reduction.ready(running.next_offset);
         ++running.next_offset) {
      load_slot(take_free_slot(), running, running.next_offset, false);
      ++running.in_flight;
      if (++loaded % kFillBatch == 0 && socket_has_room) {
        queue_gating_sends();
        socket_has_room = send_queued();
      }
    }
  }
  queue_gating_sends();
}

void Pipeline::queue_gating_sends() {
  // Ahead of queued data, in order.
  send_queue_.insert(send_queue_.begin(), gating_sends_.begin(), gating_sends_.end());
  gating_sends_.clear();
}

void Pipeline::load_slot(uint32_t slot_index, Running& running, uint32_t offset, bool redone) {
  const uint32_t chunk = running.first_chunk + offset;
  const uint32_t shard = aggregator_of(chunk);
  std::byte* packet = slot_packet(slot_index);
  wire::Header header{};
  header.type = wire::MsgType::Data;
  header.job_id = settings_.job_id;
  header.token = settings_.tokens[shard];
  header.rank = settings_.rank;
  header.chunk = placement_.local_index(chunk);
  header.iteration = tag_of(chunk);
  header.op = running.reduction->op(offset);
  header.total = running.total;
  switch (running.reduction->scatter_role(offset)) {
    case ScatterRole::None: break;
    case ScatterRole::Owner: header.flags = wire::kFlagScatter | wire::kFlagOwner; break;
    case ScatterRole::Other: header.flags = wire::kFlagScatter; break;
  }
  Slot& slot = slots_[slot_index];
  slot.narrow = running.reduction->narrow();
  if (slot.narrow) {
    header.flags |= wire::kFlagNarrow;
    slot.elements = running.reduction->fill(offset, lanes_.data());
    wire::narrow_lanes({lanes_.data(), slot.elements}, wire::narrow_payload(packet));
  } else {
    slot.elements = running.reduction->fill(offset, wire::payload(packet));
  }
  wire::encode_header(header, {packet, wire::kHeaderBytes});
  slot.shard = shard;
  slot.running = &running;
  slot.offset = offset;
  ++slot.use;
  slot.resends = 0;
  slot.redone = redone;
  slot.sent_at = {};
  chunk_slot_[chunk] = slot_index;
  if (running.reduction->gating(offset))
    gating_sends_.push_back({slot_index, slot.use});
  else
    send_queue_.push_back({slot_index, slot.use});
}

void Pipeline::redo(Running& running, uint32_t offset) {
  // Every rank redoes the same chunks, so every rank moves to the same new
  // tag, whether it had sent the abandoned use or not. The abandoned use's
  // cell stays incomplete until a later use overwrites it.
  const uint32_t chunk = running.first_chunk + offset;
  ++uses_[chunk];
  if (offset >= running.next_offset) return;  // not loaded yet: it goes out with the new tag
  if (chunk_done_[chunk]) {
    chunk_done_[chunk] = false;
    --running.chunks_done;
  }
  if (chunk_slot_[chunk] != kNone)
    load_slot(chunk_slot_[chunk], running, offset, true);
  else
    redo_waiting_.push_back({&running, offset});
}

bool Pipeline::send_queued() {
  while (!send_queue_.empty()) {
    // Gather the front of the queue, skipping packets whose chunk completed meanwhile.
    send_batch_.clear();
    size_t entries = 0;
    for (; entries < send_queue_.size() && send_batch_.size() < kSendBatch; ++entries)
      if (const QueuedSend& queued = send_queue_[entries]; queued_is_current(queued))
        send_batch_.push_back({{slot_packet(queued.slot), slot_packet_bytes(queued.slot)},
                               slots_[queued.slot].shard});
    size_t sent = transport_.send(send_batch_);
    stamp_sent(entries, sent);
    if (sent == send_batch_.size()) {
      send_queue_.erase(send_queue_.begin(), send_queue_.begin() + static_cast<std::ptrdiff_t>(entries));
      continue;
    }
    // The socket is full: drop what went out (and the stale entries before it), keep the rest.
    size_t consumed = 0;
    for (size_t valid = 0; valid < sent; ++consumed)
      if (queued_is_current(send_queue_[consumed])) ++valid;
    send_queue_.erase(send_queue_.begin(), send_queue_.begin() + static_cast<std::ptrdiff_t>(consumed));
    return false;
  }
  return true;
}

void Pipeline::stamp_sent(size_t entries, size_t sent) {
  // The first `sent` current entries among the first `entries` of the queue went out now.
  auto now = Clock::now();
  for (size_t i = 0, stamped = 0; i < entries && stamped < sent; ++i) {
    if (!queued_is_current(send_queue_[i])) continue;
    slots_[send_queue_[i].slot].sent_at = now;
    ++stamped;
  }
  if (sent > 0) tail_probe_.on_send(now);
}

Clock::duration Pipeline::scan_period() const {
  return std::clamp<Clock::duration>(timer_.timeout() / kResendScansPerInterval, std::chrono::milliseconds{1},
                                     kMaxScanPeriod);
}

Clock::time_point Pipeline::next_wakeup() const {
  Clock::time_point wakeup = next_resend_scan_;
  if (slots_.size() > free_slots_.size())
    if (auto probe_due = tail_probe_.due(min_round_trip_.get())) wakeup = std::min(wakeup, *probe_due);
  for (const Running& running : running_)
    wakeup = std::min(wakeup, running.question ? running.checkpoint : running.checkpoint - settings_.status_lead);
  return wakeup;
}

void Pipeline::queue_overdue(Clock::time_point now) {
  // Every rank sends an operation's chunks in offset order, so their results
  // come back in about that order: a chunk still unanswered although one sent
  // clearly later here, or one further in the operation, was answered has
  // lost a packet (ours, another rank's, or the result) and is resent at once
  // instead of after the timeout. "Clearly": kReorderChunks further, or
  // answered before the previous scan. The offset tests serve a fast rank,
  // whose own send times say nothing: it sent everything at once and its
  // results come at the slowest rank's pace.
  const auto reorder_margin = std::max<Clock::duration>(std::chrono::milliseconds{5}, timer_.timeout() / 4);
  size_t resent = 0;
  for (uint32_t slot_index = 0; slot_index < slots_.size(); ++slot_index) {
    Slot& slot = slots_[slot_index];
    if (slot.running == nullptr || slot.sent_at == Clock::time_point{}) continue;  // free, or not sent yet
    const Running& running = *slot.running;
    // Nothing overtakes an operation's last chunk or a redone one, and other
    // chunks wait for a gating one; the learned timeout would leave a loss
    // there unrepaired for up to its ceiling, so these wait only the interval.
    bool urgent = slot.offset == running.reduction->chunk_count() - 1 || running.reduction->gating(slot.offset) ||
                  slot.redone;
    auto patience = (urgent ? Clock::duration{settings_.retransmit_interval} : timer_.timeout()) *
                    (1 << std::min<uint32_t>(slot.resends, kMaxBackoffShift));
    // A redone chunk goes out whenever its exponents arrive, which differs
    // between ranks, so neither later sends nor later offsets say it was lost.
    // Compared only with results of the same aggregator: another one's come
    // back along another path (a co-located one's never queue on the link).
    bool behind = !slot.redone && (slot.sent_at + reorder_margin < newest_answered_send_[slot.shard] ||
                                   slot.offset + kReorderChunks < running.answered_up_to[slot.shard] ||
                                   slot.offset < running.answered_up_to_at_last_scan[slot.shard]);
    // A resend can be lost too; while results keep overtaking it, it is
    // repeated every retransmit interval rather than after the learned
    // timeout, which on a fast rank includes waiting for the slowest one.
    bool overtaken = behind && (slot.resends == 0 || now - slot.sent_at >= settings_.retransmit_interval);
    // Like TCP's timer, which restarts on every new acknowledgement, the
    // learned timeout runs from the later of the send and the last result:
    // while results arrive, a loss shows as a chunk overtaken (above), and a
    // chunk that merely waits for a slower rank is not sent again.
    auto waiting_since = urgent ? slot.sent_at : std::max(slot.sent_at, last_result_at_);
    if (now - waiting_since < patience && !overtaken) continue;
    send_queue_.push_back({slot_index, slot.use});
    slot.sent_at = now;  // not queued again before its patience has passed anew
    if (slot.resends < kMaxBackoffShift) ++slot.resends;
    ++resent;
  }
  for (Running& running : running_) running.answered_up_to_at_last_scan = running.answered_up_to;
  if (resent > 0) {
    spdlog::debug("xagg: job {} rank {}: resending {} overdue chunks (window now {})", settings_.job_id,
                  settings_.rank, resent, congestion_.chunks());
  }
}

void Pipeline::queue_probe(Clock::time_point now) {
  // Not a loss signal for the congestion window: at a step's tail, or while
  // a slower rank computes, results stop without any loss.
  std::vector<uint32_t> waiting;
  for (uint32_t slot_index = 0; slot_index < slots_.size(); ++slot_index)
    if (slots_[slot_index].running != nullptr && slots_[slot_index].sent_at != Clock::time_point{})
      waiting.push_back(slot_index);
  const auto probed = std::min<size_t>(waiting.size(), TailProbe::kChunksPerProbe);
  std::ranges::partial_sort(waiting, waiting.begin() + static_cast<std::ptrdiff_t>(probed), {},
                            [this](uint32_t slot_index) { return slots_[slot_index].sent_at; });
  for (size_t i = 0; i < probed; ++i) {
    Slot& slot = slots_[waiting[i]];
    send_queue_.push_back({waiting[i], slot.use});
    slot.sent_at = now;
    if (slot.resends < kMaxBackoffShift) ++slot.resends;  // Karn's rule, and the timers' backoff
  }
  tail_probe_.on_probe(now);
  if (probed > 0)
    spdlog::debug("xagg: job {} rank {}: no result for {} us, probing with {} chunks", settings_.job_id,
                  settings_.rank,
                  std::chrono::duration_cast<std::chrono::microseconds>(tail_probe_.timeout(min_round_trip_.get()))
                      .count(),
                  probed);
}

void Pipeline::handle_result(std::span<const std::byte> packet, uint32_t shard) {
  wire::Decoded decoded = wire::decode_packet(packet);
  if (!decoded.header) {
    ++undecodable_results_;
    return;
  }
  const wire::Header& header = *decoded.header;
  const uint32_t placed = shard_of_aggregator_[shard];
  // The token is the epoch's: an earlier epoch's results never count.
  if (placed == kNone || header.type != wire::MsgType::Result || header.job_id != settings_.job_id ||
      header.token != settings_.tokens[shard] || header.chunk >= placement_.shard_chunks(placed))
    return;
  const uint32_t chunk = placement_.job_chunk(placed, header.chunk);
  std::erase_if(courtesies_, [&](const Courtesy& courtesy) {
    return courtesy.chunk == chunk && courtesy.tag == header.iteration;
  });
  // A result can only answer a chunk in flight, in its current use; duplicates are dropped.
  uint32_t slot_index = chunk_slot_[chunk];
  if (slot_index == kNone || header.iteration != tag_of(chunk)) return;
  Slot& slot = slots_[slot_index];
  Running& running = *slot.running;
  // A rank not owning a reduce-scatter chunk gets its header alone (or, resent, its values, unused).
  const bool values_unwanted = running.reduction->scatter_role(slot.offset) == ScatterRole::Other;
  if (header.op != running.reduction->op(slot.offset) || header.total != running.total ||
      decoded.narrow() != slot.narrow ||
      (decoded.elements != slot.elements && !(values_unwanted && decoded.elements == 0))) {
    ++mismatched_results_;
    return;
  }
  redo_offsets_.clear();
  const uint32_t result_elements = values_unwanted ? 0 : decoded.elements;
  std::span<const int32_t> result(wire::payload(packet.data()), result_elements);
  if (slot.narrow) {
    wire::widen_lanes(wire::narrow_payload(packet.data()), {lanes_.data(), result_elements});
    result = {lanes_.data(), result_elements};
  }
  running.reduction->consume(slot.offset, result, redo_offsets_);
  running.answered_up_to[shard] = std::max(running.answered_up_to[shard], slot.offset + 1);
  const auto now = Clock::now();
  last_result_at_ = now;
  tail_probe_.on_result(now);
  // Karn's rule: a resent chunk's time may measure either copy. Exponent
  // chunks jump every rank's queue and redone chunks go out late, so their
  // results overtake data sent before them without any loss. One exception
  // for the minimum round trip: a cached answer (RESEND) to a chunk's only
  // resend answers that resend, at once; the first copy cannot have caused it.
  if (slot.resends == 1 && (header.flags & XAGG_FLAG_RESEND) != 0) min_round_trip_.sample(now - slot.sent_at, now);
  if (slot.resends == 0) {
    timer_.sample(now - slot.sent_at);
    min_round_trip_.sample(now - slot.sent_at, now);
    if (!running.reduction->gating(slot.offset) && !slot.redone)
      newest_answered_send_[shard] = std::max(newest_answered_send_[shard], slot.sent_at);
  }
  // A RESULT names the rank whose share completed it: when that is this rank,
  // the time waited for no other rank and measures the network alone.
  std::optional<Clock::duration> own_round_trip;
  if (slot.resends == 0 && header.rank == settings_.rank && !(header.flags & (wire::kFlagResend | wire::kFlagScatter)))
    own_round_trip = last_result_at_ - slot.sent_at;
  congestion_.on_result(last_result_at_, header.flags & wire::kFlagCongestionExperienced, own_round_trip);
  // Whose frame a resend replaced shows only now: this rank's DATA if its
  // resend completed the chunk, its RESULT if the cache answered. Any other
  // rank's loss delays every rank's result but says nothing of this rank's path.
  if (slot.resends > 0 && (header.rank == settings_.rank || (header.flags & wire::kFlagResend)))
    congestion_.on_own_loss(last_result_at_, timer_.smoothed());
  chunk_done_[chunk] = true;
  chunk_slot_[chunk] = kNone;
  if (settings_.keep_completed) {
    // Every rank has contributed to this use, so every rank has completed the previous one.
    std::erase_if(courtesies_, [&](const Courtesy& courtesy) { return courtesy.chunk == chunk; });
    const std::byte* data = slot_packet(slot_index);
    completed_data_[chunk].assign(data, data + wire::packet_bytes(slot.elements, slot.narrow));
  }
  slot.running = nullptr;  // a queued copy of its packet is now stale and skipped
  free_slots_.push_back(slot_index);
  --running.in_flight;
  ++running.chunks_done;
  for (uint32_t offset : redo_offsets_) redo(running, offset);
  if (running.chunks_done == running.reduction->chunk_count())
    finish(std::ranges::find(running_, &running, [](const Running& entry) { return &entry; }), nullptr);
}

void Pipeline::check_deadlines(Clock::time_point now) {
  for (auto running = running_.begin(); running != running_.end();) {
    auto current = running++;
    if (!current->question && now >= current->checkpoint - settings_.status_lead) {
      std::vector<uint32_t> missing = first_missing_chunks(*current);
      std::vector<uint32_t> local_indexes;
      for (uint32_t chunk : missing) local_indexes.push_back(placement_.local_index(chunk));
      current->question_shard = aggregator_of(missing.front());
      current->question =
          contributions_.ask(current->question_shard, tag_of(missing.front()), local_indexes, current->deadline);
    }
    if (std::exception_ptr sizes_differ = size_error(*current)) {
      finish(current, sizes_differ);
    } else if (now >= current->deadline) {
      finish(current, timeout_error(*current));
    } else if (now >= current->checkpoint) {
      spdlog::warn("xagg: job {} rank {} operation {}: still running after {} ms: {}", settings_.job_id,
                   settings_.rank, current->sequence,
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - current->started).count(),
                   describe_missing(*current));
      current->question.reset();
      current->checkpoint = next_checkpoint(now, current->deadline);
    }
  }
}

Clock::time_point Pipeline::next_checkpoint(Clock::time_point now, Clock::time_point deadline) const {
  if (settings_.progress_interval.count() == 0) return deadline;
  return std::min(now + settings_.progress_interval, deadline);
}

void Pipeline::finish(std::list<Running>::iterator running, std::exception_ptr error) {
  for (uint32_t slot_index = 0; slot_index < slots_.size(); ++slot_index) {
    Slot& slot = slots_[slot_index];
    if (slot.running != &*running) continue;
    chunk_slot_[running->first_chunk + slot.offset] = kNone;
    slot.running = nullptr;
    free_slots_.push_back(slot_index);
  }
  std::erase_if(redo_waiting_, [&](const Redo& waiting) { return waiting.running == &*running; });
  Completion done = std::move(running->done);
  running_.erase(running);
  done(error);
}

std::vector<uint32_t> Pipeline::first_missing_chunks(const Running& running) const {
  // All of one tag and one aggregator, so that one status question covers
  // them. Chunks this rank has sent come first: the ranks missing there are
  // the ones holding the operation up; an unsent chunk (data waiting for its
  // exponents' result) misses every rank.
  const uint32_t end = running.first_chunk + running.reduction->chunk_count();
  for (bool sent_only : {true, false}) {
    std::vector<uint32_t> missing;
    for (uint32_t chunk = running.first_chunk; chunk < end && missing.size() < kMissingChunksNamed; ++chunk)
      if (!chunk_done_[chunk] && (!sent_only || chunk_slot_[chunk] != kNone) &&
          (missing.empty() || (tag_of(chunk) == tag_of(missing.front()) &&
                               aggregator_of(chunk) == aggregator_of(missing.front()))))
        missing.push_back(chunk);
    if (!missing.empty()) return missing;
  }
  return {};
}

std::string Pipeline::describe_missing(const Running& running) const {
  std::vector<uint32_t> missing = first_missing_chunks(running);
  const uint32_t count = running.reduction->chunk_count();
  std::string ranks = describe_ranks(running.question ? contributions_.answer(*running.question) : std::nullopt);
  // Every rank of this leaf contributed: the leaf's share is at the root, which lacks another leaf's.
  if (ranks == "none" && !settings_.root_aggregator.empty())
    ranks = fmt::format("none of this leaf (the root aggregator {} waits for another leaf)", settings_.root_aggregator);
  return fmt::format(
      "{} of {} chunks missing (first: {}); ranks that did not contribute{}: {}{}", count - running.chunks_done,
      count, fmt::join(missing, ", "),
      transport_.aggregator_count() == 1 ? "" : fmt::format(" (at {})", transport_.aggregator_name(running.question_shard)),
      ranks,
      undecodable_results_ + mismatched_results_ == 0
          ? ""
          : fmt::format("; results ignored: {} undecodable, {} of another op or length", undecodable_results_,
                        mismatched_results_));
}

std::exception_ptr Pipeline::size_error(const Running& running) const {
  if (!running.question) return nullptr;
  std::optional<control::StatusReply> answer = contributions_.answer(*running.question);
  if (!answer || !answer->size_conflict) return nullptr;
  const control::SizeConflict& conflict = *answer->size_conflict;
  return std::make_exception_ptr(CommError(fmt::format(
      "job {} rank {} operation {}: tensor sizes differ between ranks: this rank all-reduces {} elements; "
      "the aggregator holds shares of a {}-element all-reduce and refused rank {}'s share of a {}-element one",
      settings_.job_id, settings_.rank, running.sequence, running.total, conflict.elements, conflict.rank,
      conflict.rank_elements)));
}

std::exception_ptr Pipeline::timeout_error(const Running& running) const {
  return std::make_exception_ptr(TimeoutError(fmt::format("job {} rank {} operation {}: timed out with {}",
                                                          settings_.job_id, settings_.rank, running.sequence,
                                                          describe_missing(running))));
}

}  // namespace xagg::worker
