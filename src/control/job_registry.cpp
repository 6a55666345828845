#include "job_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "inet.h"
#include "shard_placement.h"
#include "wire.h"

namespace xagg::control {
namespace {

uint64_t random_token() {
  uint64_t token = 0;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) throw std::runtime_error("getrandom failed");
  return token;
}

}  // namespace

JobRegistry::JobRegistry(Engine& engine, const RegistrySettings& settings, Outbox& outbox, Parents& parents)
    : engine_(engine), settings_(settings), outbox_(outbox), parents_(parents) {}

JobRegistry::~JobRegistry() {
  for (const auto& [job_id, job] : jobs_)
    if (job.started) engine_.remove_job(job_id);
}

void JobRegistry::refuse(ConnectionId connection, const std::string& reason) {
  spdlog::warn("refusing {}: {}", outbox_.describe(connection), reason);
  outbox_.send(connection, Error{reason});
  outbox_.close_after_sending(connection);
}

void JobRegistry::refuse_join(ConnectionId connection, JoinRefusal reason, const std::string& text) {
  ++counters_.joins_refused[static_cast<size_t>(reason)];
  refuse(connection, text);
}

void JobRegistry::fill_metrics(MetricsState& state) const {
  state.jobs = jobs_.size();
  state.ranks = memberships_.size();
  state.memory_used_bytes = used_memory_;
  state.memory_quota_bytes = settings_.memory_quota;
  state.control.joins_accepted = counters_.joins_accepted;
  for (size_t reason = 0; reason < kJoinRefusalCount; ++reason)
    if (reason != static_cast<size_t>(JoinRefusal::Unauthenticated))  // the daemon counts those
      state.control.joins_refused[reason] = counters_.joins_refused[reason];
  state.control.jobs_created = counters_.jobs_created;
  state.control.jobs_completed = counters_.jobs_completed;
  state.control.jobs_aborted = counters_.jobs_aborted;
  state.ended_jobs_packets = ended_jobs_packets_;
}

uint32_t JobRegistry::Job::sum_shift() const {
  return requested_sum_shift.value_or(static_cast<uint32_t>(std::bit_width(world_size - 1)));
}

// The chunks this aggregator holds for the job when its packets fit `mtu`
// (docs/protocol.md sections 1 and 6).
uint32_t JobRegistry::chunks_held(const Job& job, uint32_t mtu) {
  const uint32_t job_chunks = wire::layout_for(job.elements, wire::chunk_elements_for(mtu, job.wire_bits)).total();
  if (job.weights.empty()) return job_chunks;
  return ShardPlacement(job.weights, job_chunks).shard_chunks(job.shard);
}

std::optional<JobRegistry::Refusal> JobRegistry::size_job(uint32_t job_id, Job& job, uint32_t mtu) {
  const uint32_t chunks = chunks_held(job, mtu);
  if (chunks == 0)
    return Refusal{JoinRefusal::Invalid,
                   fmt::format("job {}: this aggregator, {} of {} with weights [{}], would hold none of the job's "
                               "chunks: raise the job's elements or this aggregator's weight",
                               job_id, job.shard, job.weights.size(), fmt::join(job.weights, ","))};
  // The engine creates the cells only at start, for the MTU final by then.
  const uint64_t memory = wire::cell_bytes(chunks, wire::chunk_elements_for(mtu, job.wire_bits));
  if (memory > job.memory + free_memory())
    return Refusal{JoinRefusal::Memory,
                   fmt::format("job {} needs {} bytes of aggregator memory ({} chunks of {} elements for MTU {}) but "
                               "only {} of {} are free",
                               job_id, memory, chunks, wire::chunk_elements_for(mtu, job.wire_bits), mtu,
                               job.memory + free_memory(), settings_.memory_quota)};
  used_memory_ += memory - job.memory;
  job.memory = memory;
  job.chunks = chunks;
  job.mtu = mtu;
  return std::nullopt;
}

