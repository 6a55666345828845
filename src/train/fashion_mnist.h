// Fashion-MNIST as Debian ships it (dataset-fashion-mnist: gzip'd IDX files).
#pragma once

#include <cstdint>
#include <filesystem>

namespace xagg::train {

inline constexpr uint32_t kTrainImages = 60000;  // in Fashion-MNIST's training set

// Decompresses the four IDX files from data_dir into cache_dir unless already
// there, and returns cache_dir (the layout torch::data::datasets::MNIST reads).
// Safe when several workers do it at once. Throws std::runtime_error naming a missing file.
std::filesystem::path decompressed_fashion_mnist(const std::filesystem::path& data_dir,
                                                 const std::filesystem::path& cache_dir);

}  // namespace xagg::train
