/* The POSIX-only build (-Dplatform=posix) finds this before the system's <sys/signalfd.h>, which is Linux's
 * alone. */
#error "<sys/signalfd.h> is Linux-only: the POSIX-only build (-Dplatform=posix) cannot include it"
