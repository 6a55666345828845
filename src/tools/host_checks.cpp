#include "host_checks.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/capability.h>
#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/magic.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "capabilities.h"
#include "daemon.h"
#include "inet.h"
#include "process.h"
#include "service_setup.h"
#include "unique_fd.h"
#include "xagg_pass.skel.h"

namespace xagg::tools {
namespace {

using dataplane::AttachMode;

constexpr const char* kBtfPath = "/sys/kernel/btf/vmlinux";
using control::kBpffsRoot;
using control::kRunDirectory;

CheckResult ok(std::string name, std::string found) { return {std::move(name), CheckStatus::Ok, std::move(found), {}}; }
CheckResult warn(std::string name, std::string found, std::string fix) {
  return {std::move(name), CheckStatus::Warn, std::move(found), std::move(fix)};
}
CheckResult fail(std::string name, std::string found, std::string fix) {
  return {std::move(name), CheckStatus::Fail, std::move(found), std::move(fix)};
}

// A command's output (in an error) made fit for a one-line report.
std::string one_line(std::string text) {
  std::ranges::replace(text, '\n', ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

const char* mode_name(AttachMode mode) { return mode == AttachMode::Native ? "native" : "generic"; }

struct KernelVersion {
  std::string release;  // uname -r
  int major = 0;
  int minor = 0;
  bool at_least(int wanted_major, int wanted_minor) const {
    return major > wanted_major || (major == wanted_major && minor >= wanted_minor);
  }
};

KernelVersion running_kernel() {
  utsname names{};
  uname(&names);
  KernelVersion kernel{names.release};
  std::sscanf(names.release, "%d.%d", &kernel.major, &kernel.minor);
  return kernel;
}

// xdp.frags programs and bpf_xdp_load_bytes, which the data plane is built on, came with Linux 5.18.
constexpr int kMinKernelMajor = 5;
constexpr int kMinKernelMinor = 18;

CheckResult check_kernel(const KernelVersion& kernel) {
  if (!kernel.at_least(kMinKernelMajor, kMinKernelMinor))
    return fail("kernel",
                fmt::format("Linux {}: the data plane needs {}.{} or later (xdp.frags programs, bpf_xdp_load_bytes)",
                            kernel.release, kMinKernelMajor, kMinKernelMinor),
                fmt::format("boot a kernel >= {}.{} (Debian 12 ships 6.1)", kMinKernelMajor, kMinKernelMinor));
  if (!std::filesystem::exists(kBtfPath))
    return warn("kernel",
                fmt::format("Linux {} without {}: xagg's programs carry their own BTF and use no CO-RE, so they load "
                            "(see 'data plane'), but tools that need the kernel's types (bpftool btf, bpftrace) fail",
                            kernel.release, kBtfPath),
                "a kernel built with CONFIG_DEBUG_INFO_BTF=y (Debian's are)");
  return ok("kernel", fmt::format("Linux {}, BTF at {}", kernel.release, kBtfPath));
}

CheckResult check_privileges() {
  const std::vector<std::string> missing = missing_capabilities(dataplane::kRequiredCapabilities);
  const std::string who = geteuid() == 0 ? "root" : fmt::format("uid {}", geteuid());
  if (!missing.empty())
    return fail("privileges", fmt::format("{}, without {}", who, fmt::join(missing, ", ")),
                fmt::format("grant {} (systemd: AmbientCapabilities=, as the shipped unit does; docker: --cap-add "
                            "for each), or run as root",
                            fmt::join(missing, ", ")));
  return ok("privileges", fmt::format("{}, with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON", who));
}

CheckResult check_bpffs() {
  struct statfs fs {};
  if (statfs(kBpffsRoot, &fs) == 0 && fs.f_type == BPF_FS_MAGIC) {
    if (auto problem = control::pin_root_problem()) return fail("bpffs", *problem, control::prepare_command());
    return ok("bpffs", fmt::format("mounted at {}, {} usable", kBpffsRoot, control::kPinRoot));
  }
  // The aggregator mounts it itself (dataplane.cpp), which takes CAP_SYS_ADMIN and the directory.
  static constexpr std::array<Capability, 1> kMount{{{CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}}};
  if (std::filesystem::is_directory(kBpffsRoot) && missing_capabilities(kMount).empty())
    return ok("bpffs", fmt::format("not mounted at {}; the aggregator mounts it when it starts", kBpffsRoot));
  return fail("bpffs",
              fmt::format("not mounted at {}, and this process cannot mount it (no directory or no "
                          "CAP_SYS_ADMIN)",
                          kBpffsRoot),
              fmt::format("mount -t bpf bpf {}", kBpffsRoot));
}

CheckResult check_run_directory() {
  if (std::filesystem::exists(kRunDirectory)) {
    if (access(kRunDirectory, W_OK) == 0) return ok("run directory", fmt::format("{} is writable", kRunDirectory));
    return fail("run directory", fmt::format("{} is not writable: {}", kRunDirectory, std::strerror(errno)),
                control::prepare_command());
  }
  const std::string parent = std::filesystem::path(kRunDirectory).parent_path();
  if (access(parent.c_str(), W_OK) == 0)
    return ok("run directory", fmt::format("{} does not exist yet; the aggregator creates it", kRunDirectory));
  return fail("run directory",
              fmt::format("{} does not exist and {} is not writable: {}", kRunDirectory, parent, std::strerror(errno)),
              fmt::format("mkdir -p {} as root", kRunDirectory));
}

std::string describe_limit(rlim_t bytes) {
  return bytes == RLIM_INFINITY ? "unlimited" : fmt::format("{} KiB", bytes / 1024);
}

CheckResult check_memlock(const KernelVersion& kernel) {
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  // Since 5.11 BPF maps are charged to the memory cgroup instead of RLIMIT_MEMLOCK.
  if (kernel.at_least(5, 11))
    return ok("memlock", fmt::format("RLIMIT_MEMLOCK {} does not matter: Linux {} charges BPF memory to the "
                                     "memory cgroup (since 5.11)",
                                     describe_limit(limit.rlim_cur), kernel.release));
  const uint64_t quota = control::DaemonOptions{}.memory_quota;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= quota)
    return ok("memlock", fmt::format("RLIMIT_MEMLOCK {}", describe_limit(limit.rlim_cur)));
  return warn("memlock",
              fmt::format("RLIMIT_MEMLOCK {}: before Linux 5.11 it caps all BPF maps, and the jobs' cells may take up "
                          "to --memory-quota ({} MiB by default)",
                          describe_limit(limit.rlim_cur), quota >> 20),
              "ulimit -l unlimited before starting the aggregator (systemd: LimitMEMLOCK=infinity)");
}

struct InterfaceInfo {
  int index = 0;
  bool up = false;
  bool running = false;  // carrier and operational state up
  int mtu = 0;
  std::string driver;  // "veth", "mlx5_core", ... (empty when unknown)
  std::optional<InterfaceAddress> ipv4;
};

// Through ioctls on a socket of this network namespace: /sys/class/net shows
// the namespace sysfs was mounted in, not the one setns entered.
std::optional<InterfaceInfo> read_interface(const std::string& name) {
  InterfaceInfo info;
  info.index = static_cast<int>(if_nametoindex(name.c_str()));
  if (info.index == 0) return std::nullopt;
  UniqueFd socket_fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq request{};
  std::snprintf(request.ifr_name, sizeof(request.ifr_name), "%s", name.c_str());
  if (ioctl(socket_fd.get(), SIOCGIFFLAGS, &request) == 0) {
    info.up = request.ifr_flags & IFF_UP;
    info.running = request.ifr_flags & IFF_RUNNING;
  }
  if (ioctl(socket_fd.get(), SIOCGIFMTU, &request) == 0) info.mtu = request.ifr_mtu;
  ethtool_drvinfo driver{};
  driver.cmd = ETHTOOL_GDRVINFO;
  request.ifr_data = reinterpret_cast<char*>(&driver);
  if (ioctl(socket_fd.get(), SIOCETHTOOL, &request) == 0) info.driver = driver.driver;
  info.ipv4 = ipv4_of(name);
  return info;
}

CheckResult check_interface(const std::string& name, const std::optional<InterfaceInfo>& info) {
  if (!info)
    return fail(
        "interface", fmt::format("no interface {} in this network namespace", name),
        "name the aggregator's interface (`ip -br link` lists them), with --netns NAME if it is in a namespace");
  const std::string label = info->driver.empty() ? name : fmt::format("{} ({})", name, info->driver);
  if (!info->up) return fail("interface", label + " is down", fmt::format("ip link set dev {} up", name));
  if (!info->ipv4)
    return fail("interface",
                label + " has no IPv4 address: workers send DATA and join there, results go to its subnet's broadcast",
                fmt::format("ip addr add ADDRESS/PREFIX dev {}", name));
  const std::string addresses = fmt::format("address {}, results broadcast to {}", xagg::to_string(info->ipv4->address),
                                            xagg::to_string(info->ipv4->broadcast));
  if (!info->running)
    return warn("interface", fmt::format("{} is up but has no carrier; {}", label, addresses),
                "connect the link (a veth: bring its peer up)");
  return ok("interface", fmt::format("{} is up, {}", label, addresses));
}

CheckResult check_mtu(const std::string& name, const InterfaceInfo& info) {
  const size_t mtu = static_cast<size_t>(info.mtu);
  if (mtu < wire::kMinLinkMtu)
    return fail("mtu", fmt::format("{} has MTU {}, below the {} a job needs", name, info.mtu, wire::kMinLinkMtu),
                fmt::format("ip link set dev {} mtu 9000 (or at least {}, the same on every link of the job)", name,
                            wire::kMinLinkMtu));
  const uint32_t chunk = wire::chunk_elements_for(static_cast<uint32_t>(std::min<size_t>(mtu, UINT32_MAX)));
  if (mtu < wire::kJumboMtu)
    return warn("mtu",
                fmt::format("{} has MTU {}: jobs get chunks of at most {} elements, and {} times the packets of an "
                            "MTU of {}",
                            name, info.mtu, chunk, fmt::format("{:.1f}", double(wire::kChunkElems) / chunk),
                            wire::kJumboMtu),
                fmt::format("ip link set dev {} mtu 9000, with jumbo frames on every link of the job", name));
  return ok("mtu", fmt::format("{} has MTU {}: chunks of {} elements, the most a packet carries", name, info.mtu,
                               chunk));
}

std::optional<int> read_sysctl(const std::string& path) {
  std::ifstream file(path);
  int value = 0;
  if (file >> value) return value;
  return std::nullopt;
}

CheckResult check_rp_filter(const std::string& name) {
  // The kernel applies the larger of "all" and the interface's own setting.
  auto all = read_sysctl("/proc/sys/net/ipv4/conf/all/rp_filter");
  auto own = read_sysctl(fmt::format("/proc/sys/net/ipv4/conf/{}/rp_filter", name));
  if (!all || !own) return warn("rp_filter", "cannot read net.ipv4.conf.*.rp_filter", "check /proc/sys is mounted");
  const int effective = std::max(*all, *own);
  const std::string setting =
      fmt::format("net.ipv4.conf.all.rp_filter={}, net.ipv4.conf.{}.rp_filter={}", *all, name, *own);
  if (effective != 1) return ok("rp_filter", fmt::format("{} ({})", effective == 0 ? "off" : "loose", setting));
  // Strict mode drops a packet whose source is not routed back out of the
  // interface it came in on. Workers must share the interface's broadcast
  // domain to get results, so their addresses are routed through it.
  return ok("rp_filter",
            fmt::format("strict ({}), harmless here: XDP takes DATA before the reverse-path filter and sends "
                        "results by XDP_TX; only control connections pass it, and workers in {}'s subnet pass it",
                        setting, name));
}

struct AttachedProgram {
  uint32_t id = 0;
  std::string name;
  std::string detach_command;
};

std::optional<AttachedProgram> attached_program(const std::string& ifname, int ifindex) {
  LIBBPF_OPTS(bpf_xdp_query_opts, query);
  if (bpf_xdp_query(ifindex, 0, &query) != 0) return std::nullopt;
  for (auto [id, keyword] : {std::pair{query.drv_prog_id, "xdpdrv"}, std::pair{query.skb_prog_id, "xdpgeneric"},
                             std::pair{query.hw_prog_id, "xdpoffload"}})
    if (id != 0)
      return AttachedProgram{id, dataplane::program_name(id),
                             fmt::format("ip link set dev {} {} off", ifname, keyword)};
  return std::nullopt;
}

CheckResult check_attached_program(const std::string& ifname, const std::optional<AttachedProgram>& program) {
  if (!program) return ok("xdp program", fmt::format("no XDP program on {}", ifname));
  if (program->name == dataplane::kProgramName)
    return warn(
        "xdp program",
        fmt::format("an xagg aggregator already runs on {} (XDP program {} '{}')", ifname, program->id, program->name),
        fmt::format("stop it to check the host for a new one; `xagg stats --interface {}` shows its counters", ifname));
  return fail(
      "xdp program",
      fmt::format("{} already runs XDP program {} '{}'; the aggregator needs the interface to itself", ifname,
                  program->id, program->name),
      fmt::format("{} (`bpftool net show dev {}` tells which process attached it)", program->detach_command, ifname));
}

// Loads the pass-through stub, with or without BPF_F_XDP_HAS_FRAGS, and
// attaches it in `mode` through a bpf_link, which detaches when closed:
// 0 when both worked, the errno of the first step that failed otherwise.
int probe_xdp_attach(int ifindex, AttachMode mode, bool multi_buffer) {
  std::unique_ptr<xagg_pass_bpf, decltype(&xagg_pass_bpf__destroy)> skeleton(xagg_pass_bpf__open(),
                                                                             &xagg_pass_bpf__destroy);
  if (!skeleton) return errno;
  bpf_program* program = skeleton->progs.xagg_pass;
  if (!multi_buffer) bpf_program__set_flags(program, bpf_program__flags(program) & ~BPF_F_XDP_HAS_FRAGS);
  if (int rc = xagg_pass_bpf__load(skeleton.get()); rc < 0) return -rc;
  LIBBPF_OPTS(bpf_link_create_opts, link_options, .flags = dataplane::xdp_mode_flags(mode));
  UniqueFd link(bpf_link_create(bpf_program__fd(program), ifindex, BPF_XDP, &link_options));
  return link ? 0 : errno;
}

// Why an XDP program would not attach, and what to do about it.
CheckResult explain_attach_failure(const std::string& name, const std::string& ifname, const InterfaceInfo& info,
                                   AttachMode mode, int error) {
  const std::string refused =
      fmt::format("{} refused XDP in {} mode: {}", ifname, mode_name(mode), std::strerror(error));
  switch (error) {
    case EPERM:
      return fail(name, refused, "grant the capabilities (see 'privileges')");
    case EOPNOTSUPP:
      if (mode == AttachMode::Native) {
        bool generic_works = probe_xdp_attach(info.index, AttachMode::Generic, true) == 0;
        return fail(name,
                    fmt::format("the driver of {} has no native XDP{}", ifname,
                                generic_works ? "; generic mode attaches" : ", nor does generic mode attach"),
                    "run the aggregator with --generic (slower: XDP on socket buffers), or use a NIC whose driver "
                    "has native XDP");
      }
      break;
    case EINVAL:
    case ERANGE:
      return fail(name,
                  fmt::format("{}; drivers without XDP multi-buffer support refuse XDP above about a page of MTU "
                              "(3506 on veth), and {} has MTU {}",
                              refused, ifname, info.mtu),
                  "run the aggregator with --generic, or use a driver with XDP multi-buffer support");
  }
  return fail(name, refused,
              fmt::format("see `dmesg`; try --{} mode", mode == AttachMode::Native ? "generic" : "native"));
}

// Whether an XDP program attaches in the aggregator's mode, and whether a
// multi-buffer (xdp.frags) one does, as the aggregator's programs are.
std::vector<CheckResult> check_xdp_attach(const std::string& ifname, const InterfaceInfo& info, AttachMode mode,
                                          const std::optional<AttachedProgram>& attached) {
  const std::string attach_name = fmt::format("xdp {}", mode_name(mode));
  const std::string frags_name = "xdp multi-buffer";
  if (attached) {
    std::string reason = fmt::format("not checked: {} runs XDP program {} (see 'xdp program')", ifname, attached->id);
    std::string fix =
        attached->name == dataplane::kProgramName ? "stop the running aggregator first" : "remove the program first";
    return {warn(attach_name, reason, fix), warn(frags_name, reason, fix)};
  }
  int frags_error = probe_xdp_attach(info.index, mode, true);
  if (frags_error == 0) {
    CheckResult attach = ok(attach_name, fmt::format("a pass-through XDP program attached to {} in {} mode and "
                                                     "detached again",
                                                     ifname, mode_name(mode)));
    if (static_cast<size_t>(info.mtu) < wire::kJumboMtu)
      return {attach, warn(frags_name,
                           fmt::format("an xdp.frags program attached, but at MTU {}: frames of {} bytes not proven",
                                       info.mtu, wire::kJumboMtu),
                           "raise the MTU (see 'mtu') and check again")};
    return {attach, ok(frags_name, fmt::format("an xdp.frags program (BPF_F_XDP_HAS_FRAGS) attached at MTU {}: "
                                               "{}-byte frames reach XDP whole",
                                               info.mtu, wire::kJumboMtu))};
  }
  int single_error = probe_xdp_attach(info.index, mode, false);
  if (single_error != 0)
    return {
        explain_attach_failure(attach_name, ifname, info, mode, single_error),
        warn(frags_name, fmt::format("not checked: no XDP program attaches to {} in {} mode", ifname, mode_name(mode)),
             fmt::format("fix '{}' first", attach_name))};
  return {ok(attach_name, fmt::format("a single-buffer XDP program attached to {} in {} mode and detached again",
                                      ifname, mode_name(mode))),
          fail(frags_name,
               fmt::format("an xdp.frags program (BPF_F_XDP_HAS_FRAGS) was refused: {}", std::strerror(frags_error)),
               fmt::format("a kernel >= {}.{} and a driver with XDP multi-buffer support, or --generic",
                           kMinKernelMajor, kMinKernelMinor))};
}

CheckResult check_data_plane(uint16_t data_port, bool privileged) {
  try {
    dataplane::Dataplane::load({.udp_port = data_port, .result_fan_out = control::DaemonOptions{}.result_fan_out});
    return ok("data plane", fmt::format("the aggregator's program {} passes the verifier and loads (not attached)",
                                        dataplane::kProgramName));
  } catch (const std::exception& error) {
    return fail(
        "data plane", error.what(),
        privileged ? "read the libbpf messages on stderr (the verifier's reason)" : "grant the capabilities (see 'privileges')");
  }
}

// An executable in PATH, or in the sbin directories a user's PATH may lack.
std::optional<std::string> find_program(const std::string& name) {
  std::string directories = std::getenv("PATH") ? std::getenv("PATH") : "";
  directories += ":/usr/sbin:/sbin";
  for (size_t start = 0; start <= directories.size();) {
    size_t end = std::min(directories.find(':', start), directories.size());
    std::string candidate = (std::filesystem::path(directories.substr(start, end - start)) / name).string();
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

std::vector<CheckResult> check_firewall(uint16_t data_port, uint16_t control_port) {
  std::vector<std::string> command;
  std::vector<FirewallChain> (*parse)(std::string_view) = nullptr;
  std::string tool;
  if (auto nft = find_program("nft")) {
    command = {*nft, "-j", "list", "ruleset"};
    parse = parse_nft_json;
    tool = "nft";
  } else if (auto iptables_save = find_program("iptables-save")) {
    command = {*iptables_save};
    parse = parse_iptables_save;
    tool = "iptables";
  } else {
    return {ok("firewall", "no firewall tool (nft, iptables-save) found, not checked")};
  }
  try {
    return check_firewall_rules(parse(xagg::run_command(command)), tool, data_port, control_port);
  } catch (const std::exception& error) {
    return {warn("firewall", fmt::format("cannot read the rules: {}", one_line(error.what())),
                 fmt::format("check by hand that nothing drops TCP {} on the way in", control_port))};
  }
}

CheckResult check_control_port(const InterfaceAddress& address, uint16_t port, bool aggregator_running) {
  const std::string where = fmt::format("{}:{}", xagg::to_string(address.address), port);
  UniqueFd socket_fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int on = 1;  // as the daemon binds: connections in TIME_WAIT do not count
  setsockopt(socket_fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr = address.address;
  local.sin_port = htons(port);
  if (bind(socket_fd.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) == 0)
    return ok("control port", fmt::format("nothing listens on TCP {}", where));
  if (errno == EADDRINUSE && aggregator_running)
    return warn("control port", fmt::format("TCP {} is in use, by the running aggregator presumably", where),
                "stop that aggregator first");
  if (errno == EADDRINUSE)
    return fail("control port", fmt::format("TCP {} is in use by another program", where),
                fmt::format("stop it (`ss -ltnp 'sport = :{}'` names it) or give the aggregator another "
                            "--control-port",
                            port));
  return fail("control port", fmt::format("cannot bind TCP {}: {}", where, std::strerror(errno)), "see the error");
}

}  // namespace

std::string_view to_string(CheckStatus status) {
  switch (status) {
    case CheckStatus::Ok:
      return "OK";
    case CheckStatus::Warn:
      return "WARN";
    case CheckStatus::Fail:
      return "FAIL";
  }
  return "?";
}

std::vector<CheckResult> check_firewall_rules(const std::vector<FirewallChain>& chains, std::string_view tool,
                                              uint16_t data_port, uint16_t control_port) {
  std::vector<CheckResult> results;
  auto describe = [](const PortVerdict& verdict) {
    if (verdict.by_policy)
      return fmt::format("chain '{}' drops it by policy and no rule accepts it", verdict.chain->where);
    return fmt::format("rule '{}' {} it", verdict.blocking_rule->where,
                       verdict.blocking_rule->verdict == Verdict::Reject ? "rejects" : "drops");
  };

  const std::string control = "firewall control";
  if (auto verdict = find_blocking(chains, "tcp", control_port); !verdict) {
    results.push_back(ok(control, fmt::format("no {} rule drops TCP {} (joins)", tool, control_port)));
  } else if (verdict->by_policy) {
    // Rules we cannot judge (by source address, say) may still accept the workers.
    results.push_back(warn(control, fmt::format("TCP {} (joins): {}", control_port, describe(*verdict)),
                           fmt::format(fmt::runtime(verdict->chain->accept_command), fmt::arg("protocol", "tcp"),
                                       fmt::arg("port", control_port))));
  } else {
    results.push_back(fail(control,
                           fmt::format("TCP {} (joins): {}; workers cannot join", control_port, describe(*verdict)),
                           fmt::format("{}, or accept TCP {} from the workers before it",
                                       verdict->blocking_rule->delete_command, control_port)));
  }

  // XDP runs before every netfilter hook and sends results by XDP_TX, which
  // bypasses them too: no rule on this host can touch the data path.
  const std::string data = "firewall data";
  if (auto verdict = find_blocking(chains, "udp", data_port))
    results.push_back(ok(data, fmt::format("UDP {}: {}, but XDP takes DATA before netfilter and sends results by "
                                           "XDP_TX, so it does not matter (it would to --engine userspace)",
                                           data_port, describe(*verdict))));
  else
    results.push_back(
        ok(data, fmt::format("no {} rule drops UDP {}, and XDP takes DATA before netfilter anyway", tool, data_port)));
  return results;
}

std::vector<CheckResult> check_host(const HostCheckOptions& options) {
  const KernelVersion kernel = running_kernel();
  const CheckResult privileges = check_privileges();
  std::vector<CheckResult> results{check_kernel(kernel), privileges, check_bpffs(), check_run_directory(),
                                   check_memlock(kernel)};
  const std::optional<InterfaceInfo> info = read_interface(options.interface);
  results.push_back(check_interface(options.interface, info));
  std::optional<AttachedProgram> attached;
  if (info) {
    results.push_back(check_mtu(options.interface, *info));
    results.push_back(check_rp_filter(options.interface));
    attached = attached_program(options.interface, info->index);
    results.push_back(check_attached_program(options.interface, attached));
    for (CheckResult& result : check_xdp_attach(options.interface, *info, options.mode, attached))
      results.push_back(std::move(result));
  }
  results.push_back(check_data_plane(options.data_port, privileges.status == CheckStatus::Ok));
  for (CheckResult& result : check_firewall(options.data_port, options.control_port))
    results.push_back(std::move(result));
  if (info && info->ipv4) {
    bool aggregator_running = attached && attached->name == dataplane::kProgramName;
    results.push_back(check_control_port(*info->ipv4, options.control_port, aggregator_running));
  }
  return results;
}

}  // namespace xagg::tools
