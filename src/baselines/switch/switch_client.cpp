#include "switch_client.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "control_channel.h"
#include "switch_aggregator.h"
#include "unique_fd.h"
#include "wire.h"
#include "xagg/quantize.h"
#include "xagg_switch_wire.h"

namespace xagg::baselines::switchml {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSocketBufferBytes = 8 << 20;

sockaddr_in ipv4(const std::string& address, uint16_t port) {
  sockaddr_in result{};
  result.sin_family = AF_INET;
  result.sin_port = htons(port);
  if (inet_pton(AF_INET, address.c_str(), &result.sin_addr) != 1)
    throw ConfigError(fmt::format("switch aggregator address '{}' is not IPv4", address));
  return result;
}

template <typename T>
T expect(ControlChannel& channel, Clock::time_point deadline, const char* what) {
  std::optional<control::Message> message = channel.receive(deadline);
  if (!message) throw TimeoutError(fmt::format("switch aggregator: no {} before the deadline", what));
  if (const auto* error = std::get_if<control::Error>(&*message))
    throw CommError("switch aggregator: " + error->message);
  if (const auto* expected = std::get_if<T>(&*message)) return *expected;
  throw CommError(fmt::format("switch aggregator: expected {}", what));
}

// One packet in flight in a slot: kept as SwitchML's shadow copy until its result arrives.
struct SlotState {
  uint8_t next_ver = 0;               // flips at every use, in step on every rank
  std::optional<uint32_t> block;      // the block outstanding in this slot
  std::vector<std::byte> packet;
};

}  // namespace

class SwitchClient::Impl {
 public:
  explicit Impl(const SwitchClientConfig& config) : config_(config) {
    if (config.world_size == 0 || config.rank >= config.world_size)
      throw ConfigError(fmt::format("switch: rank {} outside world size {}", config.rank, config.world_size));
    if (block_ == 0 || block_ > XSW_MAX_PACKET_ELEMS || config.pool.slots == 0 || config.pool.slots > XSW_MAX_SLOTS)
      throw ConfigError(fmt::format("switch: {} elements per packet (1..{}) and {} slots (1..{})", block_,
                                    XSW_MAX_PACKET_ELEMS, config.pool.slots, XSW_MAX_SLOTS));
    auto deadline = Clock::now() + config.join_timeout;
    sockaddr_in control_address =
        ipv4(config.server, config.control_port ? config.control_port : kDefaultControlPort);
    channel_.emplace(control_address, deadline);
    // The join's `elements` asks for the job's slots, start's `chunks` grants them (switch_aggregator.h).
    channel_->send(control::JoinRequest{config.job_id, config.rank, config.world_size, config.pool.slots,
                                        static_cast<uint32_t>(packet_bytes_ + wire::kIpUdpBytes)},
                   deadline);
    auto joined = expect<control::JoinReply>(*channel_, deadline, "joined");
    token_ = joined.token;
    slots_.resize(config.pool.slots);
    for (SlotState& slot : slots_) slot.packet.resize(packet_bytes_);
    open_socket(joined.result_port, ipv4(config.server, joined.data_port));
    auto started = expect<control::Start>(*channel_, deadline, "start");
    if (started.chunks != config.pool.slots)
      throw CommError(
          fmt::format("switch aggregator: {} slots granted, {} asked for", started.chunks, config.pool.slots));
  }

  ~Impl() {
    try {
      channel_->send(control::Leave{}, Clock::now() + std::chrono::seconds(1));
    } catch (const std::exception& error) {
      spdlog::debug("switch: leave not sent: {}", error.what());
    }
  }

  void allreduce(float* data, size_t count, ReduceOp op) {
    if (op != ReduceOp::Sum && op != ReduceOp::Average) throw ConfigError("switch: only sum and average all-reduces");
    auto deadline = Clock::now() + config_.operation_timeout;
    const uint32_t ranks = config_.world_size;
    size_t blocks = (count + block_ - 1) / block_;
    std::vector<int32_t> exponents(blocks), shares(blocks * block_);
    for (size_t b = 0; b < blocks; ++b)
      exponents[b] = quant::chunk_exponent({data + b * block_, std::min(block_, count - b * block_)});
    exponents.resize((blocks + block_ - 1) / block_ * block_, quant::kZeroExponent);
    reduce(exponents, XSW_OP_MAX, deadline);
    for (size_t b = 0; b < blocks; ++b)
      quant::quantize({data + b * block_, std::min(block_, count - b * block_)}, exponents[b], ranks,
                      {shares.data() + b * block_, block_});
    reduce(shares, XSW_OP_SUM, deadline);
    double divisor = op == ReduceOp::Average ? ranks : 1;
    for (size_t b = 0; b < blocks; ++b) {
      size_t size = std::min(block_, count - b * block_);
      quant::dequantize({shares.data() + b * block_, size}, exponents[b], ranks, divisor, {data + b * block_, size});
    }
  }

