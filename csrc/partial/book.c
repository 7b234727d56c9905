/* book.c -- a partial allreduce round's bookkeeping as two callback ops
 * (Schedule.callback; PC_CALLBACK in the executor), registered with the
 * executor when partialcoll.collectives.partial._calls is imported.
 *
 * The bookkeeping is int64 fields of one array, the "book", in the order
 * of BOOK_FIELDS below, which partialcoll/collectives/partial/schedule.py
 * (META) follows: the flags and the meta allreduce's send buffer have
 * 3 + 2P elements, the straggler counters P, the rest one.  The module
 * docstring of schedule.py says what each field means; here is what the
 * round does to them:
 *
 *   partial.snapshot (a: the meta allreduce's input, b: the book), under
 *   the data lock after the data's snapshot:
 *       a <- flag; flag <- reset; prev_seq <- round_seq;
 *       round_seq <- dep_seq; snaps += 1
 *   partial.account (a: the book, b: the meta allreduce's result), under
 *   the lock after the data's accumulation:
 *       acc_rounds += 1; acc_seq <- round_seq; acc_lo <- prev_seq (the
 *       round holds the deposits numbered (prev_seq, round_seq]);
 *       last_active, last_flush, last_bypass <- m[0], m[1], m[2];
 *       flush_total += m[1];
 *       per rank i: plain = (mark_i == 0), late = late_i * plain,
 *       late_total += late, lag = (lag + late) * late, lag_total += lag;
 *       stat_rounds += plain of rank 0 (a plain round has no mark at all)
 *
 * Each was a chain of five and sixteen locked copy and reduce ops of one
 * or P elements: one op each now.  They run on the thread that drives
 * progress, without the GIL.
 *
 *   partial.drawn (a: the book, b: the flags the peer's data carries, its
 *   meta: 3 + 2P int64, arg: this rank), after the receive of the peer's
 *   data in majority's two-rank round, where that data is also the
 *   activation: declines (the op ends SKIPPED) when this rank is the
 *   round's drawn initiator (from the book's seed) and the peer's
 *   round is a plain one, so that only this rank's own call starts the
 *   round here and the peer's data waits for it.  A round the peer
 *   started in a synchronous round or while flushing (a flush or bypass
 *   mark in its flags) is let through: this rank may be waiting in the
 *   same synchronous round, not calling.  The round is the book's
 *   snaps: what this rank has snapshotted so far is the round's number
 *   until its own snapshot of it, and only before that snapshot (before
 *   the activation) does the gate decide anything; data heard after it
 *   is a surplus input either way. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "partial/book.h"

/* the fields, in the book's order (schedule.py's META) */
enum { F_FLAG, F_RESET, F_ONE, F_META_SEND, F_DEP_SEQ, F_ROUND_SEQ,
       F_ACC_SEQ, F_ACC_ROUNDS, F_LAST_ACTIVE, F_SNAPS, F_PREV_SEQ,
       F_ACC_LO, F_LAST_FLUSH, F_LAST_BYPASS, F_FLUSH_TOTAL, F_SEED,
       F_STAT_ROUNDS, F_LATE_TOTAL, F_LAG, F_LAG_TOTAL, F_PLAIN, F_LATE,
       F_ONES, NFIELDS };

const char *const pc_book_fields[] = {
    "flag", "reset", "one", "meta_send", "dep_seq", "round_seq", "acc_seq",
    "acc_rounds", "last_active", "snaps", "prev_seq", "acc_lo",
    "last_flush", "last_bypass", "flush_total", "seed", "stat_rounds",
    "late_total", "lag", "lag_total", "plain", "late", "ones", NULL};

/* elements of field f at P ranks */
static int64_t field_len(int f, int64_t P)
{
    if (f == F_FLAG || f == F_RESET || f == F_META_SEND)
        return 3 + 2 * P;
    if (f >= F_LATE_TOTAL)
        return P;
    return 1;
}

int64_t pc_book_len(int64_t P)
{
    int64_t n = 0;
    for (int f = 0; f < NFIELDS; f++)
        n += field_len(f, P);
    return n;
}

/* the fields' offsets in the book at P ranks */
static void offsets(int64_t P, int64_t *off)
{
    int64_t n = 0;
    for (int f = 0; f < NFIELDS; f++) {
        off[f] = n;
        n += field_len(f, P);
    }
}

