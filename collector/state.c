/* state.c — see state.h. */
#include "state.h"
#include "fileutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The collector's own folders hold account and key ids (spooled finals):
 * root's alone, 0700, also when an older collector made them 0755. */
static int mkdir_one(const char *path, mode_t mode)
{
        if (mkdir(path, mode) < 0 && errno != EEXIST)
                return -errno;
        return mode == 0700 && chmod(path, mode) < 0 ? -errno : 0;
}

int state_prepare(const char *state_dir)
{
        char path[PATH_MAX];
        int r = mkdir_one(state_dir, 0755);
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR, state_dir);
        if (r == 0)
                r = mkdir_one(path, 0700);
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR "/epochs", state_dir);
        if (r == 0)
                r = mkdir_one(path, 0700);
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR "/spool", state_dir);
        if (r == 0)
                r = mkdir_one(path, 0700);
        return r;
}

static int fsync_parent(const char *path)
{
        char copy[PATH_MAX];
        snprintf(copy, sizeof(copy), "%s", path);
        int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        int r = fsync(fd) < 0 ? -errno : 0;
        close(fd);
        return r;
}

int state_write_atomic(const char *path, const char *text, size_t len)
{
        int r = file_write_atomic(path, text, len, 0644);
        return r < 0 ? r : fsync_parent(path);
}

static void generation_path(char *buf, size_t size, const char *state_dir)
{
        snprintf(buf, size, "%s/" COLLECTOR_DIR "/generation", state_dir);
}

int state_save_generation(const char *state_dir, uint32_t generation)
{
        char path[PATH_MAX], text[32];
        generation_path(path, sizeof(path), state_dir);
        int len = snprintf(text, sizeof(text), "%" PRIu32 "\n", generation);
        return state_write_atomic(path, text, (size_t)len);
}

static uint64_t clock_hours(int64_t now_sec)
{
        return now_sec > GENERATION_EPOCH_S ? (uint64_t)(now_sec - GENERATION_EPOCH_S) / 3600 : 0;
}

int state_next_generation(const char *state_dir, int64_t now_sec, uint32_t *ret)
{
        char path[PATH_MAX], text[64];
        generation_path(path, sizeof(path), state_dir);
        uint64_t last = 0, next, hours = clock_hours(now_sec);
        int r = file_read_small(path, text, sizeof(text));
        if (r < 0 && r != -ENOENT)
                return r;
        if (r == 0 && sscanf(text, "%" SCNu64, &last) != 1)
                return -EINVAL;
        if (r == 0) {
                next = last + 1;
                if (hours > next)
                        next = hours < last + 1 + GENERATION_LEAP_MAX ? hours : last + 1 + GENERATION_LEAP_MAX;
        } else {
                next = hours + GENERATION_LOST_MARGIN;
        }
        if (next > INT32_MAX)
                return -EOVERFLOW;
        if ((r = state_save_generation(state_dir, (uint32_t)next)) < 0)
                return r;
        *ret = (uint32_t)next;
        return 0;
}

uint32_t generation_follow_clock(uint32_t gen, int64_t now_sec, int64_t since_raise_ns)
{
        if (gen >= INT32_MAX || clock_hours(now_sec) <= gen || since_raise_ns < INT64_C(3600) * 1000000000)
                return gen;
        return gen + 1;
}

static void epoch_path(char *buf, size_t size, const char *state_dir, const char *sandbox)
{
        snprintf(buf, size, "%s/" COLLECTOR_DIR "/epochs/%s", state_dir, sandbox);
}

int state_load_epoch(const char *state_dir, const char *sandbox, uint64_t *ret_epoch, uint64_t *ret_record)
{
        char path[PATH_MAX], text[128];
        epoch_path(path, sizeof(path), state_dir, sandbox);
        uint64_t e = 0, rec = 0;
        int r = file_read_small(path, text, sizeof(text));
        if (r < 0 && r != -ENOENT)
                return r;
        if (r == 0 && sscanf(text, "%" SCNu64 " %" SCNu64, &e, &rec) != 2)
                return -EINVAL;
        *ret_epoch = e;
        *ret_record = rec;
        return 0;
}

int state_save_epoch(const char *state_dir, const char *sandbox, uint64_t epoch, uint64_t record)
{
        char path[PATH_MAX], text[64];
        epoch_path(path, sizeof(path), state_dir, sandbox);
        int len = snprintf(text, sizeof(text), "%" PRIu64 " %" PRIu64 "\n", epoch, record);
        return state_write_atomic(path, text, (size_t)len);
}

int state_remove_epoch(const char *state_dir, const char *sandbox)
{
        char path[PATH_MAX];
        epoch_path(path, sizeof(path), state_dir, sandbox);
        return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}