JobRegistry::Job* JobRegistry::create_job(ConnectionId connection, const JoinRequest& request) {
  if (request.elements == 0) {
    refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: elements must be at least 1", request.job_id));
    return nullptr;
  }
  // Chunk indexes are 32-bit, for the smallest chunks a later rank may bring.
  const uint64_t max_elements = wire::max_layout_elements(wire::kMinChunkElems);
  if (request.elements > max_elements) {
    refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: {} elements exceed the largest job ({})", request.job_id,
                                        request.elements, max_elements));
    return nullptr;
  }
  std::optional<uint32_t> slot = free_port_slot();
  if (!slot) {
    refuse_join(connection, JoinRefusal::Capacity, fmt::format("job {}: all {} job slots are in use", request.job_id, XAGG_MAX_JOBS));
    return nullptr;
  }
  Job job{request.world_size, request.elements, 0, random_token(),
          static_cast<uint16_t>(settings_.result_port_base + *slot), 0, request.shard, request.weights,
          0, {}};
  job.parent = request.parent;
  job.listen_port = request.listen_port;
  job.wire_bits = request.wire_bits;
  job.requested_sum_shift = request.sum_shift;
  if (auto refused = size_job(request.job_id, job, std::min(request.mtu, settings_.interface_mtu))) {
    refuse_join(connection, *refused);
    return nullptr;
  }
  ++counters_.jobs_created;
  spdlog::info("job {} created: {} ranks, {} elements, {} chunks, {} bytes reserved, result port {}", request.job_id,
               job.world_size, job.elements, job.chunks, job.memory, job.result_port);
  return &jobs_.emplace(request.job_id, std::move(job)).first->second;
}

void JobRegistry::on_join(ConnectionId connection, in_addr peer, const JoinRequest& request) {
  if (memberships_.contains(connection)) return refuse_join(connection, JoinRefusal::Mismatch, "this connection has joined a job already");
  if (request.world_size == 0 || request.world_size > XAGG_MAX_WORKERS)
    return refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: world_size {} is not in 1..{}", request.job_id,
                                          request.world_size, XAGG_MAX_WORKERS));
  if (request.rank >= request.world_size)
    return refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: rank {} is not below world_size {}", request.job_id, request.rank,
                                          request.world_size));
  if (request.sum_shift && *request.sum_shift < static_cast<uint32_t>(std::bit_width(request.world_size - 1)))
    return refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: sum_shift {} is below ceil(log2 {}) = {}: a 16-bit sum of {} "
                                               "ranks would not fit 16 bits (docs/protocol.md section 11)",
                                               request.job_id, *request.sum_shift, request.world_size,
                                               std::bit_width(request.world_size - 1), request.world_size));
  if (request.mtu < wire::kMinLinkMtu)
    return refuse_join(connection, JoinRefusal::Mtu, fmt::format("job {}: rank {} has a path MTU of {}, below the {} XAgg needs",
                                               request.job_id, request.rank, request.mtu, wire::kMinLinkMtu));
  if (settings_.results == wire::ResultMode::Broadcast && !settings_.subnet.on_subnet(peer))
    return refuse_join(connection, JoinRefusal::Subnet,
                       fmt::format("job {}: rank {} joins from {}, off this aggregator's subnet ({}, mask {}): RESULTs "
                                   "broadcast to {} cannot reach it; run the aggregator with --results unicast, "
                                   "multicast or auto (docs/protocol.md section 2)",
                                   request.job_id, request.rank, to_string(peer), to_string(settings_.subnet.address),
                                   to_string(settings_.subnet.netmask), to_string(settings_.broadcast)));
  if (request.parent && !parse_endpoint(request.parent->aggregator, settings_.control_port))
    return refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: parent aggregator '{}' is not an IPv4 address with an "
                                               "optional :port",
                                               request.job_id, request.parent->aggregator));
  if (request.parent && !request.weights.empty())
    return refuse_join(connection, JoinRefusal::Invalid, fmt::format("job {}: a leaf of a two-level job runs on one aggregator, not {} "
                                               "(docs/design.md, \"Hierarchy\")",
                                               request.job_id, request.weights.size()));
  if (pending_joins_from(peer) >= kMaxPendingJoinsPerSource)
    return refuse_join(connection, JoinRefusal::Capacity, fmt::format("job {}: {} already holds {} joins of jobs that have not started",
                                               request.job_id, to_string(peer), kMaxPendingJoinsPerSource));
  Job* job = nullptr;
  if (auto it = jobs_.find(request.job_id); it != jobs_.end()) {
    job = &it->second;
    if (auto refused = mismatch(*job, request)) return refuse_join(connection, JoinRefusal::Mismatch, *refused);
    if (job->members.contains(request.rank))
      return refuse_join(connection, JoinRefusal::Mismatch, fmt::format("job {}: rank {} has joined already", request.job_id, request.rank));
    // The job's packets fit the smallest path MTU of all its ranks.
    if (request.mtu < job->mtu)
      if (auto refused = size_job(request.job_id, *job, request.mtu)) return refuse_join(connection, *refused);
  } else if (job = create_job(connection, request); !job) {
    return;
  }

  job->members[request.rank] = Member{connection, peer, false};
  memberships_[connection] = {request.job_id, request.rank};
  ++counters_.joins_accepted;
  spdlog::info("job {}: rank {} joined from {} ({}/{})", request.job_id, request.rank, to_string(peer),
               job->members.size(), job->world_size);
  outbox_.send(connection,
               JoinReply{job->token, settings_.data_port, member_port(*job), to_string(settings_.broadcast)});
  if (job->members.size() == job->world_size) start_job(request.job_id, *job);
}

