#include "competing_flow.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <stdexcept>

namespace xagg::testbed {
namespace {

// How often a blocked send or receive looks at the stop flag.
constexpr std::chrono::milliseconds kPollInterval{100};
constexpr std::chrono::seconds kConnectTimeout{5};
constexpr size_t kChunkBytes = 1 << 20;

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval value{.tv_sec = timeout.count() / 1000, .tv_usec = timeout.count() % 1000 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, sizeof value);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &value, sizeof value);
}

sockaddr_in address_of(const std::string& address, uint16_t port) {
  sockaddr_in result{.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {}, .sin_zero = {}};
  if (inet_pton(AF_INET, address.c_str(), &result.sin_addr) != 1)
    throw std::invalid_argument(fmt::format("not an IPv4 address: '{}'", address));
  return result;
}

bool transient(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

CompetingFlow::CompetingFlow(const HostLink& from, const HostLink& to, std::string label) : label_(std::move(label)) {
  auto failed = [&](const std::string& what) {
    return std::runtime_error(fmt::format("competing flow {}: {}: {}", label_, what, std::strerror(errno)));
  };
  // Port 0: the kernel picks one no system of the run listens on.
  UniqueFd listener(socket_in(to.netns, SOCK_STREAM));
  sockaddr_in local = address_of(to.address, 0);
  socklen_t length = sizeof local;
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 || listen(listener.get(), 1) != 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
    throw failed("listening on " + to.address);
  set_timeouts(listener.get(), kConnectTimeout);
  sender_.reset(socket_in(from.netns, SOCK_STREAM));
  set_timeouts(sender_.get(), kConnectTimeout);
  if (connect(sender_.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0)
    throw failed(fmt::format("connecting from {} to {}", from.netns, to.address));
  receiver_.reset(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!receiver_) throw failed("accepting");
  set_timeouts(sender_.get(), kPollInterval);
  set_timeouts(receiver_.get(), kPollInterval);
  start_ = Clock::now();
  samples_.emplace_back(start_, 0);
  receive_thread_ = std::thread([this] { receive_loop(); });
  send_thread_ = std::thread([this] { send_loop(); });
  spdlog::debug("competing flow {}: {} -> {}:{}", label_, from.netns, to.address, ntohs(local.sin_port));
}

CompetingFlow::~CompetingFlow() { stop(); }

void CompetingFlow::fail(const std::string& what) {
  std::lock_guard lock(mutex_);
  if (error_.empty()) error_ = fmt::format("{}: {}", what, std::strerror(errno));
}

void CompetingFlow::send_loop() {
  const std::vector<char> data(kChunkBytes, 'x');
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (send(sender_.get(), data.data(), data.size(), MSG_NOSIGNAL) < 0 && !transient(errno)) {
      fail("send");
      return;
    }
  }
}

void CompetingFlow::receive_loop() {
  std::vector<char> buffer(kChunkBytes);
  while (!stopping_.load(std::memory_order_relaxed)) {
    const ssize_t n = recv(receiver_.get(), buffer.data(), buffer.size(), 0);
    if (n > 0) {
      const uint64_t total = received_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed) + n;
      const Clock::time_point now = Clock::now();
      std::lock_guard lock(mutex_);
      if (now - samples_.back().first >= kSampleInterval) samples_.emplace_back(now, total);
    } else if (n == 0 || !transient(errno)) {
      if (n == 0) errno = ECONNRESET;  // the sender never closes before stop()
      fail("receive");
      return;
    }
  }
}

FlowReport CompetingFlow::stop() {
  std::unique_lock lock(mutex_);
  if (report_) return *report_;
  lock.unlock();
  stopping_ = true;
  if (send_thread_.joinable()) send_thread_.join();
  if (receive_thread_.joinable()) receive_thread_.join();
  const Clock::time_point end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start_).count();
  // A reset, not a FIN: a FIN would let the send buffer drain over the shaped link after the run.
  linger abort{.l_onoff = 1, .l_linger = 0};
  setsockopt(sender_.get(), SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
  sender_.reset();
  receiver_.reset();
  lock.lock();
  samples_.emplace_back(end, received_.load());
  report_ = FlowReport{received_.load(), seconds, error_};
  return *report_;
}

uint64_t CompetingFlow::bytes_at(Clock::time_point when) const {
  std::lock_guard lock(mutex_);
  const auto after = std::ranges::upper_bound(samples_, when, {}, &std::pair<Clock::time_point, uint64_t>::first);
  if (after == samples_.begin()) return 0;
  const auto& [time, bytes] = *std::prev(after);
  if (after == samples_.end()) return bytes;
  const double fraction = std::chrono::duration<double>(when - time) / (after->first - time);
  return bytes + static_cast<uint64_t>(fraction * double(after->second - bytes));
}

double CompetingFlow::gbit_between(Clock::time_point from, Clock::time_point to) const {
  const double seconds = std::chrono::duration<double>(to - from).count();
  return seconds > 0 ? double(bytes_at(to) - bytes_at(from)) * 8 / seconds / 1e9 : 0;
}

}  // namespace xagg::testbed
