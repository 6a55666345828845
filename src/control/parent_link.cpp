#include "parent_link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "admission.h"
#include "control_channel.h"
#include "inet.h"
#include "peer_liveness.h"
#include "xagg/errors.h"

namespace xagg::control {
namespace {

// How long the parent's control endpoint may take to accept the connection.
constexpr std::chrono::seconds kConnectWithin{30};
// How often the thread looks whether it must stop.
constexpr std::chrono::milliseconds kPoll{50};

}  // namespace

ParentLink::ParentLink(uint64_t id, sockaddr_in parent, JoinRequest request, std::string secret,
                       std::string interface, std::chrono::milliseconds dead_after,
                       std::function<void(ParentEvent)> post)
    : id_(id),
      parent_(parent),
      request_(std::move(request)),
      secret_(std::move(secret)),
      interface_(std::move(interface)),
      dead_after_(dead_after),
      post_(std::move(post)),
      thread_([this](std::stop_token stop) { run(stop); }) {}

ParentLink::~ParentLink() {
  thread_.request_stop();
  thread_.join();
}

void ParentLink::fail(const std::string& error) {
  post_({id_, request_.job_id, std::nullopt,
         fmt::format("job {}: parent aggregator {}: {}", request_.job_id, to_string(parent_), error)});
}

// XDP sends the shares up by XDP_TX: the next hop must be on the aggregator's
// interface, and its address known (the control connection has resolved it).
std::variant<ParentStarted, std::string> ParentLink::started(const JoinReply& joined, const Start& start,
                                                              in_addr local) const {
  try {
    const NextHop hop = next_hop_towards(parent_.sin_addr);
    if (hop.interface != interface_)
      return fmt::format("the route to it leaves by {}, not by this aggregator's interface {}", hop.interface,
                         interface_);
    const auto mac = neighbour_mac(hop);
    if (!mac) return fmt::format("next hop {} is not in the neighbour table of {}", to_string(hop.address), interface_);
    return ParentStarted{joined, start, parent_.sin_addr, local, *mac};
  } catch (const std::runtime_error& error) {
    return std::string(error.what());
  }
}

// Joins, waits for the parent's Start (the other leaves join whenever their
// ranks have), then holds the membership with heartbeats (peer_liveness.h).
void ParentLink::run(std::stop_token stop) {
  try {
    ControlChannel channel(parent_, Clock::now() + kConnectWithin);
    channel.send(request_, Clock::now() + kConnectWithin);
    std::optional<JoinReply> joined;
    std::optional<Heartbeat> heartbeat;  // from the parent's Start on
    while (!stop.stop_requested()) {
      Clock::time_point wake = Clock::now() + kPoll;
      if (heartbeat) {
        if (auto death = heartbeat->check()) return fail(*death);
        wake = std::min(wake, heartbeat->next_ping());
      }
      auto message = channel.receive(wake);
      if (!message) continue;
      if (heartbeat) heartbeat->heard();
      if (auto* challenge = std::get_if<Challenge>(&*message); challenge && request_.auth.empty()) {
        if (secret_.empty()) return fail("it requires a cluster secret and this aggregator has none (--secret-file)");
        request_.auth = join_proof(secret_, challenge->nonce, request_.job_id, request_.rank, request_.world_size);
        channel.send(request_, Clock::now() + kConnectWithin);
      } else if (auto* error = std::get_if<Error>(&*message)) {
        return fail(error->message);
      } else if (auto* reply = std::get_if<JoinReply>(&*message)) {
        joined = *reply;
      } else if (auto* start = std::get_if<Start>(&*message); start && joined && !heartbeat) {
        auto how = this->started(*joined, *start, channel.local_address());
        if (auto* error = std::get_if<std::string>(&how)) return fail(*error);
        heartbeat.emplace(channel, dead_after_);
        post_({id_, request_.job_id, std::get<ParentStarted>(std::move(how)), {}});
      }
    }
    if (leave_.load()) channel.send(Leave{}, Clock::now() + kConnectWithin);
  } catch (const std::exception& error) {
    if (!stop.stop_requested()) fail(error.what());
  }
}

}  // namespace xagg::control
