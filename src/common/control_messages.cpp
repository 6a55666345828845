#include "control_messages.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>

#include "xagg_wire.h"

static_assert(xagg::control::kProtocolVersion == XAGG_VERSION, "one version for both protocols");

namespace xagg::control {
namespace {

using nlohmann::json;

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;  // clang 14 does not deduce it

// Reads an unsigned field that must fit T.
template <class T>
T field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) throw ProtocolError(fmt::format("missing field '{}'", name));
  if (!it->is_number_unsigned())
    throw ProtocolError(fmt::format("field '{}' must be a non-negative integer", name));
  uint64_t value = it->get<uint64_t>();
  if (value > std::numeric_limits<T>::max())
    throw ProtocolError(fmt::format("field '{}' is out of range ({})", name, value));
  return static_cast<T>(value);
}

std::string text_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_string())
    throw ProtocolError(fmt::format("missing string field '{}'", name));
  return it->get<std::string>();
}

// Reads an array of unsigned 32-bit integers with min_size .. max_size entries.
std::vector<uint32_t> number_list_field(const json& object, const char* name, size_t min_size, size_t max_size) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_array()) throw ProtocolError(fmt::format("missing array field '{}'", name));
  if (it->size() < min_size || it->size() > max_size)
    throw ProtocolError(
        fmt::format("field '{}' has {} entries, not {} to {}", name, it->size(), min_size, max_size));
  std::vector<uint32_t> numbers;
  for (const json& entry : *it) {
    if (!entry.is_number_unsigned() || entry.get<uint64_t>() > std::numeric_limits<uint32_t>::max())
      throw ProtocolError(fmt::format("field '{}' must hold 32-bit non-negative integers", name));
    numbers.push_back(entry.get<uint32_t>());
  }
  return numbers;
}

std::string hex_field(const json& object, const char* name, size_t digits) {
  std::string text = text_field(object, name);
  if (text.size() != digits || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw ProtocolError(fmt::format("field '{}' must be {} lower-case hex digits", name, digits));
  return text;
}

// Both directions share the type "status"; the request lists chunks, the reply ranks.
Message decode_status(const json& object) {
  bool is_request = object.contains("chunks");
  if (is_request == object.contains("missing_ranks"))
    throw ProtocolError("a status message needs exactly one of 'chunks' and 'missing_ranks'");
  auto iteration = field<uint32_t>(object, "iteration");
  if (is_request) return StatusRequest{iteration, number_list_field(object, "chunks", 0, kMaxStatusChunks)};
  StatusReply reply{iteration, number_list_field(object, "missing_ranks", 0, XAGG_MAX_WORKERS), std::nullopt};
  if (auto conflict = object.find("size_conflict"); conflict != object.end()) {
    if (!conflict->is_object()) throw ProtocolError("field 'size_conflict' must be an object");
    reply.size_conflict = SizeConflict{field<uint32_t>(*conflict, "elements"), field<uint32_t>(*conflict, "rank"),
                                       field<uint32_t>(*conflict, "rank_elements")};
  }
  return reply;
}

// "shard" and "weights": a place in a list of aggregators and their weights.
std::pair<uint32_t, std::vector<uint32_t>> shard_fields(const json& object) {
  std::vector<uint32_t> weights = number_list_field(object, "weights", 1, XAGG_MAX_WORKERS);
  auto shard = field<uint32_t>(object, "shard");
  if (shard >= weights.size())
    throw ProtocolError(fmt::format("field 'shard' {} is not below the {} weights", shard, weights.size()));
  for (uint32_t weight : weights)
    if (weight == 0 || weight > kMaxShardWeight)
      throw ProtocolError(fmt::format("field 'weights' holds {}, not 1 to {}", weight, kMaxShardWeight));
  return {shard, std::move(weights)};
}

Message decode_reshard(const json& object) {
  ReshardRequest request{field<uint32_t>(object, "epoch"), number_list_field(object, "dead", 1, XAGG_MAX_WORKERS),
                         0, {}};
  std::tie(request.shard, request.weights) = shard_fields(object);
  if (request.epoch != request.dead.size())
    throw ProtocolError(fmt::format("field 'epoch' {} is not the number of dead aggregators ({})", request.epoch,
                                    request.dead.size()));
  if (!std::ranges::is_sorted(request.dead) || std::ranges::adjacent_find(request.dead) != request.dead.end())
    throw ProtocolError("field 'dead' must be strictly ascending");
  return request;
}

ParentJob decode_parent(const json& object) {
  if (!object.is_object()) throw ProtocolError("field 'parent' must be an object");
  ParentJob parent{text_field(object, "aggregator"), field<uint32_t>(object, "leaf"),
                   field<uint32_t>(object, "leaves")};
  if (parent.leaves == 0 || parent.leaves > XAGG_MAX_WORKERS || parent.leaf >= parent.leaves)
    throw ProtocolError(fmt::format("field 'parent': leaf {} of {} leaves (1 to {})", parent.leaf, parent.leaves,
                                    XAGG_MAX_WORKERS));
  return parent;
}

// "wire_bits": 32 or 16 (docs/protocol.md section 11).
uint32_t wire_bits_field(const json& object) {
  auto bits = field<uint32_t>(object, "wire_bits");
  if (bits != wire::kWideBits && bits != wire::kNarrowBits)
    throw ProtocolError(fmt::format("field 'wire_bits' is {}, not {} or {}", bits, wire::kWideBits, wire::kNarrowBits));
  return bits;
}

Start decode_start(const json& object) {
  Start start{field<uint16_t>(object, "mtu"), field<uint32_t>(object, "chunk_elements"),
              field<uint32_t>(object, "chunks")};
  const std::string results = text_field(object, "results");
  const std::optional<wire::ResultMode> mode = wire::parse_result_mode(results);
  if (!mode)
    throw ProtocolError(fmt::format("field 'results' is \"{}\", not broadcast, multicast or unicast", results));
  start.results = *mode;
  start.wire_bits = wire_bits_field(object);
  if (object.contains("group") != (start.results == wire::ResultMode::Multicast))
    throw ProtocolError("field 'group' comes with results \"multicast\" and only with it");
  if (start.results == wire::ResultMode::Multicast) {
    start.group = text_field(object, "group");
    in_addr group{};
    if (inet_pton(AF_INET, start.group.c_str(), &group) != 1 || !IN_MULTICAST(ntohl(group.s_addr)))
      throw ProtocolError(fmt::format("field 'group' \"{}\" is not an IPv4 multicast address", start.group));
  }
  return start;
}

}  // namespace

