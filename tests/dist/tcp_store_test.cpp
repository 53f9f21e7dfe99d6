// The TCP store (dist/tcp_store.h) on 127.0.0.1 with threads as ranks: every
// rank gets rank 0's 128 bytes; a missing rank, a silent server and a
// duplicate rank end in errors that say what to check.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "dist/tcp_store.h"
#include "testutil.h"

namespace {

std::string id_bytes() {
  std::string b(128, '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 37 + 11) & 0xff);  // zeros included
  return b;
}

TEST(TcpStore, EveryRankGetsRankZerosValue) {
  const int world = 4;
  rt::TcpStoreServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  std::vector<std::string> got(world);
  std::vector<std::thread> clients;
  for (int r = 1; r < world; ++r)
    clients.emplace_back([&, r] { got[r] = rt::tcp_store_fetch("127.0.0.1", server.port(), r, 20); });
  server.serve(id_bytes(), world, 20);
  for (auto& t : clients) t.join();
  for (int r = 1; r < world; ++r) EXPECT_EQ(got[r], id_bytes()) << "rank " << r;
}

TEST(TcpStore, ExchangeThroughLaunchConfig) {
  int port = 0;
  {
    rt::TcpStoreServer probe("127.0.0.1", 0);  // a free port, released for the exchange
    port = probe.port();
  }
  std::string got1;
  rt::LaunchConfig c0;
  c0.world = 2;
  c0.master_addr = "127.0.0.1";
  c0.master_port = port;
  rt::LaunchConfig c1 = c0;
  c1.rank = c1.local_rank = 1;
  std::thread t([&] { got1 = rt::tcp_store_exchange(c1, "", 20); });  // may start before rank 0 listens
  EXPECT_EQ(rt::tcp_store_exchange(c0, id_bytes(), 20), id_bytes());
  t.join();
  EXPECT_EQ(got1, id_bytes());
}

TEST(TcpStore, TimeoutsAndBadRanksSayWhatToCheck) {
  rt::TcpStoreServer server("127.0.0.1", 0);
  rt::test::expect_error([&] { server.serve(id_bytes(), 3, 0.3); }, {"ranks 1, 2 of 3 never asked", "MASTER_PORT"});
  int port = 0;
  {
    rt::TcpStoreServer probe("127.0.0.1", 0);
    port = probe.port();
  }
  rt::test::expect_error([&] { rt::tcp_store_fetch("127.0.0.1", port, 1, 0.3); },
                         {"rank 1 could not get the value", "MASTER_ADDR/MASTER_PORT"});
  rt::TcpStoreServer s2("127.0.0.1", 0);
  std::thread bad([&] {
    try {
      rt::tcp_store_fetch("127.0.0.1", s2.port(), 5, 2);
    } catch (const rt::Error&) {
    }
  });
  rt::test::expect_error([&] { s2.serve(id_bytes(), 2, 5); }, {"says it is rank 5", "WORLD_SIZE is 2"});
  bad.join();
  rt::test::expect_error([] { rt::TcpStoreServer("no-such-host.invalid", 0); }, {"cannot resolve MASTER_ADDR"});
}

}  // namespace
