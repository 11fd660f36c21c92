/* A doorbell: a descriptor that becomes readable when rung from any thread, for the loop (poll(2) or an
 * io_uring read) to sleep on. On Linux an eventfd (one descriptor, an 8-byte counter, blocking, as
 * the io_uring read of it needs); elsewhere, and in the POSIX-only build, a pipe whose ends are both
 * non-blocking and close on exec. A pipe doorbell can be made on Linux too (the loop benchmark
 * compares the two). */
#pragma once

#include <stdbool.h>

typedef struct loop_doorbell {
    int read_fd;  /* what a sleeper waits on */
    int write_fd; /* the eventfd itself, or the pipe's other end */
} loop_doorbell_t;

/* The platform's doorbell. Answers 0 or -errno (-EMFILE, -ENFILE, -ENOMEM). */
int loop_doorbell_open(loop_doorbell_t *bell);
/* A pipe doorbell on every platform. Answers 0 or -errno. */
int loop_doorbell_open_pipe(loop_doorbell_t *bell);
/* Makes read_fd readable. A full pipe or an eventfd counter near 2^64 is readable already. */
void loop_doorbell_ring(loop_doorbell_t const *bell);
/* Makes read_fd unreadable again (after poll said it was readable: this does not block). Answers 0 or
 * -errno. */
int loop_doorbell_drain(loop_doorbell_t const *bell);
void loop_doorbell_close(loop_doorbell_t *bell);
