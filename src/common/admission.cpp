#include "admission.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace xagg {
namespace {

std::string hex(const unsigned char* bytes, size_t size) {
  std::string text;
  for (size_t i = 0; i < size; ++i) text += fmt::format("{:02x}", bytes[i]);
  return text;
}

}  // namespace

std::string read_secret_file(const std::filesystem::path& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0)
    throw std::runtime_error(fmt::format("secret file {}: {}", path.string(), std::strerror(errno)));
  if (info.st_mode & (S_IRWXG | S_IRWXO))
    throw std::runtime_error(
        fmt::format("secret file {} is accessible to other users (mode {:o}); chmod 600 it", path.string(),
                    info.st_mode & 0777));
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  if (!file) throw std::runtime_error(fmt::format("secret file {}: cannot read it", path.string()));
  std::string secret = contents.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < kMinSecretBytes)
    throw std::runtime_error(fmt::format("secret file {} holds {} bytes; a secret needs at least {}", path.string(),
                                         secret.size(), kMinSecretBytes));
  return secret;
}

std::string random_nonce() {
  std::array<unsigned char, 16> bytes{};
  if (getrandom(bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))
    throw std::runtime_error("getrandom failed");
  return hex(bytes.data(), bytes.size());
}

std::string join_proof(std::string_view secret, std::string_view nonce, uint32_t job_id, uint32_t rank,
                       uint32_t world_size) {
  const std::string message = fmt::format("xagg-join {} {} {} {}", nonce, job_id, rank, world_size);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(), &length))
    throw std::runtime_error("HMAC-SHA256 failed");
  return hex(digest.data(), length);
}

bool proof_matches(std::string_view expected, std::string_view given) {
  return expected.size() == given.size() && CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

}  // namespace xagg
