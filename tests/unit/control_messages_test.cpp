#include "control_messages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace xagg::control {
namespace {

template <class T>
T round_trip(const Message& message) {
  Message decoded = decode(encode(message));
  EXPECT_TRUE(std::holds_alternative<T>(decoded)) << encode(message);
  return std::get<T>(decoded);
}

TEST(ControlMessages, JoinRequestRoundTrip) {
  auto join = round_trip<JoinRequest>(JoinRequest{7, 3, 64, 1ull << 40, 1500});
  EXPECT_EQ(join.job_id, 7u);
  EXPECT_EQ(join.rank, 3u);
  EXPECT_EQ(join.world_size, 64u);
  EXPECT_EQ(join.elements, 1ull << 40);
  EXPECT_EQ(join.mtu, 1500u);
  EXPECT_TRUE(join.weights.empty());
  EXPECT_EQ(encode(JoinRequest{7, 3, 64, 100, 9000}).find("weights"), std::string::npos) << "absent unless set";
}

// The MTU decides the job's packet size (protocol.md section 1): a join must give it.
TEST(ControlMessages, JoinRequestNeedsAnMtuThatFitsSixteenBits) {
  EXPECT_THROW(decode(R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2,"elements":9})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2,"elements":9,"mtu":65536})"),
               ProtocolError);
  EXPECT_EQ(std::get<JoinRequest>(decode(R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2,)"
                                         R"("elements":9,"mtu":65535})"))
                .mtu,
            65535u);
}

// A sharded job's join names the aggregator's place and every weight (protocol.md section 6).
TEST(ControlMessages, JoinRequestCarriesAShardsPlaceAndWeights) {
  auto join = round_trip<JoinRequest>(JoinRequest{7, 3, 64, 100, 4000, 2, {3, 1, 2}});
  EXPECT_EQ(join.shard, 2u);
  EXPECT_EQ(join.weights, (std::vector<uint32_t>{3, 1, 2}));
}

// A rank of a two-level job names its leaf's parent; a leaf joining it names its listening port (section 9).
TEST(ControlMessages, JoinRequestCarriesAParentAndAListenPort) {
  JoinRequest request{7, 3, 8, 100, 9000};
  request.parent = ParentJob{"198.18.0.9:9988", 2, 5};
  request.listen_port = 9987;
  auto join = round_trip<JoinRequest>(request);
  EXPECT_EQ(join.parent, request.parent);
  EXPECT_EQ(join.listen_port, 9987);
  EXPECT_EQ(encode(JoinRequest{7, 3, 64, 100, 9000}).find("parent"), std::string::npos) << "absent unless set";
  const std::string base = R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2,"elements":9,"mtu":9000,)";
  EXPECT_THROW(decode(base + R"("parent":{"aggregator":"198.18.0.9","leaf":3,"leaves":3}})"), ProtocolError);
  EXPECT_THROW(decode(base + R"("parent":{"aggregator":"198.18.0.9","leaf":0,"leaves":65}})"), ProtocolError);
  EXPECT_THROW(decode(base + R"("parent":"198.18.0.9"})"), ProtocolError);
  EXPECT_THROW(decode(base + R"("listen_port":0})"), ProtocolError);
}

TEST(ControlMessages, JoinReplyRoundTripKeepsAll64TokenBits) {
  auto reply = round_trip<JoinReply>(JoinReply{0xfedcba9876543210ull, 9987, 65535, "198.18.0.255"});
  EXPECT_EQ(reply.token, 0xfedcba9876543210ull);
  EXPECT_EQ(reply.data_port, 9987);
  EXPECT_EQ(reply.result_port, 65535);
  EXPECT_EQ(reply.broadcast, "198.18.0.255");
  EXPECT_NE(encode(JoinReply{0xfedcba9876543210ull, 1, 1, "x"}).find("\"fedcba9876543210\""), std::string::npos);
}

