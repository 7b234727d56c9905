/* pc_netem.c -- placeholder until the emulated network lands. */
#include "pc_sched.h"

#include <stdio.h>

pc_transport *pc_netem_create(pc_transport *wire, const char *config,
                              char *err, int errlen)
{
    (void)wire;
    (void)config;
    snprintf(err, errlen, "the emulated network is not built yet");
    return NULL;
}
