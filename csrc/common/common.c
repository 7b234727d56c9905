/* common.c -- the clock, allocation-failure injection and the grow helper
 * (see pc_common.h). */
#include "common/pc_common.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

double pc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static _Atomic int alloc_countdown = -1;

void pc_inject_alloc_failure(int n)
{
    atomic_store(&alloc_countdown, n);
}

int pc_alloc_ok(void)
{
    int n = atomic_load(&alloc_countdown);
    while (n > 0 && !atomic_compare_exchange_weak(&alloc_countdown, &n, n - 1))
        ;
    return n != 0;
}

void *pc_realloc(void *p, size_t n)
{
    return pc_alloc_ok() ? realloc(p, n) : NULL;
}

int pc_grow_cap(int cap, int need, int init)
{
    int c = cap > 0 ? cap : init;
    while (c < need)
        c = c > INT_MAX / 2 ? need : 2 * c;
    return c;
}

void *pc_grow(void *arr, int *cap, int need, size_t elem, int init)
{
    if (need <= *cap)
        return arr;
    int c = pc_grow_cap(*cap, need, init);
    void *p = pc_realloc(arr, (size_t)c * elem);
    if (p)
        *cap = c;
    return p;
}