// Start carries the layout every rank uses: the agreed MTU, its chunk size and this aggregator's chunks.
TEST(ControlMessages, StartRoundTripCarriesTheJobLayout) {
  EXPECT_EQ(round_trip<Start>(Start{1500, 360, 4097}), (Start{1500, 360, 4097}));
  EXPECT_THROW(decode(R"({"type":"start","mtu":1500,"chunks":2})"), ProtocolError);
}

TEST(ControlMessages, SimpleMessagesRoundTrip) {
  round_trip<Leave>(Leave{});
  EXPECT_EQ(round_trip<Error>(Error{"job 3: rank 2 disconnected"}).message, "job 3: rank 2 disconnected");
}

TEST(ControlMessages, StatusRequestAndReplyRoundTrip) {
  auto request = round_trip<StatusRequest>(StatusRequest{4294967295u, {0, 7, 4294967295u}});
  EXPECT_EQ(request.iteration, 4294967295u);
  EXPECT_EQ(request.chunks, (std::vector<uint32_t>{0, 7, 4294967295u}));
  auto reply = round_trip<StatusReply>(StatusReply{12, {1, 3, 63}, std::nullopt});
  EXPECT_EQ(reply.iteration, 12u);
  EXPECT_EQ(reply.missing_ranks, (std::vector<uint32_t>{1, 3, 63}));
  EXPECT_FALSE(reply.size_conflict);
  EXPECT_TRUE(round_trip<StatusReply>(StatusReply{12, {}, std::nullopt}).missing_ranks.empty());
  const SizeConflict conflict{4096, 1, 4294967295u};
  EXPECT_EQ(round_trip<StatusReply>(StatusReply{12, {1}, conflict}).size_conflict, conflict);
  // No chunks: the question of who has not joined yet.
  EXPECT_TRUE(round_trip<StatusRequest>(StatusRequest{0, {}}).chunks.empty());
  EXPECT_EQ(encode(StatusRequest{5, {2}}), R"({"chunks":[2],"iteration":5,"type":"status"})");
}

// Failover (protocol.md section 8): the survivors' placement and the new cells' token.
TEST(ControlMessages, ReshardAndReshardedRoundTrip) {
  const ReshardRequest request{2, {0, 3}, 1, {2, 5}};
  EXPECT_EQ(round_trip<ReshardRequest>(request), request);
  auto resharded = round_trip<Resharded>(Resharded{2, 0xfedcba9876543210ull, 77});
  EXPECT_EQ(resharded.epoch, 2u);
  EXPECT_EQ(resharded.token, 0xfedcba9876543210ull);
  EXPECT_EQ(resharded.chunks, 77u);
}

TEST(ControlMessages, MalformedReshardIsRejected) {
  // The epoch counts the dead; the dead are listed once each, ascending; the place is among the weights.
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":2,"dead":[1],"shard":0,"weights":[1]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":2,"dead":[3,1],"shard":0,"weights":[1]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":2,"dead":[1,1],"shard":0,"weights":[1]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":0,"dead":[],"shard":0,"weights":[1]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":1,"dead":[1],"shard":1,"weights":[1]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"reshard","epoch":1,"dead":[1],"shard":0,"weights":[0]})"), ProtocolError);
  EXPECT_THROW(decode(R"({"type":"resharded","epoch":1,"token":"12","chunks":3})"), ProtocolError);
}

TEST(ControlMessages, EncodingIsOneLine) {
  EXPECT_EQ(encode(Error{"two\nlines"}).find('\n'), std::string::npos);
}

// The daemon's error about a line that is not JSON quotes the peer's bytes; one that
// is not UTF-8 used to make encode() throw, which ended the daemon.
TEST(ControlMessages, AnErrorQuotingBytesThatAreNotUtf8IsEncodedWithReplacements) {
  EXPECT_EQ(round_trip<Error>(Error{"last read: '\xff'"}).message, "last read: '\xef\xbf\xbd'");
}

