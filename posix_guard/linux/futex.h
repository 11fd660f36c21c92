/* The POSIX-only build (-Dplatform=posix) finds this before the system's <linux/futex.h>, which is Linux's
 * alone. */
#error "<linux/futex.h> is Linux-only: the POSIX-only build (-Dplatform=posix) cannot include it"
