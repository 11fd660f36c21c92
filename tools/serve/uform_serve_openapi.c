/* The OpenAPI 3.0 document of `uform serve`, answered at GET /openapi.json: every route, the body each
 * takes, every status each answers with its body, and the bearer key as a security scheme. The
 * document is tools/serve/openapi.json, made a string at build time (scripts/embed_json.py), served with
 * the widths of every served model in place of its one marker; tests/tools/test_serve_openapi.py holds the
 * server to it with schemathesis. */
#include <string.h>

#include "uform_serve.h"

/* tools/serve/openapi.json, compact (uform_serve_openapi_document.c, written by the build). */
extern char const serve_openapi_document[];

static char const widths_marker[] = "\"@WIDTHS@\"";

void api_answer_openapi(serve_t const *server, serve_request_t *request) {
    serve_text_t text = {0};
    char const *marker = strstr(serve_openapi_document, widths_marker);
    text_append(&text, serve_openapi_document, (size_t)(marker - serve_openapi_document));
    /* Each width once, in the order the models give them. */
    size_t widths[SERVE_MODELS_MAX * (UFORM_MATRYOSHKA_MAX + 1)], count = 0;
    for (size_t m = 0; m < server->models_count; ++m) {
        uform_model_info_t const *info = &server->models[m].info;
        for (size_t i = 0; i <= info->matryoshka_count; ++i) {
            size_t width = i == 0 ? info->dims : info->matryoshka[i - 1];
            bool seen = false;
            for (size_t k = 0; k < count && !seen; ++k)
                seen = widths[k] == width;
            if (!seen) widths[count++] = width;
        }
    }
    for (size_t k = 0; k < count; ++k)
        text_printf(&text, "%zu, ", widths[k]);
    text_puts(&text, "null");
    text_puts(&text, marker + strlen(widths_marker));
    api_answer_text(request, MHD_HTTP_OK, &text, "application/json");
}
