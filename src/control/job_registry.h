// Jobs of the aggregator daemon: who joined which job, when it starts, when
// it ends. Independent of sockets: replies go through an Outbox.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "control_messages.h"
#include "engine.h"
#include "inet.h"
#include "metrics.h"
#include "parent_link.h"
#include "wire.h"

namespace xagg::control {

using ConnectionId = uint64_t;

// Where the registry's messages go; the daemon implements it with sockets.
class Outbox {
 public:
  virtual void send(ConnectionId connection, const Message& message) = 0;
  // Closes the connection once everything sent to it is out.
  virtual void close_after_sending(ConnectionId connection) = 0;
  // "connection N from ADDRESS", for log lines: every warning names its peer.
  virtual std::string describe(ConnectionId connection) const = 0;

 protected:
  ~Outbox() = default;
};

// Where the registry's leaf jobs join their parents' jobs; the daemon
// implements it with ParentLinks and answers with on_parent_started or
// on_parent_failed.
class Parents {
 public:
  virtual void join(uint32_t job_id, const sockaddr_in& parent, const JoinRequest& request) = 0;
  // The leaf job ended: leave the parent's job (completed) or just close the
  // connection (aborted: the parent aborts the job for every leaf).
  virtual void end(uint32_t job_id, bool completed) = 0;

 protected:
  ~Parents() = default;
};

struct RegistrySettings {
  uint16_t data_port = 0;
  uint16_t result_port_base = 0;  // a job's result port is this plus its slot
  uint64_t memory_quota = 0;      // bytes of aggregation cells over all jobs
  in_addr broadcast{};            // where RESULT broadcasts go
  uint32_t interface_mtu = UINT16_MAX;  // of the interface DATA arrives on: caps every job's packets
  // How RESULTs reach the ranks (docs/protocol.md section 2); nullopt (auto):
  // broadcast when every rank of the job is on `subnet`, else unicast.
  std::optional<wire::ResultMode> results;
  InterfaceAddress subnet{};  // the aggregator interface's address and netmask
  // Multicast: job slot s sends to this group plus s (validated by the daemon).
  std::optional<in_addr> multicast_base;
  std::array<uint8_t, 6> interface_mac{};  // a leaf's relayed RESULTs come from it
  uint16_t control_port = 0;  // a parent named without a port listens on this one too
};

// Joins one address may hold in jobs that have not started yet: a host runs a
// rank of every process group of its training run, but cannot tie up every
// job slot and the memory quota with joins that never complete.
inline constexpr uint32_t kMaxPendingJoinsPerSource = 32;

class JobRegistry {
 public:
  JobRegistry(Engine& engine, const RegistrySettings& settings, Outbox& outbox, Parents& parents);
  ~JobRegistry();  // removes every job from the engine
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  void on_join(ConnectionId connection, in_addr peer, const JoinRequest& request);
  void on_leave(ConnectionId connection);
  // Answers which ranks have not contributed to the listed chunks of the
  // iteration; only a member of a job may ask, about its own job.
  void on_status(ConnectionId connection, const StatusRequest& request);
  // Places a started sharded job on the surviving aggregators once every rank
  // asked for the same epoch and placement (docs/protocol.md section 8).
  void on_reshard(ConnectionId connection, const ReshardRequest& request);
  // The connection is gone: a member that had not left has crashed.
  void on_disconnect(ConnectionId connection);
  // A leaf job's parent started its job: the leaf job starts on its layout.
  void on_parent_started(uint32_t job_id, const ParentStarted& started);
  // A leaf job's parent refused it, died or aborted its job: so does the leaf job.
  void on_parent_failed(uint32_t job_id, const std::string& reason);

  uint64_t free_memory() const { return settings_.memory_quota - used_memory_; }
  // Whether the connection joined a job that is still registered.
  bool has_joined(ConnectionId connection) const { return memberships_.contains(connection); }
  // Its part of /metrics: jobs, ranks, memory, joins and job ends, and the
  // final packet counters of the jobs that ended.
  void fill_metrics(MetricsState& state) const;