std::string encode(const Message& message) {
  json object = std::visit(
      Overloaded{
          [](const JoinRequest& m) {
            json join{{"type", "join"}, {"version", kProtocolVersion}, {"job", m.job_id},
                      {"rank", m.rank}, {"world_size", m.world_size},  {"elements", m.elements},
                      {"mtu", m.mtu}};
            if (!m.weights.empty()) {
              join["shard"] = m.shard;
              join["weights"] = m.weights;
            }
            if (!m.auth.empty()) join["auth"] = m.auth;
            if (m.parent)
              join["parent"] = {
                  {"aggregator", m.parent->aggregator}, {"leaf", m.parent->leaf}, {"leaves", m.parent->leaves}};
            if (m.listen_port != 0) join["listen_port"] = m.listen_port;
            if (m.wire_bits != wire::kWideBits) join["wire_bits"] = m.wire_bits;
            if (m.sum_shift) join["sum_shift"] = *m.sum_shift;
            return join;
          },
          [](const Challenge& m) { return json{{"type", "challenge"}, {"nonce", m.nonce}}; },
          [](const JoinReply& m) {
            return json{{"type", "joined"},
                        {"token", fmt::format("{:016x}", m.token)},
                        {"data_port", m.data_port},
                        {"result_port", m.result_port},
                        {"broadcast", m.broadcast}};
          },
          [](const Start& m) {
            json start{{"type", "start"},
                       {"mtu", m.mtu},
                       {"chunk_elements", m.chunk_elements},
                       {"chunks", m.chunks},
                       {"results", wire::to_string(m.results)},
                       {"wire_bits", m.wire_bits}};
            if (m.results == wire::ResultMode::Multicast) start["group"] = m.group;
            return start;
          },
          [](const Leave&) { return json{{"type", "leave"}}; },
          [](const StatusRequest& m) {
            return json{{"type", "status"}, {"iteration", m.iteration}, {"chunks", m.chunks}};
          },
          [](const StatusReply& m) {
            json reply{{"type", "status"}, {"iteration", m.iteration}, {"missing_ranks", m.missing_ranks}};
            if (m.size_conflict)
              reply["size_conflict"] = {{"elements", m.size_conflict->elements},
                                        {"rank", m.size_conflict->rank},
                                        {"rank_elements", m.size_conflict->rank_elements}};
            return reply;
          },
          [](const Ping&) { return json{{"type", "ping"}}; },
          [](const Pong&) { return json{{"type", "pong"}}; },
          [](const ReshardRequest& m) {
            return json{{"type", "reshard"}, {"epoch", m.epoch}, {"dead", m.dead}, {"shard", m.shard},
                        {"weights", m.weights}};
          },
          [](const Resharded& m) {
            return json{{"type", "resharded"},
                        {"epoch", m.epoch},
                        {"token", fmt::format("{:016x}", m.token)},
                        {"chunks", m.chunks}};
          },
          [](const Error& m) { return json{{"type", "error"}, {"message", m.message}}; },
      },
      message);
  // An error may quote a peer's bytes (a line that is not JSON): bytes that are not
  // UTF-8 become U+FFFD instead of throwing out of the daemon's event loop.
  return object.dump(-1, ' ', false, json::error_handler_t::replace);
}

