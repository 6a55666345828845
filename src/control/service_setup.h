// What an aggregator that runs without root needs from the host, said and
// prepared in one place: the daemon refuses to start naming it, `xagg doctor`
// reports it, and `xagg aggregator --prepare-for USER` (run as root, as the
// systemd unit's ExecStartPre does) provides it.
#pragma once

#include <optional>
#include <string>

namespace xagg::control {

inline constexpr const char* kBpffsRoot = "/sys/fs/bpf";
inline constexpr const char* kPinRoot = "/sys/fs/bpf/xagg";  // the per-interface pins `xagg stats` reads
inline constexpr const char* kRunDirectory = "/run/xagg";    // the interface locks

// Why this process (its effective ids and capabilities) cannot pin under
// kPinRoot of the mounted bpffs, naming the directory, its mode and owner;
// nullopt when it can, or when no bpffs is mounted (the data plane mounts one,
// which takes root anyway).
std::optional<std::string> pin_root_problem();

// The fix for pin_root_problem(), for the user this process runs as.
std::string prepare_command();

// As root: mounts bpffs if it is not, lets every user search (not list)
// kBpffsRoot, and creates kPinRoot and kRunDirectory owned by `user`, mode
// 0700, with whatever they hold. Idempotent; throws std::runtime_error
// naming what failed.
void prepare_for_user(const std::string& user);

}  // namespace xagg::control
