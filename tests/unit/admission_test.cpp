// The cluster secret file is refused when it could leak or is too weak to
// matter, with a message naming the file and the fix.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "admission.h"

namespace xagg {
namespace {

namespace fs = std::filesystem;

class SecretFileTest : public ::testing::Test {
 protected:
  void write(const std::string& contents, mode_t mode) {
    std::ofstream(path_) << contents;
    chmod(path_.c_str(), mode);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string refusal() {
    try {
      read_secret_file(path_);
    } catch (const std::runtime_error& error) {
      return error.what();
    }
    return "";
  }

  fs::path dir_ = fs::temp_directory_path() / ("xagg-secret-" + std::to_string(getpid()));
  fs::path path_ = (fs::create_directories(dir_), dir_ / "secret");
};

TEST_F(SecretFileTest, ReadsThePrivateFileWithoutTheTrailingNewline) {
  write("0123456789abcdef0123\n", 0600);
  EXPECT_EQ(read_secret_file(path_), "0123456789abcdef0123");
}

TEST_F(SecretFileTest, RefusesAFileOthersCanRead) {
  write("0123456789abcdef0123\n", 0644);
  EXPECT_NE(refusal().find("chmod 600"), std::string::npos) << refusal();
}

TEST_F(SecretFileTest, RefusesAShortSecret) {
  write("short\n", 0600);
  EXPECT_NE(refusal().find("holds 5 bytes; a secret needs at least 16"), std::string::npos) << refusal();
}

TEST_F(SecretFileTest, RefusesAMissingFileNamingIt) {
  EXPECT_NE(refusal().find(path_.string()), std::string::npos) << refusal();
}

TEST(Admission, NoncesAreFreshHex) {
  const std::string first = random_nonce();
  EXPECT_EQ(first.size(), 32u);
  EXPECT_EQ(first.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(first, random_nonce());
}

}  // namespace
}  // namespace xagg
