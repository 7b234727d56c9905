/* pc_transport.c -- the MPI transport.  The executor reaches the network only
 * through pc_transport, so an emulated (slow, lossy) or loopback transport can
 * replace this file's table without touching the executor. */
#include "pc_sched.h"

static int mpi_isend(const void *buf, int count, MPI_Datatype dt, int peer,
                     int tag, MPI_Comm comm, MPI_Request *req)
{
    return MPI_Isend(buf, count, dt, peer, tag, comm, req);
}

static int mpi_irecv(void *buf, int count, MPI_Datatype dt, int peer, int tag,
                     MPI_Comm comm, MPI_Request *req)
{
    return MPI_Irecv(buf, count, dt, peer, tag, comm, req);
}

static int mpi_testsome(int n, MPI_Request *reqs, int *outcount, int *idx)
{
    return MPI_Testsome(n, reqs, outcount, idx, MPI_STATUSES_IGNORE);
}

/* Cancel a request and release it.  Receives cancel at once; a send that
 * cannot be cancelled is given a short grace period to complete, then
 * released with MPI_Request_free (MPI completes it in the background). */
static int mpi_cancel(MPI_Request *req)
{
    if (*req == MPI_REQUEST_NULL)
        return MPI_SUCCESS;
    int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag)
        return rc;
    MPI_Cancel(req);
    double t0 = MPI_Wtime();
    while (!flag && MPI_Wtime() - t0 < 0.05) {
        rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            break;
    }
    if (!flag && *req != MPI_REQUEST_NULL)
        rc = MPI_Request_free(req);
    return rc;
}

const pc_transport pc_transport_mpi = {mpi_isend, mpi_irecv, mpi_testsome,
                                       mpi_cancel};