std::optional<std::string> JobRegistry::mismatch(const Job& job, const JoinRequest& request) {
  if (job.world_size != request.world_size)
    return fmt::format("job {}: world_size {} differs from the job's {}", request.job_id, request.world_size,
                       job.world_size);
  if (job.elements != request.elements)
    return fmt::format("job {}: elements {} differs from the job's {}", request.job_id, request.elements,
                       job.elements);
  // Ranks that list the aggregators in another order or with other weights
  // would add different chunks of the job in one cell.
  if (request.shard != job.shard || request.weights != job.weights)
    return fmt::format("job {}: rank {} places this aggregator at {} of {} with weights [{}], the job's first rank at "
                       "{} of {} with weights [{}]: every rank must list the same aggregators in the same order with "
                       "the same weights",
                       request.job_id, request.rank, request.shard, request.weights.size(),
                       fmt::join(request.weights, ","), job.shard, job.weights.size(), fmt::join(job.weights, ","));
  auto describe = [](const std::optional<ParentJob>& parent) {
    return parent ? fmt::format("leaf {} of {} under parent {}", parent->leaf, parent->leaves, parent->aggregator)
                  : std::string("no parent");
  };
  if (request.parent != job.parent)
    return fmt::format("job {}: rank {} names {}, the job's first rank {}: every rank of a leaf must name the same",
                       request.job_id, request.rank, describe(request.parent), describe(job.parent));
  if (request.wire_bits != job.wire_bits || request.sum_shift != job.requested_sum_shift)
    return fmt::format("job {}: rank {} joins with wire_bits {} and sum_shift {}, the job's first rank with {} and {}: "
                       "every rank must give the same (docs/protocol.md section 11)",
                       request.job_id, request.rank, request.wire_bits,
                       request.sum_shift ? std::to_string(*request.sum_shift) : "absent", job.wire_bits,
                       job.requested_sum_shift ? std::to_string(*job.requested_sum_shift) : "absent");
  if (request.listen_port != job.listen_port)
    return fmt::format("job {}: rank {} listens on port {}, the job's first rank on {} (0: the job's result port)",
                       request.job_id, request.rank, request.listen_port, job.listen_port);
  return std::nullopt;
}

