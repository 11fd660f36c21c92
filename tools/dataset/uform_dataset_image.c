/* The pictures of `uform dataset synth`: one shape over a grey background, antialiased by 4x4
 * supersampling, and the PNG writer (libspng's encoder, where the build has it). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if UFORM_DATASET_WITH_SPNG
#include <spng.h>
#endif

#include "uform_command.h"
#include "uform_dataset.h"

char const *const dataset_shape_names[DATASET_SHAPES] = {"circle", "square", "triangle", "diamond",
                                                         "star",   "cross",  "ring",     "hexagon"};

enum { SUPERSAMPLES = 4 }; /* per side of a pixel: 16 samples of coverage */

/* Whether (u, v), the point in the shape's own units (its circle of radius 1, y down), is inside a
 * convex or star polygon of `count` vertices at radii alternating `outer`, `inner` (equal for a regular
 * polygon), the first vertex straight up. Even-odd rule. */
static bool inside_polygon(double u, double v, size_t count, double outer, double inner) {
    bool inside = false;
    double const pi = 3.14159265358979323846;
    double previous_x = 0, previous_y = 0;
    for (size_t i = 0; i <= count; ++i) {
        double radius = (i % 2 == 0 || inner == outer) ? outer : inner;
        double angle = -pi / 2 + 2 * pi * (double)(i % count) / (double)count;
        double x = radius * cos(angle), y = radius * sin(angle);
        if (i > 0 && ((y > v) != (previous_y > v)) && u < (previous_x - x) * (v - y) / (previous_y - y) + x)
            inside = !inside;
        previous_x = x;
        previous_y = y;
    }
    return inside;
}

static bool inside_shape(dataset_shape_kind_t kind, double u, double v) {
    double r2 = u * u + v * v;
    switch (kind) {
    case DATASET_CIRCLE:
        return r2 <= 1;
    case DATASET_RING:
        return r2 <= 1 && r2 >= 0.55 * 0.55;
    case DATASET_SQUARE:
        return fabs(u) <= 0.72 && fabs(v) <= 0.72;
    case DATASET_DIAMOND:
        return fabs(u) + fabs(v) <= 1;
    case DATASET_CROSS:
        return (fabs(u) <= 0.3 && fabs(v) <= 0.92) || (fabs(v) <= 0.3 && fabs(u) <= 0.92);
    case DATASET_TRIANGLE:
        return inside_polygon(u, v, 3, 1, 1);
    case DATASET_STAR:
        return inside_polygon(u, v, 10, 1, 0.45);
    case DATASET_HEXAGON:
        return inside_polygon(u, v, 6, 1, 1);
    case DATASET_SHAPES:
        break;
    }
    return false;
}

static uint8_t clamp_byte(double value) {
    if (value <= 0) return 0;
    if (value >= 255) return 255;
    return (uint8_t)lround(value);
}

void dataset_draw(uint8_t *rgb, size_t side, dataset_background_t const *background,
                  dataset_shape_t const *shape, random_stream_t *random) {
    double const cosine = cos(shape->angle), sine = sin(shape->angle), scale = 1 / shape->radius;
    /* Only pixels near the shape are sampled: every shape fits its circle, 1.1 leaves room for rounding. */
    double reach = shape->radius * 1.1 + 1;
    double left = floor(shape->x - reach), right = ceil(shape->x + reach);
    double top = floor(shape->y - reach), bottom = ceil(shape->y + reach);
    for (size_t y = 0; y < side; ++y) {
        for (size_t x = 0; x < side; ++x) {
            double coverage = 0;
            if ((double)x >= left && (double)x <= right && (double)y >= top && (double)y <= bottom) {
                int hits = 0;
                for (int sy = 0; sy < SUPERSAMPLES; ++sy)
                    for (int sx = 0; sx < SUPERSAMPLES; ++sx) {
                        double px = (double)x + (sx + 0.5) / SUPERSAMPLES - shape->x;
                        double py = (double)y + (sy + 0.5) / SUPERSAMPLES - shape->y;
                        /* Turned back by the shape's angle, into its own units. */
                        double u = (px * cosine + py * sine) * scale, v = (py * cosine - px * sine) * scale;
                        hits += inside_shape(shape->kind, u, v);
                    }
                coverage = (double)hits / (SUPERSAMPLES * SUPERSAMPLES);
            }
            uint8_t *pixel = rgb + (y * side + x) * 3;
            for (int c = 0; c < 3; ++c) {
                double value = background->level * (1 - coverage) + shape->rgb[c] * coverage;
                if (background->noise > 0)
                    value +=
                        background->noise * (random_stream_unit(random) + random_stream_unit(random) - 1);
                pixel[c] = clamp_byte(value);
            }
        }
    }
}

#if UFORM_DATASET_WITH_SPNG

char const *dataset_png_unbuilt(void) {
    return NULL;
}

int dataset_png_write(char const *path, uint8_t const *rgb, size_t side) {
    int code = COMMAND_RUNTIME, error = 0;
    FILE *file = NULL;
    spng_ctx *context = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!context) return command_fail("out of memory");
    file = fopen(path, "wb");
    if (!file) {
        code = command_fail("cannot create %s: %s", path, strerror(errno));
        goto fail;
    }
    struct spng_ihdr header = {.width = (uint32_t)side,
                               .height = (uint32_t)side,
                               .bit_depth = 8,
                               .color_type = SPNG_COLOR_TYPE_TRUECOLOR};
    if ((error = spng_set_png_file(context, file)) != 0 || (error = spng_set_ihdr(context, &header)) != 0 ||
        (error = spng_encode_image(context, rgb, side * side * 3, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE)) != 0) {
        code = command_fail("cannot encode %s: %s", path, spng_strerror(error));
        goto fail;
    }
    spng_ctx_free(context);
    context = NULL;
    if (fclose(file) != 0) {
        file = NULL;
        code = command_fail("cannot write %s: %s", path, strerror(errno));
        goto fail;
    }
    return COMMAND_OK;
fail:
    spng_ctx_free(context);
    if (file) fclose(file);
    remove(path);
    return code;
}

#else

char const *dataset_png_unbuilt(void) {
    return "this build has no libspng";
}

int dataset_png_write(char const *path, uint8_t const *rgb, size_t side) {
    (void)rgb;
    (void)side;
    return command_fail("cannot write %s: %s", path, dataset_png_unbuilt());
}

#endif
