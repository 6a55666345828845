// A leaf aggregator's membership in its parent's job (docs/design.md,
// "Hierarchy"): the leaf joins the parent's job over a control connection of
// its own, as a worker would, and holds it with heartbeats for the job's life.
// Each link runs on a thread of its own, so that the daemon's event loop never
// blocks on the parent; what happens comes back through `post`.
#pragma once

#include <netinet/in.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "control_messages.h"

namespace xagg::control {

// The parent's job has started: how this leaf takes part in it.
struct ParentStarted {
  JoinReply joined;
  Start start;
  in_addr parent{};  // the parent's address
  in_addr local{};   // this leaf's address on the connection: where the parent expects its DATA from
  std::array<uint8_t, 6> next_hop_mac{};  // of the parent, or of the router before it
};

struct ParentEvent {
  uint64_t link = 0;  // ParentLink::id()
  uint32_t job_id = 0;
  std::optional<ParentStarted> started;  // otherwise the link failed with `error`
  std::string error;
};

class ParentLink {
 public:
  // Joins `request` at the parent's control endpoint; the parent's Start, or
  // the failure, is posted. After its Start, a parent that closes the
  // connection or is silent for dead_after beyond what TCP's loss repair
  // excuses (peer_liveness.h) is posted as a failure. `interface`
  // is the aggregator's: the parent must be reachable through it.
  ParentLink(uint64_t id, sockaddr_in parent, JoinRequest request, std::string secret, std::string interface,
             std::chrono::milliseconds dead_after, std::function<void(ParentEvent)> post);
  // Leaves the parent's job when `leave_first` was asked for, else just
  // closes the connection (the parent then aborts its job for every leaf).
  ~ParentLink();
  ParentLink(const ParentLink&) = delete;
  ParentLink& operator=(const ParentLink&) = delete;

  uint64_t id() const { return id_; }
  // The leaf's job completed: leave the parent's job before closing.
  void leave_first() { leave_.store(true); }

 private:
  void run(std::stop_token stop);
  void fail(const std::string& error);
  // The parent's Start came: what the leaf needs to send it shares, or the reason it cannot.
  std::variant<ParentStarted, std::string> started(const JoinReply& joined, const Start& start,
                                                   in_addr local) const;

  uint64_t id_;
  sockaddr_in parent_;
  JoinRequest request_;
  std::string secret_;
  std::string interface_;
  std::chrono::milliseconds dead_after_;
  std::function<void(ParentEvent)> post_;
  std::atomic<bool> leave_{false};
  std::jthread thread_;  // last: starts once the rest is set
};

}  // namespace xagg::control
