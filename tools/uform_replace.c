/* A file that replaces another whole, so that a full disk, a failed run or a kill leaves the previous
 * file as it was: written under PATH.tmp-XXXXXX beside PATH (beside the file a symbolic link names),
 * synced, renamed over PATH, its folder synced. A writer holds an exclusive flock on its temporary while it
 * lives; a temporary of PATH that can be locked is a dead writer's, and each open removes those. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uform_command.h"

#define TEMPORARY_SUFFIX ".tmp-"
#define TEMPORARY_RANDOM 6 /* mkstemp's XXXXXX */

/* The folder of `path` ("." for a bare name) and where its base name starts, malloc'ed. */
static char *folder_of(char const *path, char const **base) {
    char const *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) return strdup(".");
    return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* Whether `name` in `folder` is a temporary of the base name `base` whose writer is gone. */
static bool stale_temporary(char const *folder, char const *name, char const *base) {
    size_t const length = strlen(base);
    size_t const suffix = sizeof TEMPORARY_SUFFIX - 1;
    if (strncmp(name, base, length) != 0 || strncmp(name + length, TEMPORARY_SUFFIX, suffix) != 0 ||
        strlen(name + length + suffix) != TEMPORARY_RANDOM)
        return false;
    int const folder_fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (folder_fd < 0) return false;
    int const fd = openat(folder_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    bool const stale = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (fd >= 0) close(fd);
    close(folder_fd);
    return stale;
}

/* Removes the temporaries that killed writers of `path` left. A folder that cannot be listed has none
 * this writer could remove; the open that follows reports it. */
static void remove_stale(char const *path) {
    char const *base = NULL;
    char *folder = folder_of(path, &base);
    DIR *listing = folder ? opendir(folder) : NULL;
    for (struct dirent *entry; listing && (entry = readdir(listing));) {
        if (!stale_temporary(folder, entry->d_name, base)) continue;
        char *stale = command_join(folder, "/", entry->d_name);
        if (stale) unlink(stale);
        free(stale);
    }
    if (listing) closedir(listing);
    free(folder);
}

int replacement_open(char const *path, replacement_t *replacement) {
    *replacement = (replacement_t){0};
    /* A symbolic link is written through: the file it names is replaced, and the link stays. */
    struct stat link;
    char *target = lstat(path, &link) == 0 && S_ISLNK(link.st_mode) ? realpath(path, NULL) : NULL;
    replacement->path = target ? target : strdup(path);
    if (replacement->path) path = replacement->path;
    remove_stale(path);
    if (replacement->path) replacement->temporary = command_join(path, TEMPORARY_SUFFIX, "XXXXXX");
    if (!replacement->temporary) {
        free(replacement->path);
        *replacement = (replacement_t){0};
        return command_fail("out of memory");
    }
    /* mkstemp, not mkostemp, which POSIX.1-2008 lacks; the command starts no program while it writes, so
     * close-on-exec set just after cannot race an exec. */
    int const fd = mkstemp(replacement->temporary);
    if (fd < 0) {
        int const code = command_fail("cannot create %s: %s", path, strerror(errno));
        free(replacement->temporary);
        replacement->temporary = NULL; /* nothing to remove */
        replacement_abort(replacement);
        return code;
    }
    /* mkstemp makes the file private; the new file gets the permissions of any file the user creates. */
    mode_t const mask = umask(0);
    umask(mask);
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 ||
        fchmod(fd, 0666 & ~mask) != 0 || !(replacement->file = fdopen(fd, "wb"))) {
        int const code = command_fail("cannot write %s: %s", path, strerror(errno));
        close(fd);
        replacement_abort(replacement);
        return code;
    }
    return COMMAND_OK;
}

/* The directory entry of a rename is durable once its folder is synced. Filesystems that cannot sync
 * a folder answer EINVAL; that is no fault. */
static int sync_folder(char const *path) {
    char const *base = NULL;
    char *folder = folder_of(path, &base);
    if (!folder) return command_fail("out of memory");
    int const fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int code = COMMAND_OK;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        code = command_fail("cannot sync the folder of %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    free(folder);
    return code;
}

int replacement_commit(replacement_t *replacement) {
    FILE *file = replacement->file;
    replacement->file = NULL;
    errno = 0;
    bool const written = fflush(file) == 0 && fsync(fileno(file)) == 0;
    int error = errno;
    if (fclose(file) != 0 && written) error = errno;
    int code = COMMAND_OK;
    if (!written || error)
        code = command_fail("cannot write %s: %s", replacement->path, strerror(error ? error : EIO));
    else if (rename(replacement->temporary, replacement->path) != 0)
        code = command_fail("cannot rename into %s: %s", replacement->path, strerror(errno));
    if (code == COMMAND_OK) {
        free(replacement->temporary);
        replacement->temporary = NULL; /* renamed: nothing to remove */
        code = sync_folder(replacement->path);
    }
    replacement_abort(replacement);
    return code;
}

void replacement_abort(replacement_t *replacement) {
    if (replacement->file) fclose(replacement->file);
    if (replacement->temporary) unlink(replacement->temporary);
    free(replacement->temporary);
    free(replacement->path);
    *replacement = (replacement_t){0};
}
