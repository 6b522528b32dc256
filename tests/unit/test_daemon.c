/* Unit tests of common/daemon.c: the heap policy (daemon_memory_setup,
 * daemon_memory_trim). They read glibc's own counts (mallinfo2) and this
 * process's RSS; under a sanitizer or valgrind, whose allocators replace
 * glibc's, there is nothing of glibc's to test and they are skipped. */
#include "unit.h"

#include "daemon.h"
#include "timeutil.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether malloc is glibc's: its count of bytes in use sees a block. */
static bool glibc_allocator(void)
{
        size_t before = mallinfo2().uordblks;
        void *p = malloc(4096); /* above the per-thread cache's sizes, whose blocks count as in use */
        size_t during = mallinfo2().uordblks;
        free(p);
        return p && during >= before + 4096;
}

static long rss_kib(void)
{
        long pages = 0, resident = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        assert_non_null(f);
        assert_int_equal(fscanf(f, "%ld %ld", &pages, &resident), 2);
        fclose(f);
        return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* A rescan's list (a few MiB) freed once must not move the next lists into
 * the heap: glibc's default would raise its mmap threshold to 4 MiB here and
 * serve the 1 MiB block below from the heap, whose pages then stay. */
static void large_blocks_stay_mapped(void **state)
{
        if (!glibc_allocator())
                UNIT_SKIP("malloc is not glibc's (a sanitizer or valgrind)");
        daemon_memory_setup();
        char *big = malloc(4 << 20);
        assert_non_null(big);
        memset(big, 1, 4 << 20);
        free(big);
        size_t mapped = mallinfo2().hblks;
        char *next = malloc(1 << 20);
        assert_non_null(next);
        assert_int_equal(mallinfo2().hblks, mapped + 1);
        long before = rss_kib();
        memset(next, 1, 1 << 20);
        free(next);
        assert_int_equal(mallinfo2().hblks, mapped);
        /* Its pages went back with it (some slack for the rest of the process). */
        assert_true(rss_kib() < before + 512);
}

/* Free pages between blocks still in use (the heap's top is trimmed by free
 * itself; these are not) go back to the kernel on a trim. */
static void trim_returns_free_pages(void **state)
{
        if (!glibc_allocator())
                UNIT_SKIP("malloc is not glibc's (a sanitizer or valgrind)");
        enum { N = 4096, SIZE = 8192, KEEP = 64 }; /* 32 MiB of blocks below the mmap threshold */
        char **blocks = calloc(N, sizeof(*blocks));
        assert_non_null(blocks);
        for (int i = 0; i < N; i++) {
                assert_non_null(blocks[i] = malloc(SIZE));
                memset(blocks[i], 1, SIZE);
        }
        for (int i = 0; i < N; i++)
                if (i % KEEP != KEEP - 1) { /* the last block stays: the freed ones are not the heap's top */
                        free(blocks[i]);
                        blocks[i] = NULL;
                }
        long before = rss_kib();
        assert_true(daemon_memory_trim(INT64_C(1000000) * NS_PER_SEC));
        long after = rss_kib();
        /* 31.5 MiB were freed; at least 24 MiB of it must have left RSS. */
        assert_true(before - after >= 24 * 1024);
        for (int i = 0; i < N; i++)
                free(blocks[i]);
        free(blocks);
}

/* At most one trim every DAEMON_TRIM_INTERVAL_S, whoever calls. */
static void trim_interval(void **state)
{
        int64_t t = INT64_C(2000000) * NS_PER_SEC;
        assert_true(daemon_memory_trim(t));
        assert_false(daemon_memory_trim(t));
        assert_false(daemon_memory_trim(t + (DAEMON_TRIM_INTERVAL_S - 1) * NS_PER_SEC));
        assert_true(daemon_memory_trim(t + DAEMON_TRIM_INTERVAL_S * NS_PER_SEC));
        assert_false(daemon_memory_trim(t + DAEMON_TRIM_INTERVAL_S * NS_PER_SEC + 1));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(large_blocks_stay_mapped),
                cmocka_unit_test(trim_returns_free_pages),
                cmocka_unit_test(trim_interval),
        };
        return unit_run(tests);
}
