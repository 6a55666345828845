#include "control_fuzz_harness.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "control_messages.h"
#include "engine.h"
#include "job_registry.h"

namespace xagg::reliability {
namespace {

using control::ConnectionId;

// Remembers jobs and workers, and reports calls a correct registry never makes.
class RecordingEngine final : public control::Engine {
 public:
  explicit RecordingEngine(std::vector<std::string>& violations) : violations_(violations) {}

  std::optional<uint32_t> next_free_slot() const override {
    for (uint32_t slot = 0; slot < XAGG_MAX_JOBS; ++slot)
      if (!used_slots_.contains(slot)) return slot;
    return std::nullopt;
  }
  uint32_t add_job(const dataplane::JobSpec& job) override {
    if (jobs_.contains(job.job_id)) violations_.push_back(fmt::format("job {} added twice", job.job_id));
    auto slot = next_free_slot();
    if (!slot) throw std::runtime_error("all job slots are in use");
    used_slots_.insert(*slot);
    jobs_[job.job_id] = {*slot, job.world_size, wire::cell_bytes(job.chunks, job.chunk_elements), {}};
    return *slot;
  }
  void add_worker(uint32_t job_id, const dataplane::WorkerSpec& worker) override {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end()) return violations_.push_back(fmt::format("worker added to missing job {}", job_id));
    if (worker.rank >= job->second.world_size)
      violations_.push_back(fmt::format("job {}: rank {} registered beyond world size {}", job_id, worker.rank,
                                        job->second.world_size));
    if (!job->second.ranks.insert(worker.rank).second)
      violations_.push_back(fmt::format("job {}: rank {} registered twice", job_id, worker.rank));
  }
  void remove_job(uint32_t job_id) override {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end()) return;
    used_slots_.erase(job->second.slot);
    jobs_.erase(job);
  }
  dataplane::CounterSnapshot counters() const override { return {}; }
  dataplane::CellState cell_state(uint32_t job_id, uint32_t, uint32_t) const override {
    if (!jobs_.contains(job_id)) violations_.push_back(fmt::format("status of missing job {}", job_id));
    return {};
  }

  uint64_t memory() const {
    uint64_t total = 0;
    for (const auto& [id, job] : jobs_) total += job.memory;
    return total;
  }
  size_t jobs() const { return jobs_.size(); }

 private:
  struct Job {
    uint32_t slot = 0;
    uint32_t world_size = 0;
    uint64_t memory = 0;
    std::set<uint32_t> ranks;  // the engine has no way to remove one
  };
  std::vector<std::string>& violations_;
  std::map<uint32_t, Job> jobs_;
  std::set<uint32_t> used_slots_;
};

// Connections as the daemon keeps them: one that was sent an error reads nothing more.
// Leaf jobs never hear from a parent: they stay waiting, or end with their ranks.
struct NoParents final : control::Parents {
  void join(uint32_t, const sockaddr_in&, const control::JoinRequest&) override {}
  void end(uint32_t, bool) override {}
};

class RecordingOutbox final : public control::Outbox {
 public:
  void send(ConnectionId connection, const control::Message& message) override {
    if (closing_.contains(connection)) return;
    control::encode(message);  // everything the registry sends must encode
    if (auto* error = std::get_if<control::Error>(&message)) {
      errors_[connection]++;
      error_lines_.emplace_back(connection, error->message);
    }
  }
  void close_after_sending(ConnectionId connection) override { closing_.insert(connection); }
  std::string describe(ConnectionId connection) const override { return fmt::format("connection {}", connection); }

  bool closing(ConnectionId connection) const { return closing_.contains(connection); }
  uint64_t errors(ConnectionId connection) const {
    auto it = errors_.find(connection);
    return it == errors_.end() ? 0 : it->second;
  }
  const std::vector<std::pair<ConnectionId, std::string>>& error_lines() const { return error_lines_; }

 private:
  std::set<ConnectionId> closing_;
  std::map<ConnectionId, uint64_t> errors_;
  std::vector<std::pair<ConnectionId, std::string>> error_lines_;
};

in_addr peer_of(ConnectionId connection) {
  return in_addr{htonl((198u << 24) | (18u << 16) | (1u << 8) | static_cast<uint32_t>(connection))};
}

}  // namespace

