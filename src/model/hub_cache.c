/* Models in the local cache of the Hugging Face hub, found as huggingface_hub finds them offline
 * (`snapshot_download(id, revision=..., local_files_only=True)`):
 *
 *   CACHE/models--OWNER--NAME/refs/REVISION      the commit a branch or tag names
 *   CACHE/models--OWNER--NAME/snapshots/COMMIT/  the files (links into ../../blobs/)
 *
 * CACHE is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. Nothing is downloaded. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "hub_cache.h"

/* Whether `name` is one part of a repository id as the hub takes it: letters, digits, '-', '_' and '.',
 * neither starting nor ending with '-' or '.', without "--" or "..", at most 96 bytes. */
static bool hub_id_part(char const *name, size_t length) {
    if (length == 0 || length > 96) return false;
    if (name[0] == '-' || name[0] == '.' || name[length - 1] == '-' || name[length - 1] == '.') return false;
    for (size_t i = 0; i < length; ++i) {
        char c = name[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        if (!plain && c != '-' && c != '.') return false;
        if (i && (c == '-' || c == '.') && name[i - 1] == c) return false;
    }
    return true;
}

/* Whether `revision` may name a file under refs/ or snapshots/: parts of letters, digits, '-', '_' and
 * '.' between single slashes (refs/pr/1), none "." or "..". */
static bool hub_revision(char const *revision, size_t length) {
    if (length == 0 || length > 255 || revision[0] == '/' || revision[length - 1] == '/') return false;
    size_t part = 0;
    for (size_t i = 0; i <= length; ++i) {
        char c = i < length ? revision[i] : '/';
        if (c == '/') {
            if (part == 0) return false;
            char const *start = revision + i - part;
            if ((part == 1 && start[0] == '.') || (part == 2 && start[0] == '.' && start[1] == '.'))
                return false;
            part = 0;
            continue;
        }
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!plain && c != '-' && c != '_' && c != '.') return false;
        ++part;
    }
    return true;
}

static bool hub_commit(char const *text, size_t length) {
    if (length != 40) return false;
    for (size_t i = 0; i < length; ++i)
        if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f'))) return false;
    return true;
}

/* A set, non-empty variable's value, else NULL. */
static char const *hub_variable(char const *name) {
    char const *value = getenv(name);
    return value && *value ? value : NULL;
}

/* Appends `text` (its `length` bytes) to `path` at *at; false when it does not fit in `capacity`. */
static bool hub_append(char *path, size_t capacity, size_t *at, char const *text, size_t length) {
    if (length >= capacity - *at) return false;
    memcpy(path + *at, text, length);
    *at += length;
    path[*at] = '\0';
    return true;
}

/* The cache folder into `path`, a leading "~/" as $HOME; false when it does not fit or no variable
 * gives it. */
static bool hub_cache_folder(char *path, size_t capacity, size_t *at) {
    char const *base = NULL, *tail = "";
    if ((base = hub_variable("HF_HUB_CACHE")) || (base = hub_variable("HUGGINGFACE_HUB_CACHE")))
        tail = "";
    else if ((base = hub_variable("HF_HOME")))
        tail = "/hub";
    else if ((base = hub_variable("XDG_CACHE_HOME")))
        tail = "/huggingface/hub";
    else
        base = "~", tail = "/.cache/huggingface/hub";
    *at = 0;
    path[0] = '\0';
    if (base[0] == '~' && (base[1] == '/' || base[1] == '\0')) {
        char const *home = hub_variable("HOME");
        if (!home || !hub_append(path, capacity, at, home, strlen(home))) return false;
        ++base;
    }
    return hub_append(path, capacity, at, base, strlen(base)) &&
           hub_append(path, capacity, at, tail, strlen(tail));
}

static bool hub_is_folder(char const *path) {
    struct stat status;
    return stat(path, &status) == 0 && S_ISDIR(status.st_mode);
}

/* The commit refs/`revision` names (40 hex digits, a trailing newline allowed), read into `commit`. */
static bool hub_ref(char const *path, char commit[41]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[64];
    ssize_t got;
    do
        got = read(fd, text, sizeof text);
    while (got < 0 && errno == EINTR);
    close(fd);
    size_t length = got > 0 ? (size_t)got : 0;
    while (length && (text[length - 1] == '\n' || text[length - 1] == '\r'))
        --length;
    if (!hub_commit(text, length)) return false;
    memcpy(commit, text, 40);
    commit[40] = '\0';
    return true;
}

