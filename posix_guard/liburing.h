/* The POSIX-only build (-Dplatform=posix) finds this before the system's <liburing.h>, which is Linux's
 * alone. */
#error "<liburing.h> is Linux-only: the POSIX-only build (-Dplatform=posix) cannot include it"
