/* uform_tiny_checkpoint <path> [--seed N] [--depth N] [--hidden N] [--mlp N] [--context N] [--image-size N] [--image-patch N]
 * Writes a small, seeded, valid format-4 checkpoint with every tower. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uform.h>

static int usage(char const *program) {
    fprintf(stderr, "usage: %s <path> [--seed N] [--depth N] [--hidden N] [--mlp N] [--context N] [--image-size N] [--image-patch N]\n",
            program);
    return 2;
}

static int parse_number(char const *text, uint64_t *value) {
    char *end = NULL;
    errno = 0;
    unsigned long long parsed = strtoull(text, &end, 10);
    if (errno || !end || *end || text[0] == '-' || end == text) return -1;
    *value = parsed;
    return 0;
}

int main(int argc, char **argv) {
    uform_tiny_checkpoint_args_t args = {.path = NULL, .seed = 42};
    for (int i = 1; i < argc; ++i) {
        uint64_t value = 0;
        if (!strcmp(argv[i], "--seed") || !strcmp(argv[i], "--depth") || !strcmp(argv[i], "--hidden") ||
            !strcmp(argv[i], "--mlp") || !strcmp(argv[i], "--context") || !strcmp(argv[i], "--image-size") ||
            !strcmp(argv[i], "--image-patch")) {
            if (i + 1 >= argc || parse_number(argv[i + 1], &value) != 0) return usage(argv[0]);
            if (!strcmp(argv[i], "--seed"))
                args.seed = value;
            else if (!strcmp(argv[i], "--depth"))
                args.depth = (size_t)value;
            else if (!strcmp(argv[i], "--hidden"))
                args.hidden = (size_t)value;
            else if (!strcmp(argv[i], "--mlp"))
                args.mlp = (size_t)value;
            else if (!strcmp(argv[i], "--image-size"))
                args.image_size = (size_t)value;
            else if (!strcmp(argv[i], "--image-patch"))
                args.image_patch = (size_t)value;
            else
                args.context = (size_t)value;
            ++i;
        } else if (argv[i][0] == '-' || args.path) {
            return usage(argv[0]);
        } else {
            args.path = argv[i];
        }
    }
    if (!args.path) return usage(argv[0]);
    if (uform_tiny_checkpoint(&args) != UFORM_OK) {
        uform_error_t error = uform_last_error();
        char text[256];
        uform_error_render(&error, text, sizeof text);
        fprintf(stderr, "%s\n", text);
        return 1;
    }
    printf("wrote %s (seed %" PRIu64 ")\n", args.path, args.seed);
    return 0;
}
