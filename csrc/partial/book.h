/* book.h -- a partial allreduce round's bookkeeping as callback ops
 * (book.c). */
#ifndef PC_BOOK_H
#define PC_BOOK_H

#include <stdint.h>

#include "capi/pc_capi.h"

/* the names the two callbacks are registered under */
#define PC_BOOK_SNAPSHOT "partial.snapshot"
#define PC_BOOK_ACCOUNT "partial.account"

/* the book's fields, in its order, NULL-terminated */
extern const char *const pc_book_fields[];
/* int64 elements of the book at P ranks */
int64_t pc_book_len(int64_t P);
/* register both callbacks; 0, or -1 with an exception */
int pc_book_register(pc_capi *api);

#endif
