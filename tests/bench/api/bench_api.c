/* bench_api.c — times tally-api's read handlers called in-process (no HTTP):
 *   bench-api DB_URL ACCOUNT KEY|- usage|spend N "QUERY"
 * runs the handler N times on one connection and prints
 * calls_per_s=, p50_ms=, p99_ms= (milliseconds with three decimals, from
 * integer nanoseconds). KEY "-" calls as the account's person. */
#include "api.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct params {
        int n;
        char *name[16], *value[16];
};

static const char *get_param(void *ctx, const char *name)
{
        struct params *p = ctx;
        for (int i = 0; i < p->n; i++) {
                if (!strcmp(p->name[i], name))
                        return p->value[i];
        }
        return NULL;
}

static int cmp64(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return (x > y) - (x < y);
}

static void print_ms(const char *name, int64_t ns)
{
        printf("%s=%lld.%03lld\n", name, (long long)(ns / 1000000), (long long)(ns / 1000 % 1000));
}

int main(int argc, char **argv)
{
        if (argc != 7) {
                fprintf(stderr, "usage: bench-api DB_URL ACCOUNT KEY|- usage|spend N QUERY\n");
                return 2;
        }
        PGconn *db = PQconnectdb(argv[1]);
        if (PQstatus(db) != CONNECTION_OK) {
                fprintf(stderr, "could not connect: %s", PQerrorMessage(db));
                return 1;
        }
        struct api_caller c = { 0 };
        snprintf(c.account, sizeof(c.account), "%s", argv[2]);
        if (strcmp(argv[3], "-") != 0)
                snprintf(c.key, sizeof(c.key), "%s", argv[3]);
        else
                snprintf(c.person, sizeof(c.person), "bench-person");
        bool usage = !strcmp(argv[4], "usage");
        int n = atoi(argv[5]);
        struct params p = { 0 };
        char *qs = strdup(argv[6]), *save = NULL;
        for (char *t = strtok_r(qs, "&", &save); t && p.n < 16; t = strtok_r(NULL, "&", &save)) {
                char *eq = strchr(t, '=');
                p.name[p.n] = t;
                p.value[p.n++] = eq ? (*eq = '\0', eq + 1) : t + strlen(t);
        }
        int64_t *lat = calloc((size_t)n, sizeof(*lat));
        int64_t t0 = time_mono_ns();
        size_t bytes = 0;
        for (int i = 0; i < n; i++) {
                struct api_body b = { 0 };
                struct api_error e = { 0 };
                int64_t s = time_mono_ns();
                int r = usage ? api_usage(db, &c, get_param, &p, false, &b, &e) : api_spend(db, &c, get_param, &p, &b, &e);
                lat[i] = time_mono_ns() - s;
                if (r < 0) {
                        fprintf(stderr, "could not call the handler: %d %s %s\n", e.status, e.code, e.message);
                        return 1;
                }
                bytes = b.len;
                free(b.data);
        }
        int64_t total = time_mono_ns() - t0;
        qsort(lat, (size_t)n, sizeof(*lat), cmp64);
        printf("calls_per_s=%lld\n", (long long)((int64_t)n * 1000000000 / (total ? total : 1)));
        print_ms("p50_ms", lat[(n * 50 + 99) / 100 - 1]);
        print_ms("p99_ms", lat[(n * 99 + 99) / 100 - 1]);
        printf("body_bytes=%zu\n", bytes);
        free(lat);
        free(qs);
        PQfinish(db);
        return 0;
}