Message decode(std::string_view line) {
  if (line.size() > kMaxLineBytes)
    throw ProtocolError(fmt::format("message of {} bytes exceeds {}", line.size(), kMaxLineBytes));
  json object;
  try {
    object = json::parse(line);
  } catch (const json::exception& error) {
    // Its text names the problem: "ill-formed UTF-8 byte", "number overflow parsing '1e400'".
    throw ProtocolError(fmt::format("message is not valid JSON: {}", error.what()));
  }
  if (!object.is_object()) throw ProtocolError(fmt::format("message is JSON but not an object: {}", object.type_name()));
  std::string type = text_field(object, "type");
  if (type == "join") {
    if (field<int>(object, "version") != kProtocolVersion)
      throw ProtocolError(fmt::format("unsupported protocol version (this side speaks {})", kProtocolVersion));
    JoinRequest join{field<uint32_t>(object, "job"), field<uint32_t>(object, "rank"),
                     field<uint32_t>(object, "world_size"), field<uint64_t>(object, "elements"),
                     field<uint16_t>(object, "mtu")};
    if (object.contains("shard") != object.contains("weights"))
      throw ProtocolError("fields 'shard' and 'weights' come together");
    if (object.contains("weights")) std::tie(join.shard, join.weights) = shard_fields(object);
    if (object.contains("auth")) join.auth = hex_field(object, "auth", 64);
    if (auto parent = object.find("parent"); parent != object.end()) join.parent = decode_parent(*parent);
    if (object.contains("listen_port") && (join.listen_port = field<uint16_t>(object, "listen_port")) == 0)
      throw ProtocolError("field 'listen_port' is 0");
    if (object.contains("wire_bits")) join.wire_bits = wire_bits_field(object);
    if (object.contains("sum_shift") && (join.sum_shift = field<uint32_t>(object, "sum_shift")) > kMaxSumShift)
      throw ProtocolError(fmt::format("field 'sum_shift' {} is not in 0..{}", *join.sum_shift, kMaxSumShift));
    return join;
  }
  if (type == "challenge") return Challenge{hex_field(object, "nonce", 32)};
  if (type == "joined") {
    return JoinReply{std::stoull(hex_field(object, "token", 16), nullptr, 16), field<uint16_t>(object, "data_port"),
                     field<uint16_t>(object, "result_port"), text_field(object, "broadcast")};
  }
  if (type == "start") return decode_start(object);
  if (type == "leave") return Leave{};
  if (type == "status") return decode_status(object);
  if (type == "ping") return Ping{};
  if (type == "pong") return Pong{};
  if (type == "reshard") return decode_reshard(object);
  if (type == "resharded")
    return Resharded{field<uint32_t>(object, "epoch"), std::stoull(hex_field(object, "token", 16), nullptr, 16),
                     field<uint32_t>(object, "chunks")};
  if (type == "error") return Error{text_field(object, "message")};
  throw ProtocolError(fmt::format("unknown message type '{}'", type));
}

}  // namespace xagg::control
