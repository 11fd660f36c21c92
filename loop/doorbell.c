/* Doorbells (doorbell.h): an eventfd on Linux, a pipe elsewhere. */
#include "doorbell.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#if UFORM_LINUX
#include <sys/eventfd.h>
#endif

/* Sets O_NONBLOCK and FD_CLOEXEC on fd (pipe2 is not in POSIX 2008). Answers 0 or -errno. */
static int doorbell_configure(int fd) {
    int status = fcntl(fd, F_GETFL);
    if (status < 0 || fcntl(fd, F_SETFL, status | O_NONBLOCK) < 0) return -errno;
    int descriptor = fcntl(fd, F_GETFD);
    if (descriptor < 0 || fcntl(fd, F_SETFD, descriptor | FD_CLOEXEC) < 0) return -errno;
    return 0;
}

int loop_doorbell_open_pipe(loop_doorbell_t *bell) {
    int fds[2];
    bell->read_fd = bell->write_fd = -1;
    if (pipe(fds) != 0) return -errno;
    int ret = doorbell_configure(fds[0]);
    if (ret == 0) ret = doorbell_configure(fds[1]);
    if (ret < 0) {
        (void)close(fds[0]);
        (void)close(fds[1]);
        return ret;
    }
    bell->read_fd = fds[0];
    bell->write_fd = fds[1];
    return 0;
}

int loop_doorbell_open(loop_doorbell_t *bell) {
#if UFORM_LINUX
    bell->read_fd = bell->write_fd = eventfd(0, EFD_CLOEXEC);
    return bell->read_fd < 0 ? -errno : 0;
#else
    return loop_doorbell_open_pipe(bell);
#endif
}

void loop_doorbell_ring(loop_doorbell_t const *bell) {
    /* An eventfd takes an 8-byte count; a pipe one byte. */
    uint64_t one = 1;
    size_t size = bell->read_fd == bell->write_fd ? sizeof one : 1;
    for (;;) {
        ssize_t written = write(bell->write_fd, &one, size);
        /* EINTR: try again. Any other failure (EAGAIN from a full pipe or a counter near 2^64, EBADF
         * after destroy) has no one to report to; a full doorbell is readable already. */
        if (written >= 0 || errno != EINTR) return;
    }
}

int loop_doorbell_drain(loop_doorbell_t const *bell) {
    if (bell->read_fd == bell->write_fd) {
        /* Resets the counter; the caller saw it non-zero, so this blocking read does not block. */
        uint64_t count;
        for (;;) {
            if (read(bell->read_fd, &count, sizeof count) >= 0) return 0;
            if (errno != EINTR) return -errno;
        }
    }
    /* Every ring so far: until the non-blocking pipe is empty. */
    char bytes[64];
    for (;;) {
        ssize_t got = read(bell->read_fd, bytes, sizeof bytes);
        if (got > 0) continue;
        if (got == 0 || errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno != EINTR) return -errno;
    }
}

void loop_doorbell_close(loop_doorbell_t *bell) {
    /* Nothing can be done about a failed close: the descriptor is released either way. */
    if (bell->read_fd >= 0) (void)close(bell->read_fd);
    if (bell->write_fd >= 0 && bell->write_fd != bell->read_fd) (void)close(bell->write_fd);
    bell->read_fd = bell->write_fd = -1;
}
