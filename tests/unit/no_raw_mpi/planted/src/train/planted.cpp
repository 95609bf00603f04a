// Not built: the fixture of layers_no_raw_mpi_planted, which must fail on the call below.
#include <mpi.h>

// A comment naming MPI_Allreduce( is allowed.
int planted(MPI_Comm world) {
  int x = 0, y = 0;
  return MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, world);
}

// Point-to-point too, split over lines.
void planted_send(MPI_Comm world, const char* p) {
  MPI_Send
      (p, 1, MPI_CHAR, 0, 0, world);
}
