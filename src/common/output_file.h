// Result files of the benchmarks and of training runs: opened before the run,
// so that a bad path fails at once rather than after it, and checked when
// closed, so that a full disk is an error rather than a short file.
#pragma once

#include <filesystem>
#include <fstream>

namespace xagg {

// Throws std::runtime_error naming the path when it cannot be created.
std::ofstream open_output(const std::filesystem::path& path);

// Closes the file (complete for whoever reads it next); throws naming the path if writing failed.
void close_output(std::ofstream& file, const std::filesystem::path& path);

}  // namespace xagg
