// The cluster secret an aggregator may require of every join
// (CommunicatorConfig::cluster_secret, docs/security.md "Admission").
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace xagg {

inline constexpr size_t kMinSecretBytes = 16;

// The secret in `path`, without trailing newlines. Throws std::runtime_error
// naming the file when it cannot be read, is shorter than kMinSecretBytes, or
// can be read by other users (chmod 600).
std::string read_secret_file(const std::filesystem::path& path);

}  // namespace xagg
