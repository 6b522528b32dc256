/* records.c — see records.h. */
#include "records.h"
#include "beneath.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RECORD_TRIES 3 /* immediate attempts at a record write before the tick takes over */

void records_init(struct records *t, const char *state_dir)
{
        memset(t, 0, sizeof(*t));
        t->state_dir = state_dir;
        pthread_mutex_init(&t->lock, NULL);
        atomic_init(&t->write_failures, 0);
}

void records_free(struct records *t)
{
        while (t->list)
                records_unlink(t, t->list);
        pthread_mutex_destroy(&t->lock);
}

struct sandbox *sandbox_new(void)
{
        struct sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return NULL;
        sb->refs = 1;
        sb->pidfd = -1;
        pthread_mutex_init(&sb->op, NULL);
        pthread_mutex_init(&sb->exec_lock, NULL);
        return sb;
}

void sandbox_unref(struct records *t, struct sandbox *sb)
{
        pthread_mutex_lock(&t->lock);
        bool last = --sb->refs == 0;
        pthread_mutex_unlock(&t->lock);
        if (!last)
                return;
        egress_close(sb->egress);
        if (sb->bs && sb->ops)
                sb->ops->free(sb->bs);
        sandbox_record_clear(&sb->rec);
        if (sb->pidfd >= 0)
                close(sb->pidfd);
        pthread_mutex_destroy(&sb->op);
        pthread_mutex_destroy(&sb->exec_lock);
        free(sb);
}

struct sandbox *records_get(struct records *t, const char *id)
{
        pthread_mutex_lock(&t->lock);
        struct sandbox *sb = t->list;
        while (sb && strcmp(sb->rec.id, id) != 0)
                sb = sb->next;
        if (sb)
                sb->refs++;
        pthread_mutex_unlock(&t->lock);
        return sb;
}

void records_insert(struct records *t, struct sandbox *sb)
{
        pthread_mutex_lock(&t->lock);
        sb->next = t->list;
        t->list = sb;
        pthread_mutex_unlock(&t->lock);
}

void records_unlink(struct records *t, struct sandbox *sb)
{
        bool found = false;
        pthread_mutex_lock(&t->lock);
        for (struct sandbox **p = &t->list; *p; p = &(*p)->next)
                if (*p == sb) {
                        *p = sb->next;
                        sb->removed = true;
                        found = true;
                        break;
                }
        pthread_mutex_unlock(&t->lock);
        if (found)
                sandbox_unref(t, sb);
}

int records_snapshot(struct records *t, struct sandbox ***ret)
{
        pthread_mutex_lock(&t->lock);
        int n = 0;
        for (struct sandbox *sb = t->list; sb; sb = sb->next)
                n++;
        struct sandbox **all = calloc((size_t)n + 1, sizeof(*all));
        if (!all) {
                pthread_mutex_unlock(&t->lock);
                return -ENOMEM;
        }
        n = 0;
        for (struct sandbox *sb = t->list; sb; sb = sb->next) {
                sb->refs++;
                all[n++] = sb;
        }
        pthread_mutex_unlock(&t->lock);
        *ret = all;
        return n;
}

void records_snapshot_free(struct records *t, struct sandbox **all, int n)
{
        for (int i = 0; i < n; i++)
                sandbox_unref(t, all[i]);
        free(all);
}

int records_count(struct records *t)
{
        pthread_mutex_lock(&t->lock);
        int n = 0;
        for (struct sandbox *sb = t->list; sb; sb = sb->next)
                n++;
        pthread_mutex_unlock(&t->lock);
        return n;
}

int records_write(struct records *t, const struct sandbox_record *rec)
{
        int r = registry_write(t->state_dir, rec);
        if (r < 0)
                atomic_fetch_add(&t->write_failures, 1);
        return r;
}

int records_save(struct records *t, struct sandbox *sb)
{
        int r = 0;
        for (int i = 0; i < RECORD_TRIES; i++)
                if ((r = records_write(t, &sb->rec)) == 0)
                        break;
        if (r < 0 && !sb->record_dirty)
                log_error("could not write a sandbox's record; retrying every second", "sandbox=%s state=%s error=\"%s\"",
                          sb->rec.id, sandbox_state_name(sb->rec.state), strerror(-r));
        else if (r == 0 && sb->record_dirty)
                log_info("sandbox's record written after an earlier failure", "sandbox=%s state=%s", sb->rec.id,
                         sandbox_state_name(sb->rec.state));
        sb->record_dirty = r < 0;
        return r;
}

