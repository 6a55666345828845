#include "cell_rules.h"

#include <algorithm>

namespace xagg::control {
namespace {

constexpr uint32_t kLockAttempts = 1u << 16;  // as in XDP: then dropped as contended

// Adds (or takes the maximum of, or ors) the share's lanes into the cell's
// values; int32 SUM wraps, done in uint32 to stay defined.
template <typename Lane>
void combine(std::span<int32_t> value, const Lane* lanes, uint32_t elements, uint8_t op) {
  for (size_t i = 0; i < elements; ++i) {
    const int32_t lane = lanes[i];
    if (op == XAGG_OP_SUM)
      value[i] = static_cast<int32_t>(static_cast<uint32_t>(value[i]) + static_cast<uint32_t>(lane));
    else if (op == XAGG_OP_MAX)
      value[i] = std::max(value[i], lane);
    else
      value[i] |= lane;
  }
}

}  // namespace

void unlock_cell(Cell& cell) { cell.busy.store(0, std::memory_order_release); }

bool lock_cell(Cell& cell) {
  for (uint32_t attempt = 0; attempt < kLockAttempts; ++attempt) {
    if (cell.busy.load(std::memory_order_relaxed) == 0 && cell.busy.exchange(1, std::memory_order_acquire) == 0)
      return true;
    __builtin_ia32_pause();
  }
  return false;
}

Outcome merge(Cell& cell, std::span<int32_t> value, Share share, const wire::Header& header, const CellJob& job,
              bool congested, CellResult& result) {
  if (share.elements > value.size()) return Outcome::LengthMismatch;  // longer than the job's chunks
  const uint32_t iteration = header.iteration;
  const auto op = static_cast<uint8_t>(header.op);
  const uint64_t rank_bit = uint64_t{1} << header.rank;
  const bool scatter = (header.flags & wire::kFlagScatter) != 0;
  const bool claims_owner = (header.flags & wire::kFlagOwner) != 0;
  int16_t* lanes = wire::narrow_payload(share.packet);
  int32_t* elements = wire::payload(share.packet);
  if (!lock_cell(cell)) return Outcome::Contended;
  Outcome outcome;
  if (!cell.started || static_cast<int32_t>(iteration - cell.iteration) > 0) {
    if (share.narrow)
      wire::widen_lanes(lanes, value.first(share.elements));
    else
      std::copy_n(elements, share.elements, value.begin());
    cell.started = true;
    cell.iteration = iteration;
    cell.op = op;
    cell.elements = static_cast<uint16_t>(share.elements);
    cell.total = header.total;
    cell.conflict_total = 0;
    cell.arrived = rank_bit;
    cell.congested = congested;
    cell.scatter = scatter;
    cell.narrow = share.narrow;
    cell.owner = claims_owner ? header.rank : XAGG_NO_RANK;
    outcome = Outcome::Added;
  } else if (iteration != cell.iteration) {
    outcome = Outcome::Stale;
  } else if (op != cell.op || scatter != cell.scatter || share.narrow != cell.narrow ||
             (claims_owner && cell.owner != XAGG_NO_RANK && cell.owner != header.rank)) {
    outcome = Outcome::OpMismatch;
  } else if (header.total != cell.total) {
    cell.conflict_total = header.total;
    cell.conflict_rank = header.rank;
    outcome = Outcome::LengthMismatch;
  } else if (share.elements != cell.elements) {
    outcome = Outcome::LengthMismatch;
  } else if (cell.arrived & rank_bit) {
    outcome = cell.arrived == job.full_mask ? Outcome::Resend : Outcome::Duplicate;
  } else {
    if (share.narrow)
      combine(value, lanes, share.elements, op);
    else
      combine(value, elements, share.elements, op);
    cell.arrived |= rank_bit;
    cell.congested = cell.congested || congested;
    if (claims_owner) cell.owner = header.rank;
    outcome = Outcome::Added;
  }
  if (outcome == Outcome::Added && cell.arrived == job.full_mask) outcome = Outcome::Completed;
  if (outcome == Outcome::Completed || outcome == Outcome::Resend) {
    if (!share.narrow) {
      std::copy_n(value.begin(), share.elements, elements);
    } else {
      const uint32_t shift = op == XAGG_OP_SUM ? job.sum_shift : 0;
      for (size_t i = 0; i < share.elements; ++i) lanes[i] = static_cast<int16_t>(wire::rescale_sum(value[i], shift));
    }
    result = {static_cast<uint8_t>(cell.congested || congested ? wire::kFlagCongestionExperienced : 0), cell.scatter,
              cell.owner};
  }
  unlock_cell(cell);
  return outcome;
}

xagg_counter counter_of(Outcome outcome) {
  switch (outcome) {
    case Outcome::Added: return XAGG_CNT_AGGREGATED;
    case Outcome::Completed: return XAGG_CNT_COMPLETED;
    case Outcome::Duplicate: return XAGG_CNT_DUPLICATE;
    case Outcome::Resend: return XAGG_CNT_RESENT;
    case Outcome::Stale: return XAGG_CNT_STALE;
    case Outcome::OpMismatch: return XAGG_CNT_OP_MISMATCH;
    case Outcome::LengthMismatch: return XAGG_CNT_LENGTH_MISMATCH;
    case Outcome::Contended: return XAGG_CNT_CONTENDED;
  }
  return XAGG_CNT_CONTENDED;
}

}  // namespace xagg::control
