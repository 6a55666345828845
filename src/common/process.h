// Child processes for the testbed, the demo, the tests and the host checks of
// `xagg doctor`: spawn, wait with a deadline (never hang), and kill on scope
// exit; short commands run to completion; and the temporary directories they share.
#pragma once

#include <signal.h>

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xagg {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  // For xagg sub-commands: appended as `--netns NAME`, the child enters the namespace itself.
  std::optional<std::string> netns;
  // stdout and stderr go here; without a file they are captured in memory.
  std::optional<std::filesystem::path> output_file;
};

struct ProcessResult {
  int exit_code = -1;  // 128 + signal number when killed by a signal
  bool timed_out = false;
  std::string output;  // stdout and stderr interleaved
};

using Clock = std::chrono::steady_clock;
inline constexpr std::chrono::milliseconds kKillGrace{3000};  // between SIGTERM and SIGKILL

class Process {
 public:
  explicit Process(ProcessSpec spec);  // throws std::system_error when it cannot start
  ~Process();                          // terminates the child if still running
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) = delete;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // Exit code once the child has exited; never blocks.
  std::optional<int> poll();
  // Waits until exit or deadline; past the deadline sends SIGTERM, then SIGKILL.
  ProcessResult wait(Clock::time_point deadline);
  // SIGTERM, SIGKILL after the grace period; returns the result.
  ProcessResult terminate(std::chrono::milliseconds grace = kKillGrace);
  std::string output() const;

 private:
  ProcessResult result(bool timed_out) const;

  std::string name_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  int output_fd_ = -1;  // the child's stdout/stderr (memfd or file), read back from offset 0
};

// While one lives, SIGINT, SIGTERM and SIGHUP only raise a flag that the waits
// below check (throw_if_interrupted), so that an interrupted command unwinds:
// stopping its processes and tearing its testbed down instead of dying and
// leaving them in place. SIGPIPE is ignored for the same reason: a reader of
// its output that went away (`xagg bench ... | head`) makes a write fail, not
// the command die. The previous handlers come back with its end.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
  struct sigaction previous_hangup_ {};
  struct sigaction previous_pipe_ {};
};

// Throws std::runtime_error naming the signal once one arrived under an InterruptGuard.
void throw_if_interrupted();

// Waits for all; once the deadline passes or `cancelled` returns true, terminates
// the rest (marked timed_out); throws (throw_if_interrupted) once interrupted.
// Results are in the order of `processes`.
std::vector<ProcessResult> wait_all(std::span<Process> processes, Clock::time_point deadline,
                                    const std::function<bool()>& cancelled = {});

// A command that failed: names the command and carries its output.
struct CommandError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs a short command (ip, sysctl) to completion and returns its output;
// throws CommandError with the command line and its stderr when it fails.
std::string run_command(const std::vector<std::string>& argv,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30));

// run_command for a command whose failure is an answer (a device that does
// not exist, a qdisc removed already): false, logged at debug level.
bool try_command(const std::vector<std::string>& argv);

// A fresh directory under the system's temporary directory (name_prefix plus
// a unique suffix), removed with everything in it when the object goes.
class TempDirectory {
 public:
  explicit TempDirectory(const std::string& name_prefix);
  ~TempDirectory();
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace xagg
