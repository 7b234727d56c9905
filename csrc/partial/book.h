/* book.h -- a partial allreduce round's bookkeeping as callback ops
 * (book.c). */
#ifndef PC_BOOK_H
#define PC_BOOK_H

#include <stdint.h>

#include "capi/pc_capi.h"

/* the names the callbacks are registered under */
#define PC_BOOK_SNAPSHOT "partial.snapshot"
#define PC_BOOK_ACCOUNT "partial.account"
#define PC_BOOK_DRAWN "partial.drawn"

/* the book's fields, in its order, NULL-terminated */
extern const char *const pc_book_fields[];
/* int64 elements of the book at P ranks */
int64_t pc_book_len(int64_t P);
/* Majority's initiator of round rnd (counted from the object's first)
 * among size ranks: splitmix64 of (seed, rnd), as kinds.designated
 * computes it. */
int pc_book_designated(uint64_t seed, uint64_t rnd, int size);
/* register the callbacks; 0, or -1 with an exception */
int pc_book_register(pc_capi *api);

#endif
