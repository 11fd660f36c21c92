/* The POSIX-only build (-Dplatform=posix) finds this before the system's <linux/io_uring.h>, which is Linux's
 * alone. */
#error "<linux/io_uring.h> is Linux-only: the POSIX-only build (-Dplatform=posix) cannot include it"
