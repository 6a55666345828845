// `xagg tcp-ps-server`: the TCP parameter-server baseline, until SIGINT/SIGTERM.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <thread>

#include "baselines/tcp_ps/tcp_ps_server.h"
#include "commands.h"
#include "netns.h"

namespace xagg::tools {

namespace {

// Blocks SIGINT/SIGTERM in every thread started afterwards and stops the
// server from a thread that waits for them (stop() is not async-signal-safe).
class StopOnSignal {
 public:
  explicit StopOnSignal(baselines::TcpPsServer& server) {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    waiter_ = std::thread([this, &server] {
      int signal = 0;
      sigwait(&signals_, &signal);
      if (released_) return;
      spdlog::info("{}: stopping", strsignal(signal));
      server.stop();
    });
  }
  ~StopOnSignal() {
    released_ = true;
    pthread_kill(waiter_.native_handle(), SIGTERM);  // ends the wait if no signal came
    waiter_.join();
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  sigset_t signals_;
  std::atomic<bool> released_ = false;
  std::thread waiter_;
};

}  // namespace

void add_tcp_ps_command(CLI::App& app) {
  auto* command = app.add_subcommand("tcp-ps-server", "Run the TCP parameter-server baseline");
  auto config = std::make_shared<baselines::TcpPsServerConfig>();
  auto netns = std::make_shared<std::string>();
  command->add_option("--port", config->port, "TCP port")->capture_default_str();
  command->add_option("--world-size", config->world_size, "Workers per job (0: from the first hello)")
      ->capture_default_str();
  command->add_option("--bind", config->bind_address, "IPv4 address to listen on")
      ->check(CLI::ValidIPV4)
      ->capture_default_str();
  command->add_option("--netns", *netns, "Network namespace (ip netns name) to run in");
  command->add_option("--chunk-bytes", config->chunk_bytes, "Bytes per pipelined chunk")->capture_default_str();
  command->add_option("--socket-buffer", config->socket_buffer_bytes, "SO_SNDBUF/SO_RCVBUF bytes (0: autotuning)")
      ->capture_default_str();
  command->callback([=] {
    if (!netns->empty()) enter_netns(*netns);  // first: the socket lives in the namespace
    baselines::TcpPsServer server(*config);
    StopOnSignal stop_on_signal(server);  // before run() starts any thread
    server.run();
    spdlog::info("tcp-ps server stopped");
  });
}

}  // namespace xagg::tools
