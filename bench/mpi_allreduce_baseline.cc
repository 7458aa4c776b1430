// Baseline for the dense path: plain MPI_Allreduce (sum, out of place) of the same buffer the
// spex benchmark exchanges, timed on every rank; rank 0 prints p50/p99 in ms as JSON.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long n = argc > 1 ? std::atol(argv[1]) : 25557032;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  std::vector<float> in(n, 1.0f + rank), out(n);
  std::vector<double> ms;
  for (int i = 0; i < iters + 3; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i >= 3) ms.push_back(dt * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  if (rank == 0) {
    std::printf(
        "{\"ranks\": %d, \"elements\": %ld, \"allreduce_p50_ms\": %.3f, \"allreduce_p99_ms\": "
        "%.3f}\n",
        size, n, ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 99 / 100)]);
  }
  MPI_Finalize();
  return 0;
}