int record_failed(const struct sandbox *sb, int r, const char *done, char *why, size_t whylen)
{
        if (why)
                snprintf(why, whylen, "sandbox %s is %s, but its registry record could not be written (%s); "
                         "tally-vmm keeps retrying", sb->rec.id, done, strerror(-r));
        return -EIO;
}

int sandbox_new_id(char *buf, size_t size)
{
        unsigned char b[8];
        if (RAND_bytes(b, sizeof(b)) != 1)
                return -EIO;
        snprintf(buf, size, "sbx-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6],
                 b[7]);
        return 0;
}

void sandbox_dir_path(const char *state_dir, const char *id, char *buf, size_t size)
{
        snprintf(buf, size, "%s/" SANDBOX_DIR "/%s", state_dir, id);
}

void sandbox_remove_dir(const char *path)
{
        int r = beneath_remove_tree(path);
        if (r < 0 && r != -ENOENT)
                log_warn("could not remove a sandbox's folder", "path=%s error=\"%s\"", path, strerror(-r));
}

int sandbox_spec_write(const char *dir, const struct net_policy *net, uint32_t pids_max)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/spec.json", dir);
        json_t *j = json_pack("{s:o, s:I}", "network", net_policy_json(net), "pids_max", (json_int_t)pids_max);
        int r = j && json_dump_file(j, path, 0) == 0 ? 0 : -EIO;
        json_decref(j);
        return r;
}

void sandbox_spec_read(const char *dir, struct net_policy *ret_net, uint32_t *ret_pids_max)
{
        char path[PATH_MAX + 16], why[256];
        snprintf(path, sizeof(path), "%s/spec.json", dir);
        json_t *j = json_load_file(path, 0, NULL);
        if (!j || net_policy_parse(json_object_get(j, "network"), ret_net, why, sizeof(why)) < 0)
                memset(ret_net, 0, sizeof(*ret_net));
        json_t *pids = j ? json_object_get(j, "pids_max") : NULL;
        *ret_pids_max = json_is_integer(pids) && json_integer_value(pids) > 0 &&
                                        json_integer_value(pids) <= UINT32_MAX
                                ? (uint32_t)json_integer_value(pids)
                                : 0;
        json_decref(j);
}

void sandbox_watch_main(struct sandbox *sb)
{
        if (sb->pidfd < 0 && sb->rec.pid > 0)
                sb->pidfd = (int)syscall(SYS_pidfd_open, sb->rec.pid, 0);
}

struct moment moment_now(void)
{
        struct moment m;
        time_now3(&m.wall, &m.mono, &m.boot); /* one instant: a lease's end is worked out across them */
        return m;
}

int moment_begin(const char *state_dir, const char *id)
{
        int64_t asked = time_mono_ns();
        int fd = registry_moment_begin(state_dir, REGISTRY_MOMENT_WAIT_MS);
        int64_t waited_ms = (time_mono_ns() - asked) / NS_PER_MS;
        if (fd < 0)
                log_warn("could not take the registry's moment lock: a collector tick may run past this moment "
                         "until it reads the record", "sandbox=%s error=\"%s\"", id, strerror(-fd));
        else if (waited_ms >= 100)
                log_warn("waited for the registry's moment lock", "sandbox=%s waited_ms=%lld", id, (long long)waited_ms);
        return fd;
}

void moment_end(int fd)
{
        registry_moment_end(fd);
}

struct moment moment_of_record(const struct sandbox_record *rec)
{
        struct moment m = moment_now();
        int64_t ago = m.boot - rec->state_since_boot_ns;
        if (rec->state_since_boot_ns <= 0 || ago < 0)
                return m;
        m.wall -= ago;
        m.mono -= ago;
        m.boot = rec->state_since_boot_ns;
        return m;
}

bool lease_end_moment(const struct sandbox_record *rec, struct moment *ret)
{
        struct moment now = moment_now();
        int64_t past = now.wall - rec->timeout_ns;
        if (rec->state != STATE_RUNNING || rec->timeout_ns <= 0 || past <= 0 || rec->state_since_boot_ns <= 0 ||
            now.boot - past < rec->state_since_boot_ns)
                return false;
        *ret = (struct moment){ rec->timeout_ns, now.mono - past, now.boot - past };
        return true;
}
