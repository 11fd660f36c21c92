/* uform_tiny_checkpoint PATH [--seed N] [--depth N] [--hidden N] [--mlp N] [--context N] [--image-size N]
 * [--image-patch N]: writes a small, seeded, valid format-4 checkpoint with every tower. The same tool as
 * `uform checkpoint tiny`, its flags and messages included, without the rest of the command. */
#include "uform_command.h"

int main(int argc, char **argv) {
    return command_checkpoint_tiny(argc, argv);
}