 private:
  void open_socket(uint16_t result_port, const sockaddr_in& aggregator) {
    socket_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!socket_) throw CommError(fmt::format("switch: socket: {}", std::strerror(errno)));
    int one = 1;
    setsockopt(socket_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    for (int option : {SO_RCVBUF, SO_SNDBUF})
      setsockopt(socket_.get(), SOL_SOCKET, option, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
    // Never fragment: the aggregator drops IP fragments, so a packet too large
    // for the link must fail its send (EMSGSIZE) rather than time out.
    int no_fragments = IP_PMTUDISC_DO;
    setsockopt(socket_.get(), IPPROTO_IP, IP_MTU_DISCOVER, &no_fragments, sizeof(no_fragments));
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_port = htons(result_port);
    // Not connect()ed: that would fix the local address and the kernel would
    // no longer deliver the broadcast RESULTs (see docs/design.md).
    if (bind(socket_.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0)
      throw CommError(fmt::format("switch: UDP port {}: {}", result_port, std::strerror(errno)));
    aggregator_ = aggregator;
    receive_buffers_.resize(kBatch * receive_slot_bytes_);
    // The batches' message headers point at fixed buffers: each call sets only what changes.
    for (size_t i = 0; i < kBatch; ++i) {
      send_headers_[i].msg_hdr.msg_iov = &send_vectors_[i];
      send_headers_[i].msg_hdr.msg_iovlen = 1;
      send_headers_[i].msg_hdr.msg_name = &aggregator_;
      send_headers_[i].msg_hdr.msg_namelen = sizeof(aggregator_);
      receive_vectors_[i] = {receive_buffers_.data() + i * receive_slot_bytes_, receive_slot_bytes_};
      receive_headers_[i].msg_hdr.msg_iov = &receive_vectors_[i];
      receive_headers_[i].msg_hdr.msg_iovlen = 1;
      receive_headers_[i].msg_hdr.msg_name = &senders_[i];
    }
  }

  // All-reduces values (a whole number of blocks) in place through the pool:
  // block b always uses slot b % S, and a slot takes its next block only once
  // the current one's result is back. Results are taken and the freed slots'
  // next blocks sent in batches (recvmmsg, sendmmsg), as SwitchML's DPDK
  // client does with bursts: a system call per packet would make this
  // baseline as slow as the host's system calls (1 us each on the test VM).
  void reduce(std::vector<int32_t>& values, uint8_t op, Clock::time_point deadline) {
    const uint32_t blocks = static_cast<uint32_t>(values.size() / block_);
    const uint32_t slots = static_cast<uint32_t>(slots_.size());
    outgoing_.clear();
    for (uint32_t b = 0; b < std::min(blocks, slots); ++b) prepare_block(values, b, b, op);
    transmit_prepared();
    uint32_t done = 0;
    auto last_progress = Clock::now();
    while (done < blocks) {
      int received = receive_batch();
      if (received == 0) {
        auto now = Clock::now();
        if (now > deadline)
          throw TimeoutError(fmt::format("switch: all-reduce of {} blocks timed out after {} done", blocks, done));
        if (now - last_progress > config_.retransmit_timeout) {
          resend_outstanding();
          last_progress = now;
        }
        pollfd readable{socket_.get(), POLLIN, 0};
        poll(&readable, 1, static_cast<int>(config_.retransmit_timeout.count()));
        continue;
      }
      for (int i = 0; i < received; ++i) {
        const std::byte* packet = receive_buffers_.data() + size_t(i) * receive_slot_bytes_;
        const auto* header = reinterpret_cast<const xsw_hdr*>(packet);
        const sockaddr_in& sender = senders_[i];
        uint32_t slot = ntohs(header->slot);
        if (sender.sin_addr.s_addr != aggregator_.sin_addr.s_addr || sender.sin_port != aggregator_.sin_port ||
            receive_headers_[i].msg_len != packet_bytes_ || header->magic != htons(XSW_MAGIC) ||
            header->type != XSW_MSG_RESULT || ntohl(header->job_id) != config_.job_id || slot >= slots)
          continue;
        SlotState& state = slots_[slot];
        uint32_t block = ntohl(header->block);
        if (!state.block || *state.block != block || header->ver != static_cast<uint8_t>(state.next_ver ^ 1))
          continue;  // a duplicate or another rank's resend
        std::memcpy(values.data() + size_t{block} * block_, packet + XSW_HDR_BYTES, block_ * 4);
        state.block.reset();
        ++done;
        last_progress = Clock::now();
        if (block + slots < blocks) prepare_block(values, block + slots, slot, op);
      }
      transmit_prepared();
    }
  }

  // Writes the block's DATA packet into its slot's shadow copy and queues it.
  void prepare_block(const std::vector<int32_t>& values, uint32_t block, uint32_t slot, uint8_t op) {
    SlotState& state = slots_[slot];
    xsw_hdr header{};
    header.magic = htons(XSW_MAGIC);
    header.type = XSW_MSG_DATA;
    header.op = op;
    header.job_id = htonl(config_.job_id);
    header.token = htobe64(token_);
    header.rank = htons(static_cast<uint16_t>(config_.rank));
    header.slot = htons(static_cast<uint16_t>(slot));
    header.ver = state.next_ver;
    header.block = htonl(block);
    std::memcpy(state.packet.data(), &header, sizeof(header));
    std::memcpy(state.packet.data() + XSW_HDR_BYTES, values.data() + size_t{block} * block_, block_ * 4);
    state.next_ver ^= 1;
    state.block = block;
    outgoing_.push_back(slot);
  }

  void resend_outstanding() {
    outgoing_.clear();
    for (uint32_t slot = 0; slot < slots_.size(); ++slot)
      if (slots_[slot].block) outgoing_.push_back(slot);
    transmit_prepared();
  }

  // Sends the queued slots' packets. A packet refused for a full send buffer
  // counts as lost: the retransmission recovers it.
  void transmit_prepared() {
    for (size_t first = 0; first < outgoing_.size(); first += kBatch) {
      const size_t count = std::min(kBatch, outgoing_.size() - first);
      for (size_t i = 0; i < count; ++i) {
        std::vector<std::byte>& packet = slots_[outgoing_[first + i]].packet;
        send_vectors_[i] = {packet.data(), packet.size()};
      }
      // sendmmsg stops at the first message that fails and reports how many went before it.
      for (size_t sent = 0; sent < count;) {
        int result = sendmmsg(socket_.get(), send_headers_.data() + sent, static_cast<unsigned>(count - sent), 0);
        if (result >= 0) {
          sent += static_cast<size_t>(result);
        } else if (errno == ENOBUFS) {
          ++sent;  // that one is lost
        } else if (errno == EMSGSIZE) {
          throw CommError(fmt::format("switch: {}-byte datagrams exceed the path MTU ({} elements per packet)",
                                      packet_bytes_, block_));
        } else if (errno != EINTR) {
          throw CommError(fmt::format("switch: send: {}", std::strerror(errno)));
        }
      }
    }
    outgoing_.clear();
  }

  // Up to kBatch datagrams without waiting; 0 when none is queued.
  int receive_batch() {
    for (size_t i = 0; i < kBatch; ++i) receive_headers_[i].msg_hdr.msg_namelen = sizeof(senders_[i]);  // in and out
    int received = recvmmsg(socket_.get(), receive_headers_.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (received >= 0) return received;
    if (errno == EAGAIN || errno == EINTR) return 0;
    throw CommError(fmt::format("switch: receive: {}", std::strerror(errno)));
  }

  // Datagrams per sendmmsg/recvmmsg call.
  static constexpr size_t kBatch = 64;

  SwitchClientConfig config_;
  const size_t block_ = config_.pool.packet_elems;  // elements per packet and per quantization exponent
  const size_t packet_bytes_ = XSW_HDR_BYTES + block_ * 4;
  const size_t receive_slot_bytes_ = packet_bytes_ + 1;  // one more byte tells oversized datagrams apart
  std::optional<ControlChannel> channel_;
  uint64_t token_ = 0;
  std::vector<SlotState> slots_;
  std::vector<uint32_t> outgoing_;  // slots whose packets are to be sent
  std::array<iovec, kBatch> send_vectors_{};
  std::array<mmsghdr, kBatch> send_headers_{};
  std::array<iovec, kBatch> receive_vectors_{};
  std::array<mmsghdr, kBatch> receive_headers_{};
  std::array<sockaddr_in, kBatch> senders_{};
  std::vector<std::byte> receive_buffers_;
  UniqueFd socket_;
  sockaddr_in aggregator_{};
};

SwitchClient::SwitchClient(const SwitchClientConfig& config) : impl_(std::make_unique<Impl>(config)) {}
SwitchClient::~SwitchClient() = default;
void SwitchClient::allreduce(float* data, size_t count, ReduceOp op) { impl_->allreduce(data, count, op); }

}  // namespace xagg::baselines::switchml
