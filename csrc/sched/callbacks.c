/* callbacks.c -- the functions of CALLBACK ops (pc_sched.h), registered by
 * name.  The table only grows, and an entry's function is set before its
 * name can be found: an op names its function by id, checked when it is
 * built, and the engine reads the entry without a lock. */
#include "sched/pc_sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static struct {
    char name[64];
    _Atomic(pc_callback_fn) fn;  /* set once, before the name is found */
} callbacks[PC_MAX_CALLBACKS];
static int ncallbacks;
static pthread_mutex_t callbacks_mtx = PTHREAD_MUTEX_INITIALIZER;

static int find_callback(const char *name)    /* callbacks_mtx held */
{
    for (int k = 0; k < ncallbacks; k++)
        if (strcmp(callbacks[k].name, name) == 0)
            return k;
    return -1;
}

int pc_sched_register_callback(const char *name, pc_callback_fn fn)
{
    if (!name || !fn || strlen(name) >= sizeof callbacks[0].name)
        return -1;
    pthread_mutex_lock(&callbacks_mtx);
    int id = find_callback(name);
    if (id >= 0 && atomic_load(&callbacks[id].fn) != fn)
        id = -1;                        /* the name is another's */
    else if (id < 0 && ncallbacks < PC_MAX_CALLBACKS) {
        id = ncallbacks;
        snprintf(callbacks[id].name, sizeof callbacks[id].name, "%s", name);
        atomic_store_explicit(&callbacks[id].fn, fn, memory_order_release);
        ncallbacks++;
    }
    pthread_mutex_unlock(&callbacks_mtx);
    return id;
}

int pc_sched_callback_id(const char *name)
{
    pthread_mutex_lock(&callbacks_mtx);
    int id = name ? find_callback(name) : -1;
    pthread_mutex_unlock(&callbacks_mtx);
    return id;
}

pc_callback_fn pc_sched_callback(int id)
{
    if (id < 0 || id >= PC_MAX_CALLBACKS)
        return NULL;
    return atomic_load_explicit(&callbacks[id].fn, memory_order_acquire);
}