std::pair<wire::ResultMode, in_addr> JobRegistry::results_of(const Job& job) const {
  const bool one_segment = std::ranges::all_of(
      job.members, [&](const auto& entry) { return settings_.subnet.on_subnet(entry.second.peer); });
  // A job of leaf aggregators (protocol.md section 9) goes to those few hosts
  // only: a broadcast would reach every host of the segment.
  const bool to_aggregators = job.listen_port != 0;
  const wire::ResultMode mode = settings_.results.value_or(one_segment && !to_aggregators ? wire::ResultMode::Broadcast
                                                                                          : wire::ResultMode::Unicast);
  switch (mode) {
    case wire::ResultMode::Broadcast: return {mode, settings_.broadcast};
    case wire::ResultMode::Multicast: {
      const uint32_t slot = job.result_port - settings_.result_port_base;
      return {mode, in_addr{htonl(ntohl(settings_.multicast_base->s_addr) + slot)}};
    }
    case wire::ResultMode::Unicast: break;
  }
  return {mode, in_addr{}};
}

// The engine gets the job only now: a job whose ranks never all join (a
// crashed launch, or a flood of abandoned joins) costs no kernel memory and
// no map updates, so it cannot slow the joins of real jobs.
void JobRegistry::start_job(uint32_t job_id, Job& job) {
  if (job.parent && !job.uplink) {  // a leaf starts once its parent's job has (on_parent_started)
    const ParentJob& parent = *job.parent;
    spdlog::info("job {}: all {} ranks joined; joining parent aggregator {} as leaf {} of {}", job_id, job.world_size,
                 parent.aggregator, parent.leaf, parent.leaves);
    JoinRequest request{job_id, parent.leaf, parent.leaves, job.elements, job.mtu};
    request.listen_port = settings_.data_port;
    request.wire_bits = job.wire_bits;
    parents_.join(job_id, *parse_endpoint(parent.aggregator, settings_.control_port), request);
    return;
  }
  if (!set_up_in_engine(job_id, job)) return;
  const uint32_t chunk_elements = job.chunk_elements();
  const auto [results, result_ip] = results_of(job);
  const Start start{job.mtu, chunk_elements, job.chunks, results,
                    results == wire::ResultMode::Multicast ? to_string(result_ip) : std::string{}, job.wire_bits};
  spdlog::info("job {}: all {} ranks joined, starting: MTU {}, {} chunks of {} elements, {} bytes reserved in cells "
               "of {}, results by {}{}",
               job_id, job.world_size, start.mtu, start.chunks, start.chunk_elements, job.memory,
               wire::cell_capacity(wire::cell_class_for(chunk_elements)), wire::to_string(results),
               results == wire::ResultMode::Unicast ? "" : fmt::format(" to {}", to_string(result_ip)));
  for (const auto& [rank, member] : job.members) outbox_.send(member.connection, start);
}

bool JobRegistry::set_up_in_engine(uint32_t job_id, Job& job) {
  const auto [results, result_ip] = results_of(job);
  dataplane::JobSpec spec{job_id,           job.token, job.world_size,         job.chunks, result_ip,
                          member_port(job), {},        job.chunk_elements(), results,    job.uplink,
                          job.sum_shift()};
  for (const auto& [rank, member] : job.members) spec.workers.push_back({rank, member.peer, member_port(job)});
  try {
    engine_.add_job(spec);
  } catch (const std::exception& error) {
    abort_job(job_id, fmt::format("job {}: the aggregator could not set it up: {}", job_id, error.what()));
    return false;
  }
  job.started = true;
  return true;
}

void JobRegistry::abort_job(uint32_t job_id, const std::string& reason) {
  spdlog::warn("{}", reason);
  for (const auto& [rank, member] : jobs_.at(job_id).members) {
    if (member.connection == 0) continue;
    outbox_.send(member.connection, Error{reason});
    outbox_.close_after_sending(member.connection);
  }
  remove_job(job_id, JobEnd::Aborted);
}

