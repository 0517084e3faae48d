// A small MPI check for the emulated cluster (scripts/cluster/): every rank
// reports its hostname; rank 0 checks that the ranks sit on the expected
// number of distinct hosts and that MPI_Allreduce (a scalar and a 1 MiB
// vector, so TCP between nodes carries real data) gives the right sums.
//   cluster_hello EXPECTED_HOSTS [MIB]
// Exits 0 when both hold, 1 otherwise (on every rank). With MIB, rank 0 then
// also prints the time of an MPI_Allreduce of MIB MiB of doubles (median of
// 9 after a warm-up) and its bus bandwidth, 2 (p - 1) / p x bytes / time.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int const expected_hosts = argc > 1 ? std::atoi(argv[1]) : 2;

  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> hosts(static_cast<std::size_t>(size) * sizeof host);
  MPI_Allgather(host, sizeof host, MPI_CHAR, hosts.data(), sizeof host, MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> distinct;
  for (int r = 0; r < size; ++r)
    distinct.insert(&hosts[static_cast<std::size_t>(r) * sizeof host]);

  long const one = rank + 1, sum_expected = static_cast<long>(size) * (size + 1) / 2;
  long sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);

  std::size_t const n = 1 << 17; // 1 MiB of doubles
  std::vector<double> v(n), w(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<double>(rank) + static_cast<double>(i % 7);
  MPI_Allreduce(v.data(), w.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  bool vector_ok = true;
  double const ranks_sum = static_cast<double>(size) * (size - 1) / 2;
  for (std::size_t i = 0; i < n; ++i)
    if (w[i] != ranks_sum + static_cast<double>(size) * static_cast<double>(i % 7))
      vector_ok = false;
  int local_ok = vector_ok ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  bool const ok =
      static_cast<int>(distinct.size()) == expected_hosts && sum == sum_expected && all_ok == 1;
  if (rank == 0) {
    std::string list;
    for (auto const& h : distinct)
      list += (list.empty() ? "" : ",") + h;
    std::printf(
        "cluster_hello: %d ranks on %zu hosts (%s, expected %d); allreduce sum %ld (expected %ld), "
        "1 MiB allreduce %s: %s\n",
        size, distinct.size(), list.c_str(), expected_hosts, sum, sum_expected,
        all_ok == 1 ? "right" : "WRONG", ok ? "ok" : "FAILED");
  }
  if (ok && argc > 2) {
    std::size_t const m = static_cast<std::size_t>(std::atof(argv[2]) * (1 << 20)) / sizeof(double);
    std::vector<double> a(m, 1.0), b(m);
    std::vector<double> times;
    for (int rep = 0; rep < 10; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      double const t0 = MPI_Wtime();
      MPI_Allreduce(a.data(), b.data(), static_cast<int>(m), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep > 0)
        times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    double const t = times[times.size() / 2], bytes = static_cast<double>(m * sizeof(double));
    if (rank == 0)
      std::printf(
          "cluster_hello: allreduce of %s MiB on %d ranks: %.2f ms, bus bandwidth %.2f Gbit/s\n",
          argv[2], size, t * 1e3, 2.0 * (size - 1) / size * bytes / t * 8e-9);
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