std::string joined_line_with_token(const std::string& token) {
  return R"({"type":"joined","token":")" + token + R"(","data_port":1,"result_port":1,"broadcast":"b","chunks":1})";
}

void expect_protocol_error(const std::string& line, const std::string& mentioning) {
  try {
    decode(line);
    ADD_FAILURE() << "accepted: " << line;
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find(mentioning), std::string::npos) << error.what();
  }
}

TEST(ControlMessages, SizeConflictNeedsEveryField) {
  expect_protocol_error(R"({"type":"status","iteration":1,"missing_ranks":[],"size_conflict":{"rank":1}})",
                        "elements");
  expect_protocol_error(R"({"type":"status","iteration":1,"missing_ranks":[],"size_conflict":[1,2,3]})",
                        "size_conflict");
}

TEST(ControlMessages, MalformedJsonIsRejected) {
  expect_protocol_error("{\"type\":\"start\"", "JSON");
  expect_protocol_error("", "JSON");
  expect_protocol_error("[1,2]", "not an object: array");
  expect_protocol_error("\"start\"", "not an object: string");
  // The parser's own words say what is wrong.
  expect_protocol_error("{\"type\":\"st\xff\"}", "UTF-8");
  expect_protocol_error(R"({"type":"join","version":1e400})", "number overflow");
}

TEST(ControlMessages, MissingFieldsAreNamed) {
  expect_protocol_error("{}", "type");
  expect_protocol_error(R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2})", "elements");
  expect_protocol_error(R"({"type":"joined","data_port":1,"result_port":1,"broadcast":"b","chunks":1})", "token");
  expect_protocol_error(R"({"type":"error"})", "message");
}

TEST(ControlMessages, OutOfRangeAndNegativeFieldsAreRejected) {
  expect_protocol_error(
      R"({"type":"joined","token":"0000000000000001","data_port":70000,"result_port":1,"broadcast":"b","chunks":1})",
      "data_port");
  expect_protocol_error(R"({"type":"join","version":9,"job":1,"rank":-1,"world_size":2,"elements":1,"mtu":9000})", "rank");
  expect_protocol_error(R"({"type":"join","version":9,"job":4294967296,"rank":0,"world_size":2,"elements":1,"mtu":9000})",
                        "job");
  expect_protocol_error(R"({"type":"join","version":9,"job":1,"rank":0.5,"world_size":2,"elements":1,"mtu":9000})", "rank");
}

TEST(ControlMessages, BadTokensAreRejected) {
  for (const char* token : {"1", "FEDCBA9876543210", "fedcba987654321g", "0fedcba9876543210"}) {
    expect_protocol_error(joined_line_with_token(token), "token");
  }
}

TEST(ControlMessages, UnknownTypeAndVersionAreRejected) {
  expect_protocol_error(R"({"type":"hello"})", "hello");
  expect_protocol_error(R"({"type":"join","version":1,"job":1,"rank":0,"world_size":2,"elements":1})", "version");
}

TEST(ControlMessages, MalformedStatusIsRejected) {
  expect_protocol_error(R"({"type":"status","iteration":1})", "exactly one");
  expect_protocol_error(R"({"type":"status","iteration":1,"chunks":[1],"missing_ranks":[]})", "exactly one");
  expect_protocol_error(R"({"type":"status","chunks":[1]})", "iteration");
  expect_protocol_error(R"({"type":"status","iteration":-1,"chunks":[1]})", "iteration");
  expect_protocol_error(R"({"type":"status","iteration":1,"chunks":2})", "chunks");
  expect_protocol_error(R"({"type":"status","iteration":1,"chunks":[1,-2]})", "chunks");
  expect_protocol_error(R"({"type":"status","iteration":1,"chunks":[4294967296]})", "chunks");
  expect_protocol_error(R"({"type":"status","iteration":1,"chunks":["1"]})", "chunks");
  std::string seventeen = R"({"type":"status","iteration":1,"chunks":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]})";
  expect_protocol_error(seventeen, "17 entries");
  expect_protocol_error(R"({"type":"status","iteration":1,"missing_ranks":[0.5]})", "missing_ranks");
  std::string ranks = "0";
  for (int rank = 1; rank <= 64; ++rank) ranks += "," + std::to_string(rank);
  expect_protocol_error(R"({"type":"status","iteration":1,"missing_ranks":[)" + ranks + "]}", "65 entries");
}

