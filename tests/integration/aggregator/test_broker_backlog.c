/* Integration: the development broker keeps the backlog it is told to
 * (the aggregator bench's 1,000,000-sample preload). By
 * default it keeps librdkafka's 5 MiB per partition and drops the oldest
 * messages beyond it; with --keep-bytes-per-partition 64 MiB the same 7 MB
 * backlog is kept whole (first offset 0, all 70 messages), nothing is said
 * dropped, and its start line says the limit in force. */
#include "kafka.h"
#include "support.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG 100000
#define BIGS 70 /* 7 MB: more than the default 5 MiB */

/* Starts a broker (one partition) with extra arguments, fills partition 0
 * with BIGS messages of BIG bytes, waits past one watch of its watermarks,
 * and returns the first offset it still has; *log gets its log. */
static long long fill(const char *dir, const char *name, const char *keep, char **log)
{
        char file[512], sock[512], logpath[512];
        snprintf(file, sizeof(file), "%s/%s.bootstrap", dir, name);
        snprintf(sock, sizeof(sock), "%s/%s.sock", dir, name);
        snprintf(logpath, sizeof(logpath), "%s/%s.log", dir, name);
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--partitions", "1", "--bootstrap-file", file,
                         "--control-socket", sock, keep ? "--keep-bytes-per-partition" : NULL, (char *)keep, NULL };
        pid_t pid = test_spawn(argv, NULL, logpath);
        if (test_wait_file(file, 10000) < 0) {
                char *l = test_read_file(logpath);
                fprintf(stderr, "FAIL: broker %s did not start; its log:\n%s\n", name, l ? l : "");
                exit(1);
        }
        char *bootstrap = test_read_file(file);
        char err[512];
        const char *const extra[] = { "linger.ms=0", NULL };
        rd_kafka_t *p = kafka_producer_new(bootstrap, NULL, extra, err, sizeof(err));
        CHECK(p != NULL, "producer: %s", err);
        char *big = calloc(1, BIG);
        memset(big, 'x', BIG - 1);
        for (int i = 0; p && i < BIGS; i++)
                CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_PARTITION(0),
                                        RD_KAFKA_V_VALUE(big, BIG), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                        RD_KAFKA_V_END) == 0, "produce a big message");
        free(big);
        if (p) {
                CHECK(rd_kafka_flush(p, 30000) == 0, "the big messages were not delivered");
                rd_kafka_destroy(p);
        }
        usleep(2500 * 1000); /* the broker reads its watermarks every 2 s */
        char *out = NULL;
        char *wargv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", sock, "ctl", "watermarks", NULL };
        long long lo = -1, hi = -1;
        CHECK(test_run(wargv, &out, NULL) == 0 && out && sscanf(out, "ok 0=%lld..%lld", &lo, &hi) == 2,
              "ctl watermarks: %s", out ? out : "?");
        CHECK(hi == BIGS, "%s: next offset %lld, want %d", name, hi, BIGS);
        free(out);
        kill(pid, SIGTERM);
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s did not stop cleanly (status %d)", name, st);
        *log = test_read_file(logpath);
        free(bootstrap);
        return lo;
}

int main(void)
{
        char *dir = test_tmpdir("broker-backlog");
        char *log = NULL;

        /* The default: the oldest messages go, and the broker says so. */
        long long lo = fill(dir, "default", NULL, &log);
        CHECK(lo > 0, "the default broker kept all %d messages: its limit is not the one said", BIGS);
        CHECK(log && strstr(log, "keep_bytes_per_partition=5242880"), "default start line: no 5 MiB limit");
        CHECK(log && strstr(log, "dropped messages to stay within its memory limit"), "default: drop not logged");
        free(log);

        /* Told to keep 64 MiB: all of it is kept, nothing said dropped. */
        lo = fill(dir, "kept", "67108864", &log);
        CHECK(lo == 0, "with 64 MiB per partition the broker dropped offsets 0..%lld of %d", lo - 1, BIGS);
        CHECK(log && strstr(log, "keep_bytes_per_partition=67108864"), "start line does not say the 64 MiB limit");
        CHECK(log && !strstr(log, "dropped messages"), "the broker said it dropped messages");
        CHECK(log && !strstr(log, "could not change"), "the broker could not set its limit");
        free(log);
        free(dir);
        return test_result();
}
