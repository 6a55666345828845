// Accuracy parity: training with 4 workers through XAgg, gradients averaged in
// buckets during backward, reaches the accuracy of a single process with the
// same global batch, seed and schedule (a short run: 6,400 training images,
// one epoch; all 10,000 test images, so that one image is 0.01 points).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  nlohmann::json train(const std::string& backend, uint32_t workers) {
    fs::path log = directory_ / (backend + ".json");
    run_command({XAGG_BINARY, "train", "--backend", backend, "--workers", std::to_string(workers), "--epochs", "1",
                 "--train-samples", "6400", "--batch-size", "64", "--seed", "7",
                 "--bucket-elements", "32768", "--log", log.string()},
                std::chrono::minutes(5));
    return nlohmann::json::parse(std::ifstream(log));
  }

  fs::path directory_ = fs::temp_directory_path() / ("xtrain-test-" + std::to_string(getpid()));
};

TEST_F(AccuracyParity, FourXaggWorkersMatchASingleProcess) {
  nlohmann::json single = train("none", 1);
  nlohmann::json xagg = train("xagg", 4);

  ASSERT_EQ(single["epochs"].size(), 1u);
  ASSERT_EQ(xagg["epochs"].size(), 1u);
  double single_accuracy = single["epochs"][0]["test_accuracy"];
  double xagg_accuracy = xagg["epochs"][0]["test_accuracy"];
  EXPECT_GT(single_accuracy, 50.0) << "the model did not learn: the comparison says nothing";
  EXPECT_NEAR(xagg_accuracy, single_accuracy, kParityPoints);
  // The gradient went out in several buckets, each while backward still ran.
  EXPECT_GE(xagg["start"]["buckets"].get<int>(), 2);
  EXPECT_GT(xagg["epochs"][0]["comm_share"].get<double>(), 0.0);
}

}  // namespace
