/* The POSIX-only build (-Dplatform=posix) finds this before the system's <sys/syscall.h>, which is Linux's
 * alone. */
#error "<sys/syscall.h> is Linux-only: the POSIX-only build (-Dplatform=posix) cannot include it"
