/* metrics_http.c — see metrics_http.h. */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_http {
        struct MHD_Daemon *daemon;
        metrics_http_page_fn page;
        const void *arg;
        size_t page_size;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_size, void **state)
{
        (void)version;
        (void)upload_data;
        (void)upload_size;
        (void)state;
        const struct metrics_http *m = cls;
        char body[METRICS_HTTP_PAGE_MAX];
        unsigned status = MHD_HTTP_OK;
        int len;
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
                status = MHD_HTTP_METHOD_NOT_ALLOWED;
                len = snprintf(body, sizeof(body), "only GET\n");
        } else if (strcmp(url, "/metrics") != 0) {
                status = MHD_HTTP_NOT_FOUND;
                len = snprintf(body, sizeof(body), "not found: try /metrics\n");
        } else if ((len = m->page(m->arg, body, m->page_size)) < 0) {
                status = MHD_HTTP_INTERNAL_SERVER_ERROR;
                len = snprintf(body, sizeof(body), "metrics too large\n");
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer((size_t)len, body, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
        enum MHD_Result r = MHD_queue_response(conn, status, resp);
        MHD_destroy_response(resp);
        return r;
}

int metrics_http_start(const char *address, int port, metrics_http_page_fn page, const void *arg, size_t page_size,
                       struct metrics_http **ret)
{
        if (port == 0) {
                *ret = NULL;
                return 0;
        }
        if (page_size > METRICS_HTTP_PAGE_MAX)
                return -EINVAL;
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        if (inet_pton(AF_INET, address, &sa.sin_addr) != 1)
                return -EINVAL;
        struct metrics_http *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->page = page;
        m->arg = arg;
        m->page_size = page_size;
        /* epoll: with a descriptor per counter file (the collector), sockets are far above select()'s FD_SETSIZE. */
        m->daemon = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, answer, m,
                                     MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, 16u,
                                     MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                     MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536, MHD_OPTION_END);
        if (!m->daemon) {
                free(m);
                return -EADDRINUSE;
        }
        *ret = m;
        return 0;
}

void metrics_http_stop(struct metrics_http *m)
{
        if (!m)
                return;
        MHD_stop_daemon(m->daemon);
        free(m);
}