TEST(ControlMessages, OversizedLineIsRejected) {
  std::string line = R"({"type":"error","message":")" + std::string(kMaxLineBytes, 'x') + "\"}";
  expect_protocol_error(line, "exceeds");
}

// Start also says how the results come: a multicast start names the group to join, the others none.
TEST(ControlMessages, StartCarriesTheResultMode) {
  const Start multicast{1500, 360, 4, xagg::wire::ResultMode::Multicast, "239.18.0.3"};
  EXPECT_EQ(round_trip<Start>(multicast), multicast);
  const Start unicast{1500, 360, 4, xagg::wire::ResultMode::Unicast};
  EXPECT_EQ(round_trip<Start>(unicast), unicast);
  EXPECT_EQ(encode(unicast).find("group"), std::string::npos);
  const std::string layout = R"({"type":"start","mtu":1500,"chunk_elements":360,"chunks":4,"wire_bits":32,)";
  expect_protocol_error(layout + R"("results":"anycast"})", "anycast");
  expect_protocol_error(R"({"type":"start","mtu":1500,"chunk_elements":360,"chunks":4,"wire_bits":32})", "results");
  expect_protocol_error(layout + R"("results":"multicast"})", "group");
  expect_protocol_error(layout + R"("results":"unicast","group":"239.18.0.3"})", "group");
  expect_protocol_error(layout + R"("results":"multicast","group":"198.18.0.3"})", "not an IPv4 multicast");
}

// The wire width (protocol.md section 11): 32 or 16 in join and start; a sum shift of 0..6.
TEST(ControlMessages, WireWidthIsAgreedAtJoinAndNamedInStart) {
  JoinRequest join{1, 0, 4, 9, 1500};
  join.wire_bits = xagg::wire::kNarrowBits;
  join.sum_shift = 3;
  const auto decoded = round_trip<JoinRequest>(join);
  EXPECT_EQ(decoded.wire_bits, xagg::wire::kNarrowBits);
  EXPECT_EQ(decoded.sum_shift, std::optional<uint32_t>{3});
  const auto plain = round_trip<JoinRequest>(JoinRequest{1, 0, 4, 9, 1500});
  EXPECT_EQ(plain.wire_bits, xagg::wire::kWideBits);
  EXPECT_FALSE(plain.sum_shift);
  const std::string base = R"({"type":"join","version":9,"job":1,"rank":0,"world_size":2,"elements":9,"mtu":9000,)";
  expect_protocol_error(base + R"("wire_bits":8})", "wire_bits");
  expect_protocol_error(base + R"("wire_bits":"16"})", "wire_bits");
  expect_protocol_error(base + R"("sum_shift":7})", "sum_shift");
  Start start{1500, 720, 4, xagg::wire::ResultMode::Broadcast};
  start.wire_bits = xagg::wire::kNarrowBits;
  EXPECT_EQ(round_trip<Start>(start), start);
  expect_protocol_error(R"({"type":"start","mtu":1500,"chunk_elements":360,"chunks":4,"results":"broadcast"})",
                        "wire_bits");
  expect_protocol_error(
      R"({"type":"start","mtu":1500,"chunk_elements":360,"chunks":4,"results":"broadcast","wire_bits":24})",
      "wire_bits");
}

}  // namespace
}  // namespace xagg::control
