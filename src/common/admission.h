// Admission with a cluster secret (docs/protocol.md section 2.1): an
// aggregator that has one answers a join with a challenge nonce, and admits
// only a join that carries the HMAC-SHA256 of that nonce and the join's
// identity under the secret. Shared by the daemon and the worker library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "xagg/secret.h"

namespace xagg {

// 16 random bytes as 32 lower-case hex digits.
std::string random_nonce();

// The `auth` field of a join: lower-case hex of HMAC-SHA256(secret,
// "xagg-join <nonce> <job> <rank> <world_size>"), numbers in decimal.
std::string join_proof(std::string_view secret, std::string_view nonce, uint32_t job_id, uint32_t rank,
                       uint32_t world_size);

// Compares in constant time, so a timing side channel tells nothing.
bool proof_matches(std::string_view expected, std::string_view given);

}  // namespace xagg
