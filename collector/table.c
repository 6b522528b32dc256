/* table.c — see table.h. */
#include "table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned hash_id(const char *s)
{
        unsigned h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h % TABLE_HASH_SIZE;
}

struct sandbox *table_find(const struct sandbox_table *t, const char *id)
{
        for (struct sandbox *s = t->hash[hash_id(id)]; s; s = s->hnext)
                if (strcmp(s->id, id) == 0)
                        return s;
        return NULL;
}

int table_add(struct sandbox_table *t, const char *id, struct sandbox **ret)
{
        struct sandbox *s = calloc(1, sizeof(*s));
        if (!s || !(s->pending_buf = malloc(SAMPLE_MAX))) {
                free(s);
                return -ENOMEM;
        }
        s->net_fd = -1;
        if (t->n == t->cap) {
                size_t cap = t->cap ? t->cap * 2 : 256;
                struct sandbox **l = realloc(t->list, cap * sizeof(*l));
                if (!l) {
                        sandbox_free(s);
                        return -ENOMEM;
                }
                t->list = l;
                t->cap = cap;
        }
        s->files = CGROUP_FILES_NONE;
        s->scan_cpu = s->scan_mem = CGROUP_SCAN_REF_NONE;
        memcpy(s->id, id, sizeof(s->id));
        s->index = t->n;
        t->list[t->n++] = s;
        unsigned h = hash_id(s->id);
        s->hnext = t->hash[h];
        t->hash[h] = s;
        *ret = s;
        return 0;
}

void table_remove(struct sandbox_table *t, struct sandbox *s)
{
        for (struct sandbox **p = &t->hash[hash_id(s->id)]; *p; p = &(*p)->hnext)
                if (*p == s) {
                        *p = s->hnext;
                        break;
                }
        t->list[s->index] = t->list[--t->n];
        t->list[s->index]->index = s->index;
}

void sandbox_free(struct sandbox *s)
{
        if (!s)
                return;
        cgroup_files_close(&s->files);
        if (s->net_fd >= 0)
                close(s->net_fd);
        free(s->cpu_dir);
        free(s->mem_dir);
        free(s->disk_path);
        free(s->pending_buf);
        free(s);
}

void table_free(struct sandbox_table *t)
{
        for (size_t i = 0; i < t->n; i++)
                sandbox_free(t->list[i]);
        free(t->list);
        t->list = NULL;
        t->n = t->cap = 0;
        memset(t->hash, 0, sizeof(t->hash));
}
