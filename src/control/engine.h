// The aggregation engine behind the daemon's control plane: the JobRegistry
// tells it which jobs and workers exist; it moves and sums the DATA packets.
// Two engines speak the same wire protocol (docs/protocol.md section 3): the
// XDP program (the product) and a user-space UDP aggregator (a baseline that
// isolates what XDP buys).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dataplane.h"

namespace xagg::control {

class Engine {
 public:
  virtual ~Engine() = default;
  // Lowest free job slot; add_job uses it (a job's result port is derived from it).
  virtual std::optional<uint32_t> next_free_slot() const = 0;
  // Throws std::runtime_error (no free slot, duplicate job id, no memory).
  virtual uint32_t add_job(const dataplane::JobSpec& job) = 0;
  virtual void add_worker(uint32_t job_id, const dataplane::WorkerSpec& worker) = 0;
  // Unknown job ids are ignored.
  virtual void remove_job(uint32_t job_id) = 0;
  virtual dataplane::CounterSnapshot counters() const = 0;
  // The cell of chunk for iteration's parity. Throws std::invalid_argument
  // (unknown job) or std::runtime_error (chunk out of range).
  virtual dataplane::CellState cell_state(uint32_t job_id, uint32_t chunk, uint32_t iteration) const = 0;
  // The XDP program's run time; none for an engine without one.
  virtual std::optional<dataplane::ProgramRunStats> program_run_stats() const { return std::nullopt; }
};

// Loads the XDP aggregator and attaches it to the interface.
std::unique_ptr<Engine> make_xdp_engine(const std::string& interface, dataplane::AttachMode mode,
                                        const dataplane::LoadOptions& load);

// Receives DATA on UDP 0.0.0.0:data_port with `threads` threads, each with its
// own SO_REUSEPORT socket, and sends RESULTs from the same port.
std::unique_ptr<Engine> make_userspace_engine(uint16_t data_port, unsigned threads);

}  // namespace xagg::control
