#include "dist/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"

namespace rt {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Waits until fd is readable/writable (events) or the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const double left = seconds_left(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) fail("[store] poll failed: ", std::strerror(errno));
  }
}

// Reads or writes exactly n bytes before the deadline; false on timeout or a closed peer.
bool io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, write ? POLLOUT : POLLIN, deadline)) return false;
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

addrinfo* resolve(const std::string& addr, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  const int r = ::getaddrinfo(addr.c_str(), p.c_str(), &hints, &res);
  RT_CHECK(r == 0 && res, "[store] cannot resolve MASTER_ADDR \"", addr, "\": ", ::gai_strerror(r),
           "; set MASTER_ADDR to rank 0's host name or address");
  return res;
}

const char kMagic[4] = {'R', 'T', 'S', '1'};

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& addr, int port) : addr_(addr) {
  RT_CHECK(port >= 0 && port <= 65535, "[store] MASTER_PORT ", port, " is not a TCP port (1..65535)");
  addrinfo* res = resolve(addr, port, true);
  std::string why;
  for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      fd_ = fd;
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  RT_CHECK(fd_ >= 0, "[store] rank 0 cannot listen on ", addr, ":", port, ": ", why,
           "; pick a free MASTER_PORT on rank 0's host and make MASTER_ADDR one of its addresses");
}

TcpStoreServer::~TcpStoreServer() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStoreServer::serve(const std::string& blob, int world, double timeout_s) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::set<int> served;
  while (static_cast<int>(served.size()) < world - 1) {
    if (!wait_fd(fd_, POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < world; ++r)
        if (!served.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail("[store] rank 0 waited ", timeout_s, " s on ", addr_, ":", port_, " but ranks ", missing, " of ", world,
           " never asked: check that they started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and "
           "that the port is reachable from their hosts");
    }
    Fd c(::accept(fd_, nullptr, nullptr));
    if (c.fd < 0) continue;
    char hello[8];
    if (!io_all(c.fd, hello, sizeof hello, false, deadline) || std::memcmp(hello, kMagic, 4) != 0)
      continue;  // not one of ours (a port scan, a stale client): ignore it
    uint32_t rn;
    std::memcpy(&rn, hello + 4, 4);
    const int r = static_cast<int>(ntohl(rn));
    RT_CHECK(r >= 1 && r < world, "[store] a client on ", addr_, ":", port_, " says it is rank ", r,
             " but WORLD_SIZE is ", world, " here: every rank must be started with the same world size");
    RT_CHECK(!served.count(r), "[store] rank ", r, " asked twice on ", addr_, ":", port_,
             ": two processes have the same RANK");
    const uint32_t len = htonl(static_cast<uint32_t>(blob.size()));
    if (io_all(c.fd, const_cast<uint32_t*>(&len), 4, true, deadline) &&
        io_all(c.fd, const_cast<char*>(blob.data()), blob.size(), true, deadline))
      served.insert(r);
  }
}

std::string tcp_store_fetch(const std::string& addr, int port, int rank, double timeout_s) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::string last = "no attempt";
  while (seconds_left(deadline) > 0) {
    addrinfo* res = resolve(addr, port, false);
    for (addrinfo* a = res; a; a = a->ai_next) {
      Fd c(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (c.fd < 0) continue;
      if (::connect(c.fd, a->ai_addr, a->ai_addrlen) != 0) {
        last = std::strerror(errno);
        continue;
      }
      char hello[8];
      std::memcpy(hello, kMagic, 4);
      const uint32_t rn = htonl(static_cast<uint32_t>(rank));
      std::memcpy(hello + 4, &rn, 4);
      uint32_t len = 0;
      if (!io_all(c.fd, hello, sizeof hello, true, deadline) || !io_all(c.fd, &len, 4, false, deadline)) {
        last = "the connection closed before the value came (rank 0 refused this rank: see its log)";
        continue;
      }
      std::string blob(ntohl(len), '\0');
      RT_CHECK(blob.size() <= (1u << 20), "[store] ", addr, ":", port, " sent a ", blob.size(),
               "-byte value: that is not a ramtrain store");
      if (io_all(c.fd, blob.data(), blob.size(), false, deadline)) {
        ::freeaddrinfo(res);
        return blob;
      }
      last = "the connection closed in the middle of the value";
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 may not listen yet
  }
  fail("[store] rank ", rank, " could not get the value from rank 0 at ", addr, ":", port, " within ", timeout_s,
       " s (last: ", last, "); check that rank 0 runs and that MASTER_ADDR/MASTER_PORT name it");
}

std::string tcp_store_exchange(const LaunchConfig& c, const std::string& blob, double timeout_s) {
  if (c.world == 1) return blob;
  if (c.rank == 0) {
    TcpStoreServer s(c.master_addr, c.master_port);
    s.serve(blob, c.world, timeout_s);
    return blob;
  }
  return tcp_store_fetch(c.master_addr, c.master_port, c.rank, timeout_s);
}

}  // namespace rt
