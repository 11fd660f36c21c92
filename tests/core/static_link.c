/* A program linked statically against libuform.a that defines functions and data of its own under names
 * the engine uses internally (failed, call_begin, output_row, tower_forward, media_observer,
 * checkpoint_clip_mean: `nm` of the engine's objects lists them as global, hidden definitions). It links
 * only because the archive's one object keeps those names local (scripts/localize_static.sh); against an
 * archive of the engine's objects as compiled, each would be defined twice.
 *
 * Then it runs the engine: a failing load (the engine's own error path, which records the failure
 * through its internal `failed`), the tiny seeded checkpoint written, loaded and two texts encoded, in
 * one batch and each alone. It checks that none of the program's functions and data was reached by the
 * engine, that the failure names its entry point, that the embeddings are unit-length and that a text's
 * row does not depend on the batch (bitwise), and prints the rows as hexadecimal floats: built against
 * the shared library the same program must print the same bytes (static_link.sh compares).
 *
 *   static_link CHECKPOINT   (written there; exits 0 when every check holds, else 1 with the reason) */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <uform.h>

/* The program's own definitions under the engine's internal names, with other meanings. */
int failed(int code);
int call_begin(char const *name);
double output_row(double value);
int tower_forward(int depth);
extern int media_observer;
extern char const checkpoint_clip_mean[];

static int own_calls; /* calls of the functions above, all made by this program */
int media_observer = 17;
char const checkpoint_clip_mean[] = "the program's own";

int failed(int code) {
    own_calls++;
    return code * 10;
}

int call_begin(char const *name) {
    own_calls++;
    return (int)strlen(name);
}

double output_row(double value) {
    own_calls++;
    return value / 2;
}

int tower_forward(int depth) {
    own_calls++;
    return depth + 1;
}

/* Each of the program's functions once; answers whether each answered as this program defines it. */
static int own_definitions_hold(void) {
    return failed(3) == 30 && call_begin("four") == 4 && output_row(5.0) == 2.5 && tower_forward(6) == 7 &&
           media_observer == 17 && strcmp(checkpoint_clip_mean, "the program's own") == 0;
}

/* The calling thread's last error, rendered (uform_error_render). */
typedef struct error_text {
    char text[256];
} error_text_t;

static error_text_t last_error_text(void) {
    error_text_t rendered;
    uform_error_t error = uform_last_error();
    uform_error_render(&error, rendered.text, sizeof rendered.text);
    return rendered;
}

static int fail(char const *what) {
    fprintf(stderr, "static_link: %s (%s)\n", what, last_error_text().text);
    return 1;
}

/* The engine's error path: a checkpoint that does not exist answers UFORM_IO from uform_model_load_ram. */
static int check_failing_load(uform_executor_t *executor, char const *checkpoint) {
    char missing[4096];
    snprintf(missing, sizeof missing, "%s.missing", checkpoint);
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.executor = executor, .path = missing, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_IO) return fail("a missing checkpoint did not answer io");
    uform_error_t error = uform_last_error();
    if (error.status != UFORM_IO || strcmp(error.entry, "uform_model_load_ram") != 0)
        return fail("the failure does not name uform_model_load_ram with io");
    return 0;
}

enum { MAX_TEXTS = 2, MAX_DIMS = 1024 };

/* What the engine runs on here: the loaded model, the executor and an arena of it. */
typedef struct engine {
    uform_model_t *model;
    uform_executor_t *executor;
    uform_arena_t *arena;
} engine_t;

/* Encodes texts [first, first + count) of "a cat", "a dog" into rows[first...]. */
static int encode(engine_t const *engine, size_t first, size_t count, float rows[][MAX_DIMS], size_t *dims) {
    static char const texts[] = "a cata dog";
    static size_t const offsets[] = {0, 5, 10};
    size_t shifted[MAX_TEXTS + 1];
    for (size_t i = 0; i <= count; ++i)
        shifted[i] = offsets[first + i] - offsets[first];
    uform_encoded_t encoded;
    uform_text_encode_args_t args = {
        .model = engine->model,
        .executor = engine->executor,
        .outputs = UFORM_OUTPUT_EMBEDDINGS,
        .arena = engine->arena,
        .encoded = &encoded,
        .texts = {.data = texts + offsets[first],
                  .offsets = shifted,
                  .count = count,
                  .length = shifted[count]},
    };
    if (uform_text_encode(&args) != UFORM_OK) return fail("uform_text_encode failed");
    if (encoded.items != count || encoded.embeddings.columns > MAX_DIMS)
        return fail("unexpected embedding shape");
    *dims = encoded.embeddings.columns;
    for (size_t i = 0; i < count; ++i) {
        float const *row = NULL;
        if (uform_view_row(&encoded.embeddings, i, (void const **)&row) != UFORM_OK) return fail("no row");
        memcpy(rows[first + i], row, *dims * sizeof(float));
    }
    return 0;
}

/* Every row unit-length; each text alone gives its batch row, bit for bit; then the rows printed. */
static int check_rows(float batch[][MAX_DIMS], float alone[][MAX_DIMS], size_t dims) {
    for (size_t i = 0; i < MAX_TEXTS; ++i) {
        double norm = 0;
        for (size_t j = 0; j < dims; ++j)
            norm += (double)batch[i][j] * batch[i][j];
        if (fabs(sqrt(norm) - 1) > 1e-5) return fail("an embedding is not unit-length");
        if (memcmp(batch[i], alone[i], dims * sizeof(float)) != 0) return fail("a row depends on its batch");
    }
    for (size_t i = 0; i < MAX_TEXTS; ++i) {
        printf("text %zu:", i);
        for (size_t j = 0; j < dims; ++j)
            printf(" %a", (double)batch[i][j]);
        printf("\n");
    }
    return 0;
}

static int run(char const *checkpoint, uform_executor_t *executor, uform_arena_t *arena) {
    static float batch[MAX_TEXTS][MAX_DIMS], alone[MAX_TEXTS][MAX_DIMS];
    size_t dims = 0;
    engine_t engine = {.executor = executor, .arena = arena};
    if (check_failing_load(executor, checkpoint)) return 1;
    uform_tiny_checkpoint_args_t tiny = {.path = checkpoint, .seed = 42};
    if (uform_tiny_checkpoint(&tiny) != UFORM_OK) return fail("cannot write the tiny checkpoint");
    uform_model_load_args_t load = {.executor = executor, .path = checkpoint, .model = &engine.model};
    if (uform_model_load_ram(&load) != UFORM_OK) return fail("cannot load the tiny checkpoint");
    int status = encode(&engine, 0, 2, batch, &dims) || encode(&engine, 0, 1, alone, &dims) ||
                 encode(&engine, 1, 1, alone, &dims) || check_rows(batch, alone, dims);
    uform_model_free(engine.model);
    return status;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CHECKPOINT\n", argv[0]);
        return 2;
    }
    if (!own_definitions_hold()) return fail("the program's own definitions do not answer as defined");
    uform_executor_t *executor = NULL;
    uform_arena_t *arena = NULL;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    options.pin = false;
    if (uform_executor_create_ram(&options, &executor) != UFORM_OK) return fail("cannot create an executor");
    int status = uform_arena_create(executor, &arena) != UFORM_OK ? fail("cannot create an arena")
                                                                  : run(argv[1], executor, arena);
    uform_arena_free(arena);
    uform_executor_free(executor);
    if (status) return 1;
    if (!own_definitions_hold() || own_calls != 8)
        return fail("the engine reached the program's own definitions");
    return 0;
}