void JobRegistry::on_reshard(ConnectionId connection, const ReshardRequest& request) {
  auto membership = memberships_.find(connection);
  if (membership == memberships_.end()) return refuse(connection, "reshard without a job joined");
  auto [job_id, rank] = membership->second;
  Job& job = jobs_.at(job_id);
  if (!job.started) return refuse(connection, fmt::format("job {}: reshard before the job started", job_id));
  if (job.weights.empty())
    return refuse(connection, fmt::format("job {}: reshard of a job on one aggregator", job_id));
  if (request.epoch <= job.epoch)
    return refuse(connection, fmt::format("job {}: rank {} asks for epoch {}, but the job is at epoch {}", job_id,
                                          rank, request.epoch, job.epoch));
  // A rank that has not seen the failure (a link cut on another rank's
  // path) learns it from the first request of its kind and asks alike.
  const bool first_of_its_kind = std::ranges::none_of(
      job.reshard_requests, [&](const auto& entry) { return entry.second == request; });
  job.reshard_requests[rank] = request;
  spdlog::info("job {}: rank {} asks for epoch {} without aggregators [{}], this one at {} of {} ({}/{} ranks)",
               job_id, rank, request.epoch, fmt::join(request.dead, ","), request.shard, request.weights.size(),
               job.reshard_requests.size(), job.world_size);
  if (first_of_its_kind)
    for (const auto& [other_rank, member] : job.members)
      if (other_rank != rank) outbox_.send(member.connection, request);
  if (job.reshard_requests.size() == job.world_size &&
      std::ranges::all_of(job.reshard_requests, [&](const auto& entry) { return entry.second == request; }))
    apply_reshard(job_id, job, request);
}

// New cells under a new token: no packet of the earlier epoch can reach them,
// and every rank sends again what it has no result for.
void JobRegistry::apply_reshard(uint32_t job_id, Job& job, const ReshardRequest& request) {
  record_final_counters(job_id);
  engine_.remove_job(job_id);
  job.started = false;
  job.shard = request.shard;
  job.weights = request.weights;
  const uint32_t chunks = chunks_held(job, job.mtu);
  const uint64_t memory = wire::cell_bytes(chunks, job.chunk_elements());
  if (chunks == 0)
    return abort_job(job_id, fmt::format("job {}: at epoch {} this aggregator ({} of {}) would hold none of the "
                                         "job's chunks",
                                         job_id, request.epoch, request.shard, request.weights.size()));
  if (memory > job.memory + free_memory())
    return abort_job(job_id, fmt::format("job {}: epoch {} needs {} bytes of aggregator memory here but only {} of "
                                         "{} are free",
                                         job_id, request.epoch, memory, job.memory + free_memory(),
                                         settings_.memory_quota));
  used_memory_ += memory - job.memory;
  job.memory = memory;
  job.chunks = chunks;
  job.token = random_token();
  if (!set_up_in_engine(job_id, job)) return;
  job.epoch = request.epoch;
  job.reshard_requests.clear();
  spdlog::info("job {}: epoch {}: without aggregators [{}], this one holds {} chunks at {} of {}", job_id, job.epoch,
               fmt::join(request.dead, ","), job.chunks, job.shard, job.weights.size());
  for (const auto& [rank, member] : job.members) outbox_.send(member.connection, Resharded{job.epoch, job.token, job.chunks});
}

uint32_t JobRegistry::pending_joins_from(in_addr peer) const {
  uint32_t pending = 0;
  for (const auto& [job_id, job] : jobs_)
    if (!job.started)
      for (const auto& [rank, member] : job.members) pending += member.peer.s_addr == peer.s_addr;
  return pending;
}