/* A repository id as the hub takes it, [OWNER/]NAME[@REVISION], its parts pointing into the text. */
typedef struct hub_id {
    char const *owner, *name, *revision; /* revision: "main" when the id names none */
    size_t owner_length, name_length, revision_length;
} hub_id_t;

static bool hub_id_parse(char const *id, hub_id_t *parsed) {
    if (!id) return false;
    char const *at = strchr(id, '@');
    size_t length = at ? (size_t)(at - id) : strlen(id);
    char const *slash = memchr(id, '/', length);
    size_t owner = slash ? (size_t)(slash - id) : 0;
    if (slash && !hub_id_part(id, owner)) return false;
    char const *name = slash ? slash + 1 : id;
    size_t name_length = length - (size_t)(name - id);
    if (!hub_id_part(name, name_length)) return false;
    char const *revision = at ? at + 1 : "main";
    size_t revision_length = strlen(revision);
    if (!hub_revision(revision, revision_length)) return false;
    *parsed = (hub_id_t){.owner = id,
                         .owner_length = owner,
                         .name = name,
                         .name_length = name_length,
                         .revision = revision,
                         .revision_length = revision_length};
    return true;
}

uform_status_t hub_folder(char const *id, char *folder, size_t capacity, char const **message,
                          char text[UFORM_ERROR_MESSAGE_SIZE]) {
    hub_id_t parsed;
    if (!hub_id_parse(id, &parsed))
        return *message = "not a hub model id: NAME or OWNER/NAME, then @REVISION if not main",
               UFORM_INVALID_ARGUMENT;
    char path[4096];
    size_t at = 0;
    if (!hub_cache_folder(path, sizeof path, &at))
        return *message = "no cache folder: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME and HOME is set",
               UFORM_IO;
    bool fits = hub_append(path, sizeof path, &at, "/models--", 9);
    if (parsed.owner_length)
        fits = fits && hub_append(path, sizeof path, &at, parsed.owner, parsed.owner_length) &&
               hub_append(path, sizeof path, &at, "--", 2);
    fits = fits && hub_append(path, sizeof path, &at, parsed.name, parsed.name_length);
    size_t repository = at;
    char commit[41];
    bool named = hub_commit(parsed.revision, parsed.revision_length);
    if (named) {
        memcpy(commit, parsed.revision, 41);
    } else {
        fits = fits && hub_append(path, sizeof path, &at, "/refs/", 6) &&
               hub_append(path, sizeof path, &at, parsed.revision, parsed.revision_length);
        named = fits && hub_ref(path, commit);
    }
    at = repository;
    path[at] = '\0';
    fits = fits && hub_append(path, sizeof path, &at, "/snapshots/", 11) &&
           hub_append(path, sizeof path, &at, commit, named ? 40 : 0);
    if (!fits) return *message = "the cached model's path is too long", UFORM_INVALID_ARGUMENT;
    if (!named || !hub_is_folder(path)) {
        path[repository] = '\0';
        snprintf(text, UFORM_ERROR_MESSAGE_SIZE,
                 "not in the Hugging Face cache: no snapshot of revision %.*s in %s",
                 (int)parsed.revision_length, parsed.revision, path);
        return *message = text, UFORM_IO;
    }
    if (at >= capacity)
        return *message = "the cached model's path is longer than the room given", UFORM_INVALID_ARGUMENT;
    memcpy(folder, path, at + 1);
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_hub_folder(char const *id, char *folder, size_t capacity, size_t *length) {
    static char const entry[] = "uform_hub_folder";
    if (!id || !folder || !length) return failed(UFORM_INVALID_ARGUMENT, entry, "an argument is NULL");
    *length = 0;
    if (capacity) *folder = '\0';
    char const *message = NULL;
    char text[UFORM_ERROR_MESSAGE_SIZE];
    uform_status_t status = hub_folder(id, folder, capacity, &message, text);
    if (status != UFORM_OK) return failed(status, entry, message);
    *length = strlen(folder);
    return UFORM_OK;
}
