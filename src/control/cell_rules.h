// The cell rules of docs/protocol.md 3.3-3.4 and 11 in C++: what a DATA share
// does to its cell and what the RESULT carries. The same rules as
// bpf/xagg_aggregator.bpf.c (tests/bpf/cell_parity_test.cpp runs shares
// through both and compares); the user-space engine aggregates with them, and
// the worker library's tests run their loopback aggregator on them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "wire.h"

namespace xagg::control {

// The fields and meaning of struct xagg_chunk, with a C++ atomic lock; its
// elements lie elsewhere (merge's value), as many per cell as the job's chunks have.
struct Cell {
  std::atomic<uint32_t> busy{0};
  uint32_t iteration = 0;
  uint64_t arrived = 0;
  bool started = false;
  uint8_t op = 0;
  uint16_t elements = 0;
  uint32_t total = 0;
  uint32_t conflict_total = 0;
  uint32_t conflict_rank = 0;
  bool congested = false;  // a share of this iteration arrived with CE set
  bool scatter = false;    // a reduce-scatter chunk: values to the owner alone
  bool narrow = false;     // 16-bit lanes, summed here as int32 (section 11)
  uint16_t owner = XAGG_NO_RANK;
};

// What the rules need of a cell's job.
struct CellJob {
  uint64_t full_mask = 0;  // wire::all_ranks_mask of its world size
  uint32_t sum_shift = 0;  // a 16-bit SUM's result is the sum / 2^sum_shift
};

// One share: a DATA packet whose payload is int32 elements or 16-bit lanes.
struct Share {
  std::byte* packet;
  uint32_t elements;
  bool narrow;
};

// What a completed (or re-requested) cell's RESULT carries besides its values.
struct CellResult {
  uint8_t echo = 0;  // the ECN echo flag (section 3.1)
  bool scatter = false;
  uint16_t owner = XAGG_NO_RANK;
};

// The cell's lock, taken with a bounded number of tries as XDP's: false when
// it stayed taken.
bool lock_cell(Cell& cell);
void unlock_cell(Cell& cell);

enum class Outcome { Added, Completed, Duplicate, Resend, Stale, OpMismatch, LengthMismatch, Contended };

// Applies the share (its header already validated as the job's) to the cell
// whose values are `value`; on Completed and Resend the share's payload then
// holds the result (section 11's rescaled lanes for a 16-bit SUM) and `result`
// its flags. Contended: the cell's lock stayed taken, as XDP drops then.
Outcome merge(Cell& cell, std::span<int32_t> value, Share share, const wire::Header& header, const CellJob& job,
              bool congested, CellResult& result);

// The outcome counter the XDP program counts the same share under.
xagg_counter counter_of(Outcome outcome);

}  // namespace xagg::control