std::optional<uint32_t> JobRegistry::free_port_slot() const {
  std::vector<bool> used(XAGG_MAX_JOBS);
  for (const auto& [job_id, job] : jobs_) used[job.result_port - settings_.result_port_base] = true;
  auto free = std::ranges::find(used, false);
  if (free == used.end()) return std::nullopt;
  return static_cast<uint32_t>(free - used.begin());
}

void JobRegistry::on_leave(ConnectionId connection) {
  auto membership = memberships_.find(connection);
  if (membership == memberships_.end()) return refuse(connection, "leave without a job joined");
  auto [job_id, rank] = membership->second;
  Job& job = jobs_.at(job_id);
  job.members.at(rank).left = true;
  spdlog::info("job {}: rank {} left", job_id, rank);
  bool all_left = job.members.size() == job.world_size &&
                  std::ranges::all_of(job.members, [](const auto& entry) { return entry.second.left; });
  if (all_left) {
    spdlog::info("job {}: every rank left, releasing it", job_id);
    remove_job(job_id, JobEnd::Completed);
  }
}

void JobRegistry::on_status(ConnectionId connection, const StatusRequest& request) {
  auto membership = memberships_.find(connection);
  if (membership == memberships_.end()) return refuse(connection, "status without a job joined");
  uint32_t job_id = membership->second.job_id;
  const Job& job = jobs_.at(job_id);
  const uint64_t all_ranks = wire::all_ranks_mask(job.world_size);
  uint64_t missing = 0;
  std::optional<SizeConflict> size_conflict;
  // No chunks: the question is who has not joined yet (docs/protocol.md section 2).
  if (request.chunks.empty())
    for (uint32_t rank = 0; rank < job.world_size; ++rank)
      if (!job.members.contains(rank)) missing |= uint64_t{1} << rank;
  for (uint32_t chunk : request.chunks) {
    if (chunk >= job.chunks)
      return refuse(connection, fmt::format("job {}: status of chunk {}, but the job has {} chunks", job_id, chunk,
                                            job.chunks));
    if (!job.started) {  // no share can have arrived before start
      missing |= all_ranks;
      continue;
    }
    dataplane::CellState cell;
    try {
      cell = engine_.cell_state(job_id, chunk, request.iteration);
    } catch (const std::exception& error) {
      // A cell the data plane keeps locked for long, under load: the answer
      // says nobody contributed rather than ending the asker's job.
      spdlog::debug("job {}: chunk {} unreadable ({}); answering that no rank contributed", job_id, chunk,
                    error.what());
      missing |= all_ranks;
      continue;
    }
    // Serial arithmetic as in docs/protocol.md 3.3; a newer tag means every rank finished this iteration.
    auto age = static_cast<int32_t>(request.iteration - cell.iteration_tag);
    if (!cell.started || age > 0)
      missing |= all_ranks;
    else if (age == 0)
      missing |= all_ranks & ~cell.arrived;
    if (age == 0 && cell.conflict_total != 0 && !size_conflict)
      size_conflict = SizeConflict{cell.total, cell.conflict_rank, cell.conflict_total};
  }
  StatusReply reply{request.iteration, {}, size_conflict};
  for (uint32_t rank = 0; rank < job.world_size; ++rank)
    if (missing & (uint64_t{1} << rank)) reply.missing_ranks.push_back(rank);
  outbox_.send(connection, reply);
}

void JobRegistry::on_disconnect(ConnectionId connection) {
  auto membership = memberships_.find(connection);
  if (membership == memberships_.end()) return;
  auto [job_id, rank] = membership->second;
  Job& job = jobs_.at(job_id);
  if (job.members.at(rank).left) {
    job.members.at(rank).connection = 0;
    memberships_.erase(membership);
    // Every member that joined has left and gone while others never came: nobody can finish the job.
    if (std::ranges::none_of(job.members, [](const auto& entry) { return entry.second.connection != 0; }))
      remove_job(job_id, JobEnd::Aborted);
    return;
  }
  spdlog::warn("job {}: rank {} disconnected ({}); aborting the job", job_id, rank, outbox_.describe(connection));
  memberships_.erase(membership);
  job.members.at(rank).connection = 0;
  abort_job(job_id, fmt::format("job {}: rank {} disconnected", job_id, rank));
}

