// A minimal TCP store for one value: rank 0 listens on MASTER_ADDR:MASTER_PORT
// and hands a blob (NCCL's 128-byte unique id) to every other rank, which
// connects (retrying until rank 0 is up) and reads it. Protocol: the client
// sends "RTS1" and its rank (4 bytes, big-endian); the server checks the rank
// (in 1..world-1, not seen before) and answers with the blob's length (4
// bytes, big-endian) and bytes. Every wait is bounded by a timeout that ends
// in an rt::Error naming the address, the ranks still missing and what to check.
#pragma once
#include <string>

#include "dist/launch.h"

namespace rt {

class TcpStoreServer {
 public:
  // Binds and listens on addr:port (port 0: a free one, see port()).
  TcpStoreServer(const std::string& addr, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  // Answers ranks 1..world-1 once each with blob; returns when all have it.
  void serve(const std::string& blob, int world, double timeout_s);

 private:
  std::string addr_;
  int fd_ = -1, port_ = 0;
};

// Rank `rank`'s side: the blob rank 0 serves on addr:port.
std::string tcp_store_fetch(const std::string& addr, int port, int rank, double timeout_s);
// Rank 0 serves blob; the others fetch it. Every rank returns the blob.
std::string tcp_store_exchange(const LaunchConfig& c, const std::string& blob, double timeout_s);

}  // namespace rt
