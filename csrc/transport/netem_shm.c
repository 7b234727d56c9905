/* netem_shm.c -- the emulated network's shared segment: created by the
 * first rank that gets to it, mapped by every rank, its name unlinked as
 * soon as all have it (so a job that dies leaves nothing in /dev/shm). */
#include "transport/netem_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NETEM_MAGIC 0x70636e6574656d31ULL      /* "pcnetem1" */

void netem_shm_lock(netem *N)
{
    if (pthread_mutex_lock(&N->S->mtx) == EOWNERDEAD)
        pthread_mutex_consistent(&N->S->mtx);   /* a rank died holding it */
}

static void init_segment(netem *N)
{
    netem_shm *S = N->S;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&S->mtx, &a);
    pthread_mutexattr_destroy(&a);
    S->P = N->P;
    S->t0 = S->t_model = pc_now();
    S->magic = NETEM_MAGIC;
    atomic_store(&S->ready, 1);
}

static void nap_1ms(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

int netem_attach(netem *N, char *err, int errlen)
{
    size_t size = sizeof(netem_shm) + (size_t)N->P * N->P * NETEM_NLEVEL *
                                          sizeof(netem_chan);
    int fd = shm_open(N->cfg.shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    int creator = fd >= 0;
    if (!creator && errno == EEXIST)
        fd = shm_open(N->cfg.shm, O_RDWR, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "emulated network: shm_open(%s): %s",
                 N->cfg.shm, strerror(errno));
        return -1;
    }
    struct stat st;
    double t_give_up = pc_now() + 30;
    if (creator) {
        if (ftruncate(fd, (off_t)size) != 0)
            goto fail;
    } else {
        while (fstat(fd, &st) == 0 && (size_t)st.st_size < size &&
               pc_now() < t_give_up)
            nap_1ms();
    }
    N->S = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    fd = -1;
    if (N->S == MAP_FAILED) {
        N->S = NULL;
        goto fail;
    }
    N->shm_size = size;
    netem_shm *S = N->S;
    if (creator)
        init_segment(N);
    while (!atomic_load(&S->ready) && pc_now() < t_give_up)
        nap_1ms();
    if (!atomic_load(&S->ready) || S->magic != NETEM_MAGIC || S->P != N->P) {
        snprintf(err, errlen, "emulated network: segment %s is not a "
                 "network of %d ranks (another job's, or a rank never "
                 "created it)", N->cfg.shm, N->P);
        munmap(S, size);
        N->S = NULL;
        return -1;
    }
    /* Once every rank has it mapped the name has done its work: unlink it
     * now, so that a job that dies (MPI_Abort, a signal) leaves nothing in
     * /dev/shm.  The mapping lives until each rank's detach. */
    if (atomic_fetch_add(&S->attached, 1) + 1 == N->P &&
        atomic_exchange(&S->unlinked, 1) == 0)
        shm_unlink(N->cfg.shm);
    return 0;
fail:
    snprintf(err, errlen, "emulated network: setting up %s: %s", N->cfg.shm,
             strerror(errno));
    if (fd >= 0)
        close(fd);
    if (creator)
        shm_unlink(N->cfg.shm);
    return -1;
}

void netem_detach(netem *N)
{
    if (!N->S)
        return;
    if (atomic_fetch_sub(&N->S->attached, 1) == 1 &&
        atomic_exchange(&N->S->unlinked, 1) == 0)
        shm_unlink(N->cfg.shm);     /* a rank left before all attached */
    munmap(N->S, N->shm_size);
    N->S = NULL;
}