ControlRun run_control(std::string_view input) {
  ControlRun run;
  std::vector<std::string>& violations = run.violations;
  RecordingEngine engine(violations);
  RecordingOutbox outbox;
  std::map<ConnectionId, uint32_t> index_of;
  try {
    control::RegistrySettings settings{wire::kDefaultDataPort, 20000, kFuzzMemoryQuota, in_addr{INADDR_BROADCAST}};
    NoParents parents;
    control::JobRegistry registry(engine, settings, outbox, parents);
    // A connection id is reused after its hang-up, like a new TCP connection.
    std::map<uint32_t, ConnectionId> live;
    ConnectionId next_id = 1;
    auto connection_of = [&](uint32_t index) {
      auto [it, fresh] = live.try_emplace(index, next_id);
      if (fresh) index_of[next_id++] = index;
      return it->second;
    };
    auto hang_up = [&](uint32_t index) {
      if (auto it = live.find(index); it != live.end()) {
        registry.on_disconnect(it->second);
        live.erase(it);
      }
    };
    while (!input.empty()) {
      size_t end = std::min(input.find('\n'), input.size());
      std::string_view line = input.substr(0, end);
      input.remove_prefix(std::min(end + 1, input.size()));
      if (line.empty()) continue;
      uint32_t index = (static_cast<uint8_t>(line[0]) & 0x7f) % kConnections;
      ConnectionId connection = connection_of(index);
      if (line.size() == 1 && (static_cast<uint8_t>(line[0]) & 0x80)) {
        hang_up(index);
        continue;
      }
      if (outbox.closing(connection)) {  // the daemon has hung up on it: it is gone
        hang_up(index);
        continue;
      }
      std::string_view text = line.substr(1);
      uint64_t errors_before = outbox.errors(connection);
      bool refused = false;
      if (text.size() > control::kMaxLineBytes) {
        refused = true;  // the daemon's line-length check; decode never sees the line
      } else {
        try {
          control::Message message = control::decode(text);
          if (auto* join = std::get_if<control::JoinRequest>(&message))
            registry.on_join(connection, peer_of(connection), *join);
          else if (std::holds_alternative<control::Leave>(message))
            registry.on_leave(connection);
          else if (auto* status = std::get_if<control::StatusRequest>(&message))
            registry.on_status(connection, *status);
          else if (auto* reshard = std::get_if<control::ReshardRequest>(&message))
            registry.on_reshard(connection, *reshard);
          else if (std::holds_alternative<control::Ping>(message))
            outbox.send(connection, control::Pong{});
          else if (std::holds_alternative<control::Error>(message))
            outbox.close_after_sending(connection);  // the peer gave up: the daemon hangs up
          else
            refused = true;  // only join, leave, status, reshard, ping and error go to the aggregator
        } catch (const control::ProtocolError&) {
          refused = true;
        }
      }
      if (refused) {
        outbox.send(connection, control::Error{"refused"});
        outbox.close_after_sending(connection);
      } else if (outbox.errors(connection) > errors_before && !outbox.closing(connection)) {
        violations.push_back(fmt::format("connection {} got an error but stays open", connection));
      }
      if (engine.memory() > kFuzzMemoryQuota)
        violations.push_back(fmt::format("jobs hold {} bytes, over the quota of {}", engine.memory(), kFuzzMemoryQuota));
      // Jobs not started yet hold a reservation but no engine memory.
      if (registry.free_memory() + engine.memory() > kFuzzMemoryQuota)
        violations.push_back(fmt::format("registry counts {} bytes free, but the engine's jobs hold {} of {}",
                                         registry.free_memory(), engine.memory(), kFuzzMemoryQuota));
    }
    while (!live.empty()) hang_up(live.begin()->first);
    if (engine.jobs() != 0)
      violations.push_back(fmt::format("{} jobs remain after every connection closed", engine.jobs()));
    if (registry.free_memory() != kFuzzMemoryQuota)
      violations.push_back(fmt::format("{} bytes still reserved after every connection closed",
                                       kFuzzMemoryQuota - registry.free_memory()));
  } catch (const std::exception& error) {
    violations.push_back(fmt::format("exception escaped the control plane: {}", error.what()));
  }
  for (const auto& [connection, text] : outbox.error_lines())
    run.errors.push_back(fmt::format("{}: {}", index_of.at(connection), text));
  return run;
}

std::vector<std::string> run_control_input(std::string_view input) { return run_control(input).violations; }

}  // namespace xagg::reliability
