// Loopback throughput of the TCP parameter-server baseline:
//   tcp_ps_bench [workers=2] [megabytes per worker=64] [iterations=10]
//                [chunk KiB=256] [socket buffer bytes=4 MiB, 0: autotuning]
//                [servers=1, on 127.0.0.1, 127.0.0.2, ... sharing a port]
// prints algbw = bytes per worker / all-reduce time.
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "baselines/tcp_ps/tcp_ps_client.h"
#include "baselines/tcp_ps/tcp_ps_server.h"

using namespace xagg::baselines;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const uint32_t workers = argc > 1 ? std::stoul(argv[1]) : 2;
  const size_t megabytes = argc > 2 ? std::stoul(argv[2]) : 64;
  const int iterations = argc > 3 ? std::stoi(argv[3]) : 10;
  const size_t chunk_bytes = (argc > 4 ? std::stoul(argv[4]) : 256) * 1024;
  const int socket_buffer_bytes = argc > 5 ? std::stoi(argv[5]) : xagg::baselines::tcp_ps::kDefaultSocketBufferBytes;
  const size_t server_count = argc > 6 ? std::stoul(argv[6]) : 1;
  const size_t elements = megabytes * 1'000'000 / sizeof(float);

  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<TcpPsServer>> servers;
  std::vector<std::jthread> serving;
  for (size_t i = 0; i < server_count; ++i) {
    addresses.push_back(fmt::format("127.0.0.{}", i + 1));
    servers.push_back(std::make_unique<TcpPsServer>(TcpPsServerConfig{.bind_address = addresses.back(),
                                                                      .port = i == 0 ? uint16_t{0} : servers[0]->port(),
                                                                      .world_size = workers,
                                                                      .chunk_bytes = chunk_bytes,
                                                                      .socket_buffer_bytes = socket_buffer_bytes}));
    serving.emplace_back([&server = *servers.back()] { server.run(); });
  }
  std::barrier start(workers);
  std::vector<double> seconds(iterations);
  {
    std::vector<std::jthread> threads;
    for (uint32_t rank = 0; rank < workers; ++rank) {
      threads.emplace_back([&, rank] {
        TcpPsClientConfig config{.servers = addresses,
                                 .port = servers[0]->port(),
                                 .rank = rank,
                                 .world_size = workers,
                                 .max_elements = elements,
                                 .socket_buffer_bytes = socket_buffer_bytes};
        TcpPsClient client(config);
        std::vector<float> gradient(elements, 1.0f);
        client.allreduce(gradient.data(), elements);  // warm-up: page faults, TCP windows
        for (int i = 0; i < iterations; ++i) {
          start.arrive_and_wait();
          const auto begin = Clock::now();
          client.allreduce(gradient.data(), elements);
          if (rank == 0) seconds[i] = std::chrono::duration<double>(Clock::now() - begin).count();
        }
      });
    }
  }
  for (auto& server : servers) server->stop();
  std::sort(seconds.begin(), seconds.end());
  const double bytes = static_cast<double>(elements * sizeof(float));
  fmt::print(
      "workers={} servers={} bytes/worker={} chunk={} KiB socket buffer={} iterations={} median={:.1f} ms algbw "
      "median={:.2f} GB/s best={:.2f} GB/s\n",
      workers, server_count, elements * sizeof(float), chunk_bytes / 1024, socket_buffer_bytes, iterations,
      seconds[iterations / 2] * 1e3, bytes / seconds[iterations / 2] / 1e9, bytes / seconds.front() / 1e9);
}
