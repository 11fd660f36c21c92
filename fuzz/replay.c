/* A main for the fuzz targets outside libFuzzer: each file named, and each file of each folder named (not
 * recursing), is handed once to LLVMFuzzerTestOneInput, after LLVMFuzzerInitialize where the target has
 * one. The tests build the targets with it and run the seed corpora under Valgrind's memcheck, which sees
 * the reads of uninitialised memory that AddressSanitizer does not. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

/* Reads `path` whole and runs it; 0, or 1 where the file cannot be read. */
static int run_file(char const *path) {
    FILE *file = fopen(path, "rb");
    if (!file) return perror(path), 1;
    uint8_t *data = NULL;
    size_t size = 0, capacity = 0;
    for (;;) {
        if (size == capacity) {
            capacity = capacity ? 2 * capacity : 4096;
            uint8_t *grown = realloc(data, capacity);
            if (!grown) return fclose(file), free(data), fprintf(stderr, "%s: out of memory\n", path), 1;
            data = grown;
        }
        size_t got = fread(data + size, 1, capacity - size, file);
        size += got;
        if (got == 0) break;
    }
    int failed = ferror(file);
    fclose(file);
    if (failed) return free(data), perror(path), 1;
    /* An exact copy, so that a read past the end shows under memcheck. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) return free(data), fprintf(stderr, "%s: out of memory\n", path), 1;
    memcpy(exact, data, size);
    free(data);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    printf("ran %s (%zu bytes)\n", path, size);
    return 0;
}

static int by_name(void const *a, void const *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file of folder `path`, in name order. */
static int run_folder(char const *path) {
    DIR *folder = opendir(path);
    if (!folder) return perror(path), 1;
    char **names = NULL;
    size_t count = 0;
    int failed = 0;
    for (struct dirent *entry; !failed && (entry = readdir(folder));) {
        if (entry->d_name[0] == '.') continue;
        char **grown = realloc(names, (count + 1) * sizeof *names);
        size_t length = strlen(path) + strlen(entry->d_name) + 2;
        char *name = grown ? malloc(length) : NULL;
        if (grown) names = grown;
        if (!name) {
            failed = 1;
            break;
        }
        snprintf(name, length, "%s/%s", path, entry->d_name);
        names[count++] = name;
    }
    closedir(folder);
    if (failed) fprintf(stderr, "%s: out of memory\n", path);
    qsort(names, count, sizeof *names, by_name);
    for (size_t i = 0; i < count; ++i) {
        struct stat status;
        if (!failed && stat(names[i], &status) == 0 && S_ISREG(status.st_mode)) failed |= run_file(names[i]);
        free(names[i]);
    }
    free(names);
    return failed;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int failed = 0;
    for (int i = 1; i < argc; ++i) {
        struct stat status;
        if (stat(argv[i], &status) != 0) {
            perror(argv[i]);
            failed = 1;
        } else {
            failed |= S_ISDIR(status.st_mode) ? run_folder(argv[i]) : run_file(argv[i]);
        }
    }
    return failed;
}