void JobRegistry::on_parent_started(uint32_t job_id, const ParentStarted& started) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.parent || it->second.uplink) return;
  Job& job = it->second;
  const std::string parent = job.parent->aggregator;
  if (started.joined.result_port != settings_.data_port)
    return abort_job(job_id, fmt::format("job {}: parent aggregator {} would send RESULTs to port {}, not to this "
                                         "leaf's data port {}: it does not take leaf aggregators",
                                         job_id, parent, started.joined.result_port, settings_.data_port));
  // The whole job's packets fit the smallest MTU of all leaves.
  if (started.start.mtu != job.mtu)
    if (auto refused = size_job(job_id, job, started.start.mtu)) return abort_job(job_id, refused->text);
  if (started.start.wire_bits != job.wire_bits)
    return abort_job(job_id, fmt::format("job {}: parent aggregator {} started its job with wire_bits {}, this leaf's "
                                         "ranks joined with {}",
                                         job_id, parent, started.start.wire_bits, job.wire_bits));
  if (started.start.chunk_elements != job.chunk_elements() || started.start.chunks < job.chunks)
    return abort_job(job_id, fmt::format("job {}: parent aggregator {} holds {} chunks of {} elements for MTU {}, "
                                         "this leaf {} of {}",
                                         job_id, parent, started.start.chunks, started.start.chunk_elements,
                                         job.mtu, job.chunks, job.chunk_elements()));
  job.uplink = dataplane::UplinkSpec{.parent_ip = started.parent,
                                     .parent_port = started.joined.data_port,
                                     .parent_job_id = job_id,
                                     .parent_token = started.joined.token,
                                     .parent_rank = job.parent->leaf,
                                     .local_ip = started.local,
                                     .local_mac = settings_.interface_mac,
                                     .next_hop_mac = started.next_hop_mac};
  start_job(job_id, job);
}

void JobRegistry::on_parent_failed(uint32_t job_id, const std::string& reason) {
  if (jobs_.contains(job_id)) abort_job(job_id, reason);
}

void JobRegistry::remove_job(uint32_t job_id, JobEnd end) {
  Job& job = jobs_.at(job_id);
  if (job.parent) parents_.end(job_id, end == JobEnd::Completed);
  for (const auto& [rank, member] : job.members) memberships_.erase(member.connection);
  if (job.started) {
    record_final_counters(job_id);
    engine_.remove_job(job_id);
  }
  ++(end == JobEnd::Completed ? counters_.jobs_completed : counters_.jobs_aborted);
  used_memory_ -= job.memory;
  jobs_.erase(job_id);
}

void JobRegistry::record_final_counters(uint32_t job_id) {
  const dataplane::CounterRow final_counters = final_counters_of(job_id);
  for (size_t counter = 0; counter < final_counters.size(); ++counter)
    ended_jobs_packets_[counter] += final_counters[counter];
}

dataplane::CounterRow JobRegistry::final_counters_of(uint32_t job_id) const {
  // The job's counters go with its slot: record them while they still exist.
  for (const auto& job : engine_.counters().jobs) {
    if (job.job_id != job_id) continue;
    std::string summary;
    for (int counter = 0; counter < XAGG_CNT_COUNT; ++counter)
      if (job.counters[counter] != 0)
        summary += fmt::format(" {}={}", dataplane::counter_name(static_cast<xagg_counter>(counter)),
                               job.counters[counter]);
    spdlog::info("job {} counters:{}", job_id, summary.empty() ? " none" : summary);
    return job.counters;
  }
  return {};
}

}  // namespace xagg::control