 private:
  struct Member {
    ConnectionId connection = 0;
    in_addr peer{};  // where its DATA must come from
    bool left = false;
  };
  struct Job {
    uint32_t world_size = 0;
    uint64_t elements = 0;
    uint32_t chunks = 0;
    uint64_t token = 0;
    uint16_t result_port = 0;
    uint64_t memory = 0;
    uint32_t shard = 0;             // this aggregator's place in a sharded job's list
    std::vector<uint32_t> weights;  // of every aggregator of the job; empty: one aggregator
    uint32_t mtu = 0;               // the smallest of the ranks' path MTUs and the interface's
    std::map<uint32_t, Member> members;  // by rank
    bool started = false;  // every rank joined and the engine holds the job
    uint32_t epoch = 0;    // of the placement applied: dead aggregators of the ranks' list
    std::map<uint32_t, ReshardRequest> reshard_requests = {};  // by rank: asked beyond `epoch`, not applied yet
    std::optional<ParentJob> parent = {};  // a leaf job: the parent whose job it is a member of
    std::optional<dataplane::UplinkSpec> uplink = {};  // once the parent's job started
    uint16_t listen_port = 0;  // nonzero: its members (leaf aggregators) send from and receive on it
    uint32_t wire_bits = wire::kWideBits;  // docs/protocol.md section 11
    std::optional<uint32_t> requested_sum_shift = {};  // as its joins give it
    uint32_t chunk_elements() const { return wire::chunk_elements_for(mtu, wire_bits); }
    uint32_t sum_shift() const;  // the one its engine applies
  };
  struct Membership {
    uint32_t job_id = 0;
    uint32_t rank = 0;
  };

  enum class JobEnd { Completed, Aborted };

  void refuse(ConnectionId connection, const std::string& reason);
  struct Refusal {
    JoinRefusal reason;
    std::string text;
  };
  void refuse_join(ConnectionId connection, JoinRefusal reason, const std::string& text);
  void refuse_join(ConnectionId connection, const Refusal& refusal) { refuse_join(connection, refusal.reason, refusal.text); }
  Job* create_job(ConnectionId connection, const JoinRequest& request);
  // Why the request cannot join the existing job; nullopt when it can.
  static std::optional<std::string> mismatch(const Job& job, const JoinRequest& request);
  static uint32_t chunks_held(const Job& job, uint32_t mtu);
  // Sizes the job's cells for `mtu`, reserving the memory; the reason when it cannot.
  std::optional<Refusal> size_job(uint32_t job_id, Job& job, uint32_t mtu);
  // The UDP port its members send from and receive RESULTs on.
  static uint16_t member_port(const Job& job) { return job.listen_port != 0 ? job.listen_port : job.result_port; }
  void start_job(uint32_t job_id, Job& job);
  // Gives the job to the engine; false (after sending every rank the error
  // and removing the job) when the engine cannot hold it.
  bool set_up_in_engine(uint32_t job_id, Job& job);
  void apply_reshard(uint32_t job_id, Job& job, const ReshardRequest& request);
  // Sends every member `reason` and removes the job.
  void abort_job(uint32_t job_id, const std::string& reason);
  // The job's result mode and, for broadcast or multicast, where its RESULTs go.
  std::pair<wire::ResultMode, in_addr> results_of(const Job& job) const;
  uint32_t pending_joins_from(in_addr peer) const;
  // The lowest slot (result port offset) no job holds.
  std::optional<uint32_t> free_port_slot() const;
  void remove_job(uint32_t job_id, JobEnd end);
  // The job's packet counters, also logged, before its slot and they go.
  dataplane::CounterRow final_counters_of(uint32_t job_id) const;
  // Adds them to the ended jobs' totals (the job, or its cells of an earlier epoch, end).
  void record_final_counters(uint32_t job_id);

  Engine& engine_;
  RegistrySettings settings_;
  Outbox& outbox_;
  Parents& parents_;
  std::map<uint32_t, Job> jobs_;                       // by job id
  std::map<ConnectionId, Membership> memberships_;  // connections that joined a live job
  uint64_t used_memory_ = 0;
  ControlCounters counters_;  // its fields that the registry counts
  dataplane::CounterRow ended_jobs_packets_{};
};

}  // namespace xagg::control
