/* The OpenAPI document (api-read's api_openapi_json) and the server's route
 * table (api_route) name the same routes: every (method, path) the server
 * answers is in the document, and every one the document names is answered. */
#include "server.h"

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

static void same_routes(void **state)
{
        (void)state;
        json_error_t e;
        json_t *doc = json_loads(api_openapi_json(), 0, &e);
        assert_non_null(doc);
        json_t *paths = json_object_get(doc, "paths");
        assert_true(json_is_object(paths));
        size_t n = 0;
        const char *method, *pattern;
        for (size_t i = 0; (pattern = api_route(i, &method)); i++, n++) {
                char lower[16];
                size_t k = 0;
                for (; method[k] && k < sizeof(lower) - 1; k++)
                        lower[k] = (char)(method[k] | 0x20);
                lower[k] = '\0';
                if (!json_object_get(json_object_get(paths, pattern), lower))
                        fail_msg("the server answers %s %s, the OpenAPI document does not have it", method, pattern);
        }
        const char *path;
        json_t *ops;
        json_object_foreach(paths, path, ops) {
                const char *m;
                json_t *op;
                json_object_foreach(ops, m, op) {
                        if (strcmp(m, "parameters") == 0)
                                continue;
                        bool found = false;
                        for (size_t i = 0; (pattern = api_route(i, &method)) && !found; i++)
                                found = strcmp(pattern, path) == 0 && strcasecmp(method, m) == 0;
                        if (!found)
                                fail_msg("the OpenAPI document has %s %s, the server does not answer it", m, path);
                }
        }
        assert_true(n > 10);
        json_decref(doc);
}

int main(void)
{
        const struct CMUnitTest tests[] = { cmocka_unit_test(same_routes) };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
