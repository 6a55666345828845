#include "process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

namespace xagg {
namespace {

constexpr std::chrono::milliseconds kPollInterval{5};

volatile sig_atomic_t interrupted_by = 0;  // the signal, set by the handler

void note_interrupt(int signal_number) { interrupted_by = signal_number; }

std::system_error system_error(const std::string& what) {
  return std::system_error(errno, std::generic_category(), what);
}

int open_output(const ProcessSpec& spec) {
  int fd = spec.output_file ? open(spec.output_file->c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                            : memfd_create("xagg-process-output", MFD_CLOEXEC);
  if (fd < 0) throw system_error("cannot open the output of a child process");
  return fd;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

Process::Process(ProcessSpec spec) {
  if (spec.argv.empty()) throw std::invalid_argument("Process: empty argv");
  if (spec.netns) {
    spec.argv.push_back("--netns");
    spec.argv.push_back(*spec.netns);
  }
  name_ = fmt::format("{}", fmt::join(spec.argv, " "));
  output_fd_ = open_output(spec);

  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& arg : spec.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();

  pid_ = fork();
  if (pid_ < 0) {
    close(output_fd_);
    throw system_error("fork");
  }
  if (pid_ == 0) {
    // Die with the parent so a crashed test or demo leaves no daemons behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGPIPE, SIG_DFL);  // an ignored signal stays ignored across exec (InterruptGuard ignores it)
    dup2(output_fd_, STDOUT_FILENO);
    dup2(output_fd_, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execvp(argv[0], argv.data());
    dprintf(STDERR_FILENO, "cannot execute %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
}

Process::Process(Process&& other) noexcept
    : name_(std::move(other.name_)), pid_(other.pid_), exit_code_(other.exit_code_), output_fd_(other.output_fd_) {
  other.pid_ = -1;
  other.output_fd_ = -1;
}

Process::~Process() {
  if (pid_ > 0 && !exit_code_) terminate();
  if (output_fd_ >= 0) close(output_fd_);
}

std::optional<int> Process::poll() {
  if (exit_code_ || pid_ <= 0) return exit_code_;
  int status = 0;
  pid_t rc = waitpid(pid_, &status, WNOHANG);
  if (rc == pid_) exit_code_ = exit_code_of(status);
  return exit_code_;
}

ProcessResult Process::wait(Clock::time_point deadline) {
  while (!poll()) {
    if (Clock::now() >= deadline) return terminate();
    std::this_thread::sleep_for(kPollInterval);
  }
  return result(false);
}

ProcessResult Process::terminate(std::chrono::milliseconds grace) {
  if (poll()) return result(false);
  kill(pid_, SIGTERM);
  auto kill_at = Clock::now() + grace;
  while (!poll() && Clock::now() < kill_at) std::this_thread::sleep_for(kPollInterval);
  if (!exit_code_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    exit_code_ = exit_code_of(status);
  }
  return result(true);
}

std::string Process::output() const {
  std::string text;
  char buffer[65536];
  off_t offset = 0;
  ssize_t n;
  while ((n = pread(output_fd_, buffer, sizeof buffer, offset)) > 0) {
    text.append(buffer, static_cast<size_t>(n));
    offset += n;
  }
  return text;
}

ProcessResult Process::result(bool timed_out) const {
  return ProcessResult{.exit_code = exit_code_.value_or(-1), .timed_out = timed_out, .output = output()};
}

InterruptGuard::InterruptGuard() {
  struct sigaction action {};
  action.sa_handler = note_interrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_interrupt_);
  sigaction(SIGTERM, &action, &previous_terminate_);
  sigaction(SIGHUP, &action, &previous_hangup_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &previous_pipe_);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &previous_interrupt_, nullptr);
  sigaction(SIGTERM, &previous_terminate_, nullptr);
  sigaction(SIGHUP, &previous_hangup_, nullptr);
  sigaction(SIGPIPE, &previous_pipe_, nullptr);
}

void throw_if_interrupted() {
  if (const int signal_number = interrupted_by)
    throw std::runtime_error(fmt::format("interrupted by {}: stopping and cleaning up", strsignal(signal_number)));
}

std::vector<ProcessResult> wait_all(std::span<Process> processes, Clock::time_point deadline,
                                    const std::function<bool()>& cancelled) {
  auto all_exited = [&] {
    bool done = true;
    for (auto& process : processes) done = process.poll().has_value() && done;
    return done;
  };
  while (!all_exited() && Clock::now() < deadline && !(cancelled && cancelled())) {
    throw_if_interrupted();
    std::this_thread::sleep_for(kPollInterval);
  }

  std::vector<ProcessResult> results;
  for (auto& process : processes) results.push_back(process.terminate());
  return results;
}

std::string run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  ProcessSpec spec;
  spec.argv = argv;
  Process process(std::move(spec));
  ProcessResult result = process.wait(Clock::now() + timeout);
  if (result.exit_code != 0 || result.timed_out)
    throw CommandError(fmt::format("`{}` {}: {}", process.name(),
                                   result.timed_out ? "timed out" : fmt::format("exited {}", result.exit_code),
                                   result.output));
  return result.output;
}

bool try_command(const std::vector<std::string>& argv) {
  try {
    run_command(argv);
    return true;
  } catch (const CommandError& error) {
    spdlog::debug("{}", error.what());
    return false;
  }
}

TempDirectory::TempDirectory(const std::string& name_prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (name_prefix + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw system_error("mkdtemp");
  path_ = pattern;
}

TempDirectory::~TempDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace xagg
