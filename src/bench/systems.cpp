#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "bench.h"

namespace xagg::bench {

std::vector<std::string> system_names(std::span<const BenchSystem> systems) {
  std::vector<std::string> names;
  for (const BenchSystem& system : systems) names.emplace_back(system.name);
  return names;
}

const BenchSystem& system_named(std::span<const BenchSystem> systems, const std::string& name) {
  for (const BenchSystem& system : systems)
    if (name == system.name) return system;
  throw std::invalid_argument(
      fmt::format("unknown system '{}' (known: {})", name, fmt::join(system_names(systems), ", ")));
}

std::vector<std::string> systems_at_wire_bits(std::span<const BenchSystem> systems,
                                              const std::vector<std::string>& names, uint32_t wire_bits) {
  if (wire_bits != 32 && wire_bits != 16)
    throw std::invalid_argument(fmt::format("wire bits {}: 32 or 16 bits per element", wire_bits));
  std::vector<std::string> chosen;
  for (const std::string& name : names) {
    const BenchSystem& system = system_named(systems, name);
    const std::string narrow = name + "16";
    const bool has_narrow = std::ranges::any_of(systems, [&](const BenchSystem& s) { return narrow == s.name; });
    chosen.push_back(wire_bits == 16 && system.wire_bits == 32 && has_narrow ? narrow : name);
    if (std::ranges::count(chosen, chosen.back()) > 1)
      throw std::invalid_argument(fmt::format("systems [{}] at {} bits per element name {} twice",
                                              fmt::join(names, ", "), wire_bits, chosen.back()));
  }
  return chosen;
}

}  // namespace xagg::bench