/* the book and meta buffers hold what P ranks need; else err */
static int sizes_ok(int64_t book_bytes, int64_t meta_bytes, int64_t P,
                    char *err, size_t errlen)
{
    if (P < 1) {
        snprintf(err, errlen, "a book of %lld ranks", (long long)P);
        return 0;
    }
    if (book_bytes < pc_book_len(P) * 8 || meta_bytes < (3 + 2 * P) * 8) {
        snprintf(err, errlen, "a book of %lld bytes and meta of %lld bytes "
                 "at %lld ranks (they need %lld and %lld)",
                 (long long)book_bytes, (long long)meta_bytes, (long long)P,
                 (long long)(pc_book_len(P) * 8),
                 (long long)((3 + 2 * P) * 8));
        return 0;
    }
    return 1;
}

static int snapshot(void *a, int64_t abytes, void *b, int64_t bbytes,
                    int64_t P, char *err, size_t errlen)
{
    if (!sizes_ok(bbytes, abytes, P, err, errlen))
        return -1;
    int64_t off[NFIELDS], *meta = a, *book = b, n = 3 + 2 * P;
    offsets(P, off);
    memcpy(meta, book + off[F_FLAG], (size_t)n * 8);
    memcpy(book + off[F_FLAG], book + off[F_RESET], (size_t)n * 8);
    book[off[F_PREV_SEQ]] = book[off[F_ROUND_SEQ]];
    book[off[F_ROUND_SEQ]] = book[off[F_DEP_SEQ]];
    book[off[F_SNAPS]] += 1;
    return 0;
}

static int account(void *a, int64_t abytes, void *b, int64_t bbytes,
                   int64_t P, char *err, size_t errlen)
{
    if (!sizes_ok(abytes, bbytes, P, err, errlen))
        return -1;
    int64_t off[NFIELDS], *book = a;
    const int64_t *m = b;
    offsets(P, off);
    book[off[F_ACC_ROUNDS]] += 1;
    book[off[F_ACC_SEQ]] = book[off[F_ROUND_SEQ]];
    book[off[F_ACC_LO]] = book[off[F_PREV_SEQ]];
    book[off[F_LAST_ACTIVE]] = m[0];
    book[off[F_LAST_FLUSH]] = m[1];
    book[off[F_LAST_BYPASS]] = m[2];
    book[off[F_FLUSH_TOTAL]] += m[1];
    int64_t *plain = book + off[F_PLAIN], *late = book + off[F_LATE];
    int64_t *late_total = book + off[F_LATE_TOTAL];
    int64_t *lag = book + off[F_LAG], *lag_total = book + off[F_LAG_TOTAL];
    for (int64_t i = 0; i < P; i++) {
        plain[i] = m[3 + P + i] == 0;
        late[i] = m[3 + i] * plain[i];
        late_total[i] += late[i];
        lag[i] = (lag[i] + late[i]) * late[i];
        lag_total[i] += lag[i];
    }
    book[off[F_STAT_ROUNDS]] += plain[0];
    return 0;
}

int pc_book_designated(uint64_t seed, uint64_t rnd, int size)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ULL + rnd + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (int)((z ^ (z >> 31)) % (uint64_t)size);
}

static int drawn(void *a, int64_t abytes, void *b, int64_t bbytes,
                 int64_t rank, char *err, size_t errlen)
{
    int64_t P = (bbytes / 8 - 3) / 2;       /* the flags: 3 + 2P int64 */
    if (P < 1 || bbytes != (3 + 2 * P) * 8 || abytes < pc_book_len(P) * 8 ||
        rank < 0 || rank >= P) {
        snprintf(err, errlen, "the drawn gate takes a book and the flags "
                 "of P ranks (3 + 2P int64) and a rank: given %lld and "
                 "%lld bytes, rank %lld", (long long)abytes,
                 (long long)bbytes, (long long)rank);
        return -1;
    }
    int64_t off[NFIELDS];
    const int64_t *book = a, *peer = b;
    offsets(P, off);
    if (peer[1] || peer[2])                 /* flush or bypass mark */
        return 0;
    int initiator = pc_book_designated((uint64_t)book[off[F_SEED]],
                                       (uint64_t)book[off[F_SNAPS]], (int)P);
    return initiator == rank ? PC_CAPI_DECLINE : 0;
}

int pc_book_register(pc_capi *api)
{
    if (api->register_callback(PC_BOOK_SNAPSHOT, snapshot) < 0 ||
        api->register_callback(PC_BOOK_ACCOUNT, account) < 0 ||
        api->register_callback(PC_BOOK_DRAWN, drawn) < 0)
        return -1;
    return 0;
}
