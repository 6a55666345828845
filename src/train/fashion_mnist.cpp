#include "fashion_mnist.h"

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <memory>
#include <stdexcept>

namespace xagg::train {
namespace {

constexpr const char* kFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                  "t10k-labels-idx1-ubyte"};

void gunzip(const std::filesystem::path& source, const std::filesystem::path& target) {
  std::unique_ptr<gzFile_s, decltype(&gzclose)> input(gzopen(source.c_str(), "rb"), &gzclose);
  if (!input) throw std::runtime_error(fmt::format("cannot open {}", source.string()));
  std::ofstream output(target, std::ios::binary | std::ios::trunc);
  char buffer[1 << 16];
  int bytes;
  while ((bytes = gzread(input.get(), buffer, sizeof buffer)) > 0) output.write(buffer, bytes);
  if (bytes < 0 || !output) throw std::runtime_error(fmt::format("cannot decompress {} into {}", source.string(), target.string()));
}

}  // namespace

std::filesystem::path decompressed_fashion_mnist(const std::filesystem::path& data_dir,
                                                 const std::filesystem::path& cache_dir) {
  std::filesystem::create_directories(cache_dir);
  for (const char* name : kFiles) {
    std::filesystem::path target = cache_dir / name;
    if (std::filesystem::exists(target)) continue;
    std::filesystem::path source = data_dir / (std::string(name) + ".gz");
    if (!std::filesystem::exists(source))
      throw std::runtime_error(fmt::format("Fashion-MNIST file {} is missing (apt-get install dataset-fashion-mnist)",
                                           source.string()));
    // Written under a per-process name and renamed: concurrent workers never read a partial file.
    std::filesystem::path partial = target;
    partial += fmt::format(".{}.partial", getpid());
    gunzip(source, partial);
    std::filesystem::rename(partial, target);
  }
  return cache_dir;
}

}  // namespace xagg::train
