/* uform serve in a build without libmicrohttpd or Linux: it says so, and the other commands work. */
#include "uform_command.h"

int command_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
#if UFORM_LINUX
    return command_fail("serve is not built: this build has no libmicrohttpd (install libmicrohttpd-dev and "
                        "run meson setup again)");
#else
    return command_fail("serve is not built: it watches libmicrohttpd through epoll and a signalfd, which "
                        "only Linux builds have");
#endif
}
