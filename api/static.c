/* static.c — the dashboard's files, served by tally-api: GET / is
 * web/index.html, GET /static/NAME one file of web/ (the page's script and
 * style) or of the chart library npm installed into web/node_modules. The
 * page itself talks to tally only through the public /v1 API with the
 * person's session, like any other client.
 *
 * Where the files are: $TALLY_WEB_DIR when set, else the installed folder
 * (<datadir>/tally/web) when it holds index.html, else the source tree's
 * web/ (a development build run in place). Only names made of [a-z0-9._-]
 * that do not start with a dot are served, from that one folder: no path
 * ever reaches the file system from the request beyond that name. */
#include "static.h"

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef TALLY_WEB_DIR_INSTALLED
#define TALLY_WEB_DIR_INSTALLED "/usr/local/share/tally/web"
#endif
#ifndef TALLY_WEB_DIR_SOURCE
#define TALLY_WEB_DIR_SOURCE "./web"
#endif

#define STATIC_MAX_BYTES (8 * 1024 * 1024)

/* Files npm installs (web/package.json), by the name the page asks for: the
 * installed tree keeps them in vendor/, the source tree in node_modules/. */
static const struct {
        const char *name, *vendor, *module;
} vendored[] = {
        { "uplot.js", "vendor/uPlot.iife.min.js", "node_modules/uplot/dist/uPlot.iife.min.js" },
        { "uplot.css", "vendor/uPlot.min.css", "node_modules/uplot/dist/uPlot.min.css" },
};

static bool is_file(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static const char *web_dir(void)
{
        const char *env = getenv("TALLY_WEB_DIR");
        if (env && *env)
                return env;
        if (is_file(TALLY_WEB_DIR_INSTALLED "/index.html"))
                return TALLY_WEB_DIR_INSTALLED;
        return TALLY_WEB_DIR_SOURCE;
}

static const char *content_type(const char *name)
{
        const char *dot = strrchr(name, '.');
        if (!dot)
                return "application/octet-stream";
        if (strcmp(dot, ".html") == 0)
                return "text/html; charset=utf-8";
        if (strcmp(dot, ".js") == 0)
                return "text/javascript; charset=utf-8";
        if (strcmp(dot, ".css") == 0)
                return "text/css; charset=utf-8";
        if (strcmp(dot, ".png") == 0)
                return "image/png";
        if (strcmp(dot, ".svg") == 0)
                return "image/svg+xml";
        return "application/octet-stream";
}

/* Reads path whole into out's body. Returns 0, -ENOENT, or -EIO. */
static int read_into(const char *path, struct api_reply *out)
{
        FILE *f = fopen(path, "rb");
        if (!f)
                return errno == ENOENT || errno == ENOTDIR ? -ENOENT : -EIO;
        struct stat st;
        if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > STATIC_MAX_BYTES) {
                fclose(f);
                return -ENOENT;
        }
        size_t size = (size_t)st.st_size;
        char *buf = malloc(size + 1);
        if (!buf) {
                fclose(f);
                return -ENOMEM;
        }
        size_t n = fread(buf, 1, size, f);
        int bad = ferror(f);
        fclose(f);
        if (bad || n != size) {
                free(buf);
                return -EIO;
        }
        buf[n] = '\0';
        free(out->body);
        out->body = buf;
        out->len = n;
        out->status = 200;
        return 0;
}

static bool name_ok(const char *name)
{
        if (!name[0] || name[0] == '.')
                return false;
        for (const char *p = name; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
                        return false;
        return true;
}

static int serve(const char *name, struct api_reply *out, struct api_error *err)
{
        const char *dir = web_dir();
        char path[4096];
        int r = -ENOENT;
        bool known = false;
        for (size_t i = 0; i < sizeof(vendored) / sizeof(vendored[0]); i++) {
                if (strcmp(name, vendored[i].name) != 0)
                        continue;
                known = true;
                snprintf(path, sizeof(path), "%s/%s", dir, vendored[i].vendor);
                r = read_into(path, out);
                if (r == -ENOENT) {
                        snprintf(path, sizeof(path), "%s/%s", dir, vendored[i].module);
                        r = read_into(path, out);
                }
                if (r == -ENOENT)
                        return api_fail(err, 404, "not_found", NULL,
                                        "%s is not installed: run `npm ci` in web/ (./scripts/up does)", name);
        }
        if (!known) {
                if (!name_ok(name))
                        return api_fail(err, 404, "not_found", NULL, "no file %s", name);
                snprintf(path, sizeof(path), "%s/%s", dir, name);
                r = read_into(path, out);
        }
        if (r == -ENOENT)
                return api_fail(err, 404, "not_found", NULL, "no file %s", name);
        if (r < 0) {
                log_error("could not read a dashboard file", "path=%s error=\"%s\"", path, strerror(-r));
                return api_fail(err, 500, "internal", NULL, "could not read %s", name);
        }
        out->content_type = content_type(name);
        /* The page runs only its own files: no inline script, no other origin, not framed
         * (uPlot and the page set element styles, hence 'unsafe-inline' for styles alone). */
        snprintf(out->headers[0], sizeof(out->headers[0]), "%s",
                 "Content-Security-Policy: default-src 'self'; img-src 'self' data:; "
                 "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'");
        snprintf(out->headers[1], sizeof(out->headers[1]), "%s", "X-Content-Type-Options: nosniff");
        return 0;
}

int h_static_index(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        (void)r;
        return serve("index.html", out, err);
}

int h_static_file(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        return serve(r->id, out, err);
}
