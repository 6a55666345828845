// The testbed itself: idempotent up, complete down, broadcast delivery.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "e2e_support.h"
#include "testbed.h"

namespace xagg::testbed {
namespace {

constexpr const char* kPrefix = "xagg-e2etb";
// A namespace whose name the prefix's must not match; down() leaves it alone.
const std::string kNeighbour = std::string(kPrefix) + "x-sw";

// Ignores errors: the namespace is mostly not there.
void delete_neighbour() {
  try {
    run_command({"ip", "netns", "delete", kNeighbour});
  } catch (const CommandError&) {
  }
}

class TestbedTest : public ::testing::Test {
 protected:
  void SetUp() override { e2e::require_root(); }
  void TearDown() override {
    delete_neighbour();
    bed_.down();
  }

  // The identity of a worker's veth (ifindex and MAC) changes if it is recreated.
  std::string link_identity(uint32_t worker) {
    return run_command({"ip", "-n", bed_.worker(worker).netns, "-o", "link", "show", "dev", kHostInterface});
  }

  Testbed bed_{kPrefix};
};

TEST_F(TestbedTest, UpTwiceKeepsTheExistingTestbed) {
  bed_.up(2);
  auto namespaces = bed_.existing_namespaces();
  auto identity = link_identity(1);
  EXPECT_EQ(namespaces.size(), 4u);

  bed_.up(2);
  EXPECT_EQ(bed_.existing_namespaces(), namespaces);
  EXPECT_EQ(link_identity(1), identity);
}

TEST_F(TestbedTest, UpWithAnotherWorkerCountRebuilds) {
  bed_.up(3);
  bed_.up(2);
  EXPECT_EQ(bed_.existing_workers(), 2u);
  EXPECT_EQ(bed_.existing_namespaces().size(), 4u);
}

TEST_F(TestbedTest, DownRemovesEveryNamespaceOfThePrefixOnly) {
  bed_.up(2);
  // Leftovers of a crashed run with more workers, and a neighbour with a longer prefix.
  std::string leftover = std::string(kPrefix) + "-w7";
  run_command({"ip", "netns", "add", leftover});
  delete_neighbour();  // a crashed run may have left it
  run_command({"ip", "netns", "add", kNeighbour});

  bed_.down();
  EXPECT_TRUE(bed_.existing_namespaces().empty());
  EXPECT_FALSE(std::filesystem::exists("/run/netns/" + leftover));
  EXPECT_TRUE(std::filesystem::exists("/run/netns/" + kNeighbour));
}

// A socket keeps the namespace it was created in, so sockets are made on
// short-lived threads inside each namespace and used from this thread.
int udp_socket_in(const std::string& netns) {
  int fd = -1;
  run_in_netns(netns, [&] { fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0); });
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  return fd;
}

TEST_F(TestbedTest, DirectedBroadcastFromTheAggregatorReachesEveryWorker) {
  constexpr uint32_t kWorkers = 3;
  constexpr uint16_t kPort = 9999;
  bed_.up(kWorkers);

  std::vector<int> receivers;
  for (uint32_t i = 0; i < kWorkers; ++i) {
    int fd = udp_socket_in(bed_.worker(i).netns);
    receivers.push_back(fd);
    sockaddr_in any{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {htonl(INADDR_ANY)}, .sin_zero = {}};
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << strerror(errno);
    timeval timeout{.tv_sec = 3, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }

  int sender = udp_socket_in(bed_.aggregator().netns);
  int on = 1;
  ASSERT_EQ(setsockopt(sender, SOL_SOCKET, SO_BROADCAST, &on, sizeof on), 0);
  sockaddr_in broadcast{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {}, .sin_zero = {}};
  inet_pton(AF_INET, kBroadcastAddress, &broadcast.sin_addr);
  const std::string message = "xagg broadcast probe";
  ASSERT_EQ(sendto(sender, message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&broadcast), sizeof broadcast),
            static_cast<ssize_t>(message.size()))
      << strerror(errno);
  close(sender);

  for (uint32_t i = 0; i < kWorkers; ++i) {
    char buffer[64] = {};
    ssize_t n = recv(receivers[i], buffer, sizeof buffer, 0);
    EXPECT_EQ(std::string(buffer, n > 0 ? n : 0), message) << "worker " << i << " got no broadcast";
    close(receivers[i]);
  }
}

}  // namespace
}  // namespace xagg::testbed
