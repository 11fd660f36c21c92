/* A main for the fuzz targets outside libFuzzer: each file named, and each file of each folder named (not
 * recursing, in name order), is handed once to LLVMFuzzerTestOneInput, after LLVMFuzzerInitialize where the
 * target has one. The tests build the targets with it and run the seed corpora under Valgrind's memcheck,
 * which sees the reads of uninitialised memory that AddressSanitizer does not. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

/* Runs the `size` bytes of `path` from a buffer of exactly that size, so that a read past the end shows
 * under memcheck; 0, or 1 where the file cannot be read. */
static int run_file(char const *path, size_t size) {
    FILE *file = fopen(path, "rb");
    if (!file) return perror(path), 1;
    uint8_t *data = malloc(size ? size : 1);
    int failed = !data || fread(data, 1, size, file) != size;
    if (failed) fprintf(stderr, "%s: cannot read %zu bytes\n", path, size);
    fclose(file);
    if (!failed) {
        LLVMFuzzerTestOneInput(data, size);
        printf("ran %s (%zu bytes)\n", path, size);
    }
    free(data);
    return failed;
}

static int run_path(char const *path, bool in_folder);

static int visible(struct dirent const *entry) {
    return entry->d_name[0] != '.';
}

/* Runs every regular file of folder `path`, in name order. */
static int run_folder(char const *path) {
    struct dirent **entries = NULL;
    int count = scandir(path, &entries, visible, alphasort);
    if (count < 0) return perror(path), 1;
    int failed = 0;
    for (int i = 0; i < count; ++i) {
        char name[4096];
        if (snprintf(name, sizeof name, "%s/%s", path, entries[i]->d_name) >= (int)sizeof name) {
            fprintf(stderr, "%s/%s: path too long\n", path, entries[i]->d_name);
            failed = 1;
        } else {
            failed |= run_path(name, true);
        }
        free(entries[i]);
    }
    free(entries);
    return failed;
}

/* A file, or a folder named on the command line; a folder's own folders are passed over. */
static int run_path(char const *path, bool in_folder) {
    struct stat status;
    if (stat(path, &status) != 0) return perror(path), 1;
    if (S_ISDIR(status.st_mode)) return in_folder ? 0 : run_folder(path);
    return S_ISREG(status.st_mode) ? run_file(path, (size_t)status.st_size) : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int failed = 0;
    for (int i = 1; i < argc; ++i)
        failed |= run_path(argv[i], false);
    return failed;
}
