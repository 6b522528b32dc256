/* replay.c — the main() of a fuzz target when it is not built with libFuzzer:
 * runs LLVMFuzzerTestOneInput once on every file named, or on every file in
 * every folder named (the checked-in corpus and the kept crash inputs), so
 * `meson test` replays them under any compiler, sanitizer or valgrind.
 * A target that crashes, trips a sanitizer or fails an assertion fails the test. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
        FILE *f = fopen(path, "rb");
        if (!f) {
                fprintf(stderr, "could not open %s: %s\n", path, strerror(errno));
                return -1;
        }
        size_t cap = 4096, n = 0;
        uint8_t *buf = malloc(cap);
        size_t got;
        while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
                n += got;
                if (n == cap) {
                        uint8_t *b = realloc(buf, cap *= 2);
                        if (!b) {
                                free(buf);
                                buf = NULL;
                        }
                        buf = b;
                }
        }
        fclose(f);
        if (!buf)
                return -1;
        /* An exact-size copy, so ASan sees a read one past the input. */
        uint8_t *exact = malloc(n ? n : 1);
        if (!exact) {
                free(buf);
                return -1;
        }
        memcpy(exact, buf, n);
        free(buf);
        LLVMFuzzerTestOneInput(exact, n);
        free(exact);
        return 0;
}

static int cmp(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
        int ran = 0, failed = 0;
        if (LLVMFuzzerInitialize)
                LLVMFuzzerInitialize(&argc, &argv);
        for (int i = 1; i < argc; i++) {
                struct stat st;
                if (stat(argv[i], &st) < 0) {
                        /* A folder of kept crashes may not exist yet: nothing to replay. */
                        continue;
                }
                if (!S_ISDIR(st.st_mode)) {
                        failed += run_file(argv[i]) < 0;
                        ran++;
                        continue;
                }
                DIR *d = opendir(argv[i]);
                if (!d) {
                        fprintf(stderr, "could not open %s: %s\n", argv[i], strerror(errno));
                        failed++;
                        continue;
                }
                char **names = NULL;
                size_t nn = 0;
                struct dirent *e;
                while ((e = readdir(d))) {
                        if (e->d_name[0] == '.')
                                continue;
                        char **l = realloc(names, (nn + 1) * sizeof(*l));
                        if (!l)
                                break;
                        names = l;
                        names[nn++] = strdup(e->d_name);
                }
                closedir(d);
                if (nn)
                        qsort(names, nn, sizeof(*names), cmp);
                for (size_t k = 0; k < nn; k++) {
                        char path[4096];
                        snprintf(path, sizeof(path), "%s/%s", argv[i], names[k]);
                        failed += run_file(path) < 0;
                        ran++;
                        free(names[k]);
                }
                free(names);
        }
        fprintf(stderr, "replayed %d input(s), %d unreadable\n", ran, failed);
        if (ran == 0) {
                fprintf(stderr, "FAIL: no input to replay (the corpus is missing)\n");
                return 1;
        }
        return failed ? 1 : 0;
}
