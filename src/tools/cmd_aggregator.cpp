// `xagg aggregator`: the daemon that runs the XDP aggregator on an interface.
#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "admission.h"
#include "commands.h"
#include "daemon.h"
#include "netns.h"
#include "service_setup.h"

namespace xagg::tools {
namespace {

// A subcommand with its own --config FILE. CLI11 2.1 (Debian 12) reads the config
// file of the main app only; this one parses its own in --config's callback, which
// runs before the callbacks of the options declared after it and before the
// required-option checks, so the file may give --interface. The command line wins.
class CommandWithConfigFile : public CLI::App {
 public:
  CommandWithConfigFile(std::string name, std::string description, CLI::App* parent)
      : CLI::App(std::move(description), std::move(name), parent) {
    allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key is refused, not ignored
    set_config("--config", "", "Read options from FILE: `long-option-name = value` lines (TOML/INI)")
        ->check(CLI::ExistingFile)
        ->each([this](const std::string& file) { _parse_config(config_formatter_->from_file(file)); });
  }
};

}  // namespace

void add_aggregator_command(CLI::App& app) {
  auto* command = app.add_subcommand(std::make_shared<CommandWithConfigFile>(
      "aggregator", "Run the aggregator daemon (XDP data plane, TCP control)", &app));
  auto options = std::make_shared<control::DaemonOptions>();
  auto netns = std::make_shared<std::string>();
  auto generic = std::make_shared<bool>(false);
  auto broadcast = std::make_shared<std::string>();
  auto engine = std::make_shared<std::string>("xdp");
  auto no_fan_out = std::make_shared<bool>(false);
  // Required unless --prepare-for, which touches no interface (checked in the callback).
  command->add_option("--interface,-i", options->interface, "Interface to attach XDP to (required)");
  auto prepare_for = std::make_shared<std::string>();
  command->add_option("--prepare-for", *prepare_for,
                      "As root, before the daemon runs as USER without root: mount bpffs if needed, let users search "
                      "/sys/fs/bpf, create /sys/fs/bpf/xagg and /run/xagg for USER; then exit (docs/operations.md)");
  command->add_option("--netns", *netns, "Network namespace (ip netns name) to run in");
  command->add_option("--engine", *engine, "xdp (the product) or userspace (UDP sockets, for comparison)")
      ->check(CLI::IsMember({"xdp", "userspace"}))
      ->capture_default_str();
  command->add_option("--threads", options->userspace_threads, "userspace engine threads (0: one per CPU)")
      ->capture_default_str();
  command->add_flag("--generic", *generic, "Generic (skb) XDP, for drivers without native XDP");
  command->add_flag("--no-result-fan-out", *no_fan_out,
                    "Send each result from the CPU that completed its chunk (XDP_TX), not from the next CPU");
  command->add_option("--data-port", options->data_port, "UDP port of DATA packets")->capture_default_str();
  command->add_option("--control-port", options->control_port, "TCP port of the control endpoint")
      ->capture_default_str();
  command->add_option("--result-port-base", options->result_port_base, "Result port of the job in slot 0")
      ->capture_default_str();
  command->add_option("--memory-quota", options->memory_quota, "Bytes of aggregation memory for all jobs")
      ->capture_default_str();
  command->add_option("--broadcast", *broadcast, "RESULT destination (default: the interface's broadcast)")
      ->check(CLI::ValidIPV4);
  auto results = std::make_shared<std::string>("auto");
  command->add_option("--results", *results,
                      "How RESULTs reach the ranks: auto (broadcast when every rank of a job is on the interface's "
                      "subnet, else unicast), broadcast, multicast (needs --multicast-group) or unicast")
      ->check(CLI::IsMember({"auto", "broadcast", "multicast", "unicast"}))
      ->capture_default_str();
  auto multicast_group = std::make_shared<std::string>();
  command->add_option("--multicast-group", *multicast_group,
                      "--results multicast: the group of the job in slot 0; slot s uses this address plus s")
      ->check(CLI::ValidIPV4);
  auto metrics = std::make_shared<std::string>();
  command->add_option("--metrics", *metrics,
                      "Serve Prometheus /metrics and /healthz over HTTP on this IPv4 address (off by default)")
      ->check(CLI::ValidIPV4);
  command->add_option("--metrics-port", options->metrics_port, "TCP port of --metrics")->capture_default_str();
  auto secret_file = std::make_shared<std::string>();
  command->add_option("--secret-file", *secret_file,
                      "Admit only joins that prove knowledge of the cluster secret in this file (docs/security.md)")
      ->envname("XAGG_SECRET_FILE");
  auto parent_dead_after_ms = std::make_shared<uint32_t>(2000);
  command
      ->add_option("--parent-dead-after-ms", *parent_dead_after_ms,
                   "A leaf job's parent aggregator (two-level jobs, docs/design.md) is dead after this long "
                   "without answering heartbeats, beyond what TCP's loss repair accounts for (up to 4x this "
                   "on a lossy path; docs/reliability.md section 10); the leaf job then fails")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  command->callback([=] {
    if (!prepare_for->empty()) return control::prepare_for_user(*prepare_for);
    if (options->interface.empty()) throw CLI::RequiredError("--interface");
    if (!netns->empty()) enter_netns(*netns);
    options->parent_dead_after = std::chrono::milliseconds(*parent_dead_after_ms);  // first: everything below lives in the namespace
    options->engine = *engine == "xdp" ? control::EngineKind::Xdp : control::EngineKind::Userspace;
    options->mode = *generic ? dataplane::AttachMode::Generic : dataplane::AttachMode::Native;
    options->result_fan_out = !*no_fan_out;
    if (!broadcast->empty()) options->broadcast = in_addr{inet_addr(broadcast->c_str())};
    if (*results != "auto") options->results = wire::parse_result_mode(*results);
    if (!multicast_group->empty()) options->multicast_base = in_addr{inet_addr(multicast_group->c_str())};
    if (!metrics->empty()) options->metrics_address = in_addr{inet_addr(metrics->c_str())};
    if (!secret_file->empty()) options->secret = read_secret_file(*secret_file);
    control::run_aggregator(*options);
    spdlog::info("aggregator stopped");
  });
}

}  // namespace xagg::tools
