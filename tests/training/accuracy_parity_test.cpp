// Accuracy parity: training with 4 workers through XAgg, gradients averaged in
// buckets during backward, reaches the accuracy of a single process with the
// same global batch, seed and schedule (a short run: 6,400 training images,
// one epoch; all 10,000 test images, so that one image is 0.01 points), also on
// the 16-bit wire; and DDP with xagg_torch.wire16_hook that of DDP with fp16_compress_hook.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process.h"

namespace {

namespace fs = std::filesystem;
using xagg::run_command;

constexpr double kParityPoints = 0.5;  // percentage points of test accuracy

class AccuracyParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_FAIL() << "the training tests need root (network namespaces, XDP)";
    if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      GTEST_FAIL() << "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist";
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  // Runs `xagg train` on a fixed subset and returns its JSON log.
  nlohmann::json train(const std::string& backend, uint32_t workers, const std::string& train_samples = "6400",
                       const std::vector<std::string>& options = {}) {
    fs::path log = directory_ / (backend + std::to_string(runs_++) + ".json");
    std::vector<std::string> argv = {XAGG_BINARY, "train", "--backend", backend, "--workers", std::to_string(workers),
                                     "--epochs", "1", "--train-samples", train_samples, "--batch-size", "64",
                                     "--seed", "7", "--bucket-elements", "32768", "--log", log.string()};
    argv.insert(argv.end(), options.begin(), options.end());
    run_command(argv, std::chrono::minutes(5));
    return nlohmann::json::parse(std::ifstream(log));
  }
  static double accuracy(const nlohmann::json& log) { return log["epochs"].at(0)["test_accuracy"]; }

  fs::path directory_ = fs::temp_directory_path() / ("xtrain-test-" + std::to_string(getpid()));
  uint32_t runs_ = 0;
};

TEST_F(AccuracyParity, FourXaggWorkersMatchASingleProcess) {
  nlohmann::json single = train("none", 1);
  nlohmann::json xagg = train("xagg", 4);

  ASSERT_EQ(single["epochs"].size(), 1u);
  ASSERT_EQ(xagg["epochs"].size(), 1u);
  EXPECT_GT(accuracy(single), 50.0) << "the model did not learn: the comparison says nothing";
  EXPECT_NEAR(accuracy(xagg), accuracy(single), kParityPoints);
  // The gradient went out in several buckets, each while backward still ran.
  EXPECT_GE(xagg["start"]["buckets"].get<int>(), 2);
  EXPECT_GT(xagg["epochs"][0]["comm_share"].get<double>(), 0.0);
  // 16-bit gradients: the same on the 16-bit wire (docs/protocol.md section 11).
  EXPECT_NEAR(accuracy(train("xagg", 4, "6400", {"--wire-bits", "16"})), accuracy(single), kParityPoints)
      << "xagg on the 16-bit wire";
}

// 16-bit gradients through PyTorch DDP (docs/training.md): xagg_torch.wire16_hook reaches the
// accuracy of the anchor, DDP on Gloo with torch's fp16_compress_hook (2 workers, 3,200
// images: 50 steps). DDP's trajectory is its own: xagg-train's buckets are not compared with it.
TEST_F(AccuracyParity, Wire16HookMatchesDdpFp16Compression) {
  if (!fs::exists(XAGG_TORCH_DIR "/xagg_torch/__init__.py")) GTEST_FAIL() << "xagg_torch is not built";
  const double anchor = accuracy(train("ddp-gloo-fp16", 2, "3200"));
  EXPECT_GT(anchor, 50.0) << "the anchor did not learn: the comparison says nothing";
  EXPECT_NEAR(accuracy(train("ddp-hook16", 2, "3200")), anchor, kParityPoints);
}

}  // namespace
