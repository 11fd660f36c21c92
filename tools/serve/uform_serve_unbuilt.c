/* uform serve in a build without libmicrohttpd: it says so, and the other commands work. */
#include "uform_command.h"

int command_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return command_fail("serve is not built: this build has no libmicrohttpd (install libmicrohttpd-dev and "
                        "run meson setup again)");
}
