#include "cli/spawn_ranks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace rt::cli {

namespace {

// A TCP port the kernel says is free on 127.0.0.1 now (rank 0 listens on it
// moments later; a race with another program is reported by the store).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  RT_CHECK(fd >= 0, "[launch] cannot open a socket to find a free port: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  ::close(fd);
  RT_CHECK(ok, "[launch] cannot find a free TCP port on 127.0.0.1: ", std::strerror(err));
  return ntohs(a.sin_port);
}

volatile sig_atomic_t g_forward = 0;
void on_signal(int sig) { g_forward = sig; }

}  // namespace

int spawn_local_ranks(int n, const std::vector<std::string>& args) {
  RT_CHECK(n >= 2, "[launch] internal: spawn_local_ranks needs 2 or more ranks");
  const std::string port = std::to_string(free_port());
  std::vector<std::string> argv_s{"ramtrain"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // The executable: this one, or RAMTRAIN_EXE (the Python module sets it to the installed
  // `ramtrain`, since this process is the Python interpreter there).
  const char* exe_env = std::getenv("RAMTRAIN_EXE");
  const std::string exe = exe_env && *exe_env ? exe_env : "/proc/self/exe";
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGTERM);
      fail("[launch] cannot start rank ", r, " of ", n, ": fork failed: ", std::strerror(errno));
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off (the GPU machines' notes)
      ::execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "ramtrain: rank %d: cannot run %s: %s\n", r, exe.c_str(), std::strerror(errno));
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  int first_fail = 0, running = n;
  bool stopping = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) {
        if (g_forward)  // every rank saves (or stops) on its own signal
          for (pid_t p : pids)
            if (p > 0) ::kill(p, g_forward);
        g_forward = 0;
        continue;
      }
      break;
    }
    int rank = -1;
    for (int r = 0; r < n; ++r)
      if (pids[static_cast<size_t>(r)] == pid) rank = r;
    if (rank < 0) continue;
    pids[static_cast<size_t>(rank)] = -1;
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && first_fail == 0) {
      first_fail = code;
      std::fprintf(stderr, "ramtrain: rank %d of %d %s %d; stopping the other ranks\n", rank, n,
                   WIFEXITED(status) ? "exited with" : "was killed by signal",
                   WIFEXITED(status) ? code : WTERMSIG(status));
    }
    if (first_fail != 0 && !stopping) {
      stopping = true;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
      // a rank waiting in a collective for the one that failed never reaches
      // a step boundary: 60 s, then SIGKILL
      for (int t = 0; t < 600 && running > 0; ++t) {
        int st = 0;
        const pid_t q = ::waitpid(-1, &st, WNOHANG);
        if (q > 0) {
          for (auto& p : pids)
            if (p == q) p = -1, --running;
          continue;
        }
        ::usleep(100000);
      }
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return first_fail;
}

}  // namespace rt::cli
