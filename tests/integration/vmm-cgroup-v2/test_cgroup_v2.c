/* test_cgroup_v2.c — tally-vmm, tally-sandbox-init and tally-collector on a
 * pure cgroup v2 host: a QEMU guest (TCG, Debian's kernel booted with
 * cgroup_no_v1=all, cgroup2 the one cgroup file system, cpu, memory and pids
 * delegated) runs them (tests/integration/vmm-cgroup-v2/scenario) and
 * publishes to this test's development broker through the guest's user-mode
 * network. QEMU's network is restrict=on: the guest reaches nothing but
 * 10.0.2.100:PORT, which QEMU forwards to the broker on this host's loopback.
 *
 * The guest reads the kernel's counters itself and prints them on its second
 * serial port; this test holds the events the broker got against them:
 *   - every sample's CPU is µs-granular and lies between the guest's
 *     cpu.stat usage_usec readings before and after it;
 *   - while the sandbox is paused (cgroup.freeze) its samples' CPU equals
 *     the frozen usage_usec exactly and their peak is at most memory.peak
 *     (the collector reads it every peak_every ticks); their memory
 *     is memory.current, less at most what the kernel's per-CPU charge caches
 *     give back meanwhile (64 pages a CPU);
 *   - tally-vmm's status of a sandbox shows mem_bytes between memory.current
 *     read just before and after it, and mem_peak_bytes between memory.peak
 *     likewise, at least what the sandbox wrote to its /dev/shm;
 *   - the stopped event's counter equals usage_usec read after the kernel
 *     released the sandbox's last task, and the collector's final sample of
 *     every sandbox equals its stopped event;
 *   - the guest's own checks (v2 detected, limits written, pause freezes,
 *     pids.max holds a fork bomb, the jail holds, cgroups removed) passed;
 *   - a real tally-aggregator on the host folds the events into a PostgreSQL
 *     ledger: each sandbox's billed CPU is its stopped event's counter
 *     exactly (A's: usage_usec read in the guest after release, × 1000). */
#include "support.h"

#include "event.h"
#include "kafka.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GUEST_TIMEOUT_S 540 /* about 110-200 s here at load 40-70; TCG crawls at load 80 */
/* A guest whose console is still empty this long after its start never ran
 * /init (its first line comes seconds after the kernel's start): a TCG boot
 * that hung, seen once in a full run (no line in 540 s) and not again when run
 * alone. It is booted once more, said on stderr, within GUEST_TIMEOUT_S in all. */
#define GUEST_SILENT_S 150
#define NS_PER_CS 10000000ll   /* /proc/uptime's unit: 10 ms */
#define CHARGE_SLACK (2 * 64 * 4096ull) /* MEMCG_CHARGE_BATCH pages on each of the guest's 2 CPUs */
#define MAX_EVENTS 4096

struct reading {
        int64_t t0_ns, t1_ns; /* the reading happened within [t0, t1) on the guest's clock */
        uint64_t cpu_ns, mem;
};

static struct usage_event *events;
static int nevents;

static const char *str(const char *s)
{
        return s ? s : "(none)";
}

static void sleep_ms(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

/* The guest's result line starting with prefix (e.g. "ID A "), n-th of them; NULL if none. */
static const char *line_after(const char *text, const char *prefix, int nth)
{
        size_t pl = strlen(prefix);
        for (const char *p = text; p && *p;) {
                if (strncmp(p, prefix, pl) == 0 && nth-- == 0)
                        return p + pl;
                p = strchr(p, '\n');
                p = p ? p + 1 : NULL;
        }
        return NULL;
}

static void word(const char *s, char *buf, size_t size)
{
        size_t n = 0;
        while (s && s[n] && !strchr(" \r\n", s[n]) && n + 1 < size) {
                buf[n] = s[n];
                n++;
        }
        buf[n] = '\0';
}

/* Reads the usage topic from its start until every id in want has its stopped
 * event and the collector's final sample, or timeout_ms. */
static void read_events(const char *brokers, char ids[][64], int nids, int timeout_ms)
{
        char err[512], group[64];
        snprintf(group, sizeof(group), "test-cgroup-v2-%d", (int)getpid());
        rd_kafka_t *c = kafka_consumer_new(brokers, group, test_kafka_conf(NULL), NULL, err, sizeof(err));
        CHECK(c != NULL, "consumer: %s", err);
        if (!c)
                return;
        rd_kafka_topic_partition_list_t *t = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(t, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c, t);
        rd_kafka_topic_partition_list_destroy(t);
        events = calloc(MAX_EVENTS, sizeof(*events));
        for (int waited = 0; waited < timeout_ms && nevents < MAX_EVENTS;) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
                if (!m) {
                        waited += 200;
                        int complete = 0;
                        for (int i = 0; i < nids; i++) {
                                bool stopped = false, final = false;
                                for (int e = 0; e < nevents; e++)
                                        if (strcmp(events[e].sandbox, ids[i]) == 0) {
                                                stopped |= events[e].type == EVENT_STOPPED;
                                                final |= events[e].type == EVENT_SAMPLE && events[e].final;
                                        }
                                complete += stopped && final;
                        }
                        if (complete == nids)
                                break;
                        continue;
                }
                char why[128];
                if (!m->err && event_decode(m->payload, m->len, &events[nevents], why, sizeof(why)) == 0)
                        nevents++;
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
}

static void check_sandbox_a(const char *guest, const char *id)
{
        struct reading r[64];
        int nr = 0;
        const char *l;
        char prefix[96];
        snprintf(prefix, sizeof(prefix), "R A ");
        for (int i = 0; (l = line_after(guest, prefix, i)) && nr < 64; i++) {
                long long t0, t1;
                unsigned long long u, m;
                if (sscanf(l, "%lld %lld %llu %llu", &t0, &t1, &u, &m) == 4)
                        r[nr++] = (struct reading){ t0 * NS_PER_CS, (t1 + 1) * NS_PER_CS, u * 1000, m };
        }
        CHECK(nr >= 12, "the guest printed %d readings of A", nr);
        long long ft0 = 0, ft1 = 0;
        unsigned long long f1 = 0, f2 = 0, fm = 0, fp = 0;
        l = line_after(guest, "FROZEN A ", 0);
        CHECK(l && sscanf(l, "%lld %lld %llu %llu %llu %llu", &ft0, &ft1, &f1, &f2, &fm, &fp) == 6,
              "the guest printed no frozen reading of A");
        int samples = 0, bracketed = 0, frozen = 0;
        for (int e = 0; e < nevents; e++) {
                const struct usage_event *ev = &events[e];
                if (ev->type != EVENT_SAMPLE || strcmp(ev->sandbox, id) != 0)
                        continue;
                samples++;
                CHECK(ev->cpu_ns % 1000 == 0, "sample seq %" PRIu64 " of A: CPU %" PRIu64 " ns is not whole µs "
                      "(cpu.stat usage_usec is)", ev->seq, ev->cpu_ns);
                for (int i = 0; i < nr; i++) {
                        if (r[i].t1_ns <= ev->mono_ns) {
                                bracketed++;
                                CHECK(ev->cpu_ns >= r[i].cpu_ns, "sample at %" PRId64 " ns: CPU %" PRIu64
                                      " ns below usage_usec %" PRIu64 " read before it", ev->mono_ns, ev->cpu_ns,
                                      r[i].cpu_ns / 1000);
                        } else if (r[i].t0_ns > ev->mono_ns) {
                                bracketed++;
                                CHECK(ev->cpu_ns <= r[i].cpu_ns, "sample at %" PRId64 " ns: CPU %" PRIu64
                                      " ns above usage_usec %" PRIu64 " read after it", ev->mono_ns, ev->cpu_ns,
                                      r[i].cpu_ns / 1000);
                        }
                }
                /* Strictly within the pause (the guest read the frozen counter at
                 * both ends): the kernel's counter, exactly. */
                if (ev->mono_ns >= (ft0 + 1) * NS_PER_CS && ev->mono_ns < ft1 * NS_PER_CS) {
                        frozen++;
                        CHECK(ev->cpu_ns == f1 * 1000, "paused A's sample: CPU %" PRIu64 " ns, frozen usage_usec %llu",
                              ev->cpu_ns, f1);
                        CHECK(ev->mem_bytes <= fm && ev->mem_bytes + CHARGE_SLACK >= fm,
                              "paused A's sample: memory %" PRIu64 ", memory.current %llu", ev->mem_bytes, fm);
                        /* the collector reads memory.peak every peak_every ticks, so a sample
                         * carries the last peak read: never above the peak at the freeze */
                        CHECK(ev->mem_peak_bytes <= fp, "paused A's sample: peak %" PRIu64 ", memory.peak %llu",
                              ev->mem_peak_bytes, fp);
                        CHECK(ev->state == STATE_PAUSED, "a sample within the pause says state %d", (int)ev->state);
                }
        }
        CHECK(samples >= 20 && bracketed >= 100, "A had %d samples, %d sample-reading pairs ordered", samples,
              bracketed);
        CHECK(frozen >= 4, "only %d samples of A fell within its 2 s pause (tick 250 ms)", frozen);
        CHECK(f1 == f2 && f1 > 0, "the guest's frozen readings %llu, %llu", f1, f2);
        CHECK(fm >= 24ull << 20, "A held %llu bytes (memory.current), wrote 24 MiB to its /dev/shm", fm);
        fprintf(stderr, "A: %d samples, %d ordered against %d readings, %d within the pause (%llu us)\n", samples,
                bracketed, nr, frozen, f1);

        /* tally-vmm's status: memory.current between the guest's readings around
         * it, memory.peak likewise (it only grows), and at least the 24 MiB A wrote. */
        unsigned long long m0 = 0, m1 = 0, p0 = 0, p1 = 0, mem = 0, peak = 0;
        l = line_after(guest, "SHOW A ", 0);
        int got = l ? sscanf(l, "%llu %llu %llu %llu %llu %llu", &m0, &m1, &p0, &p1, &mem, &peak) : 0;
        CHECK(got == 6, "the guest printed %s tally-vmm's status of A with mem_bytes and mem_peak_bytes: %.80s",
              got >= 4 ? "no" : "no reading around", l ? l : "(none)");
        if (got == 6) {
                CHECK((m0 <= mem && mem <= m1) || (m1 <= mem && mem <= m0),
                      "A's status: mem_bytes %llu, memory.current %llu before and %llu after", mem, m0, m1);
                CHECK(p0 <= peak && peak <= p1 && peak >= 24ull << 20,
                      "A's status: mem_peak_bytes %llu, memory.peak %llu before and %llu after, 24 MiB written", peak,
                      p0, p1);
        }

        unsigned long long u1 = 0, u2 = 0, final = 0;
        l = line_after(guest, "FINAL A ", 0);
        CHECK(l && sscanf(l, "%llu %llu %llu", &u1, &u2, &final) == 3, "the guest printed no final reading of A");
        CHECK(u1 == u2 && final == u2 * 1000, "A's final counter %llu ns, usage_usec after release %llu then %llu",
              final, u1, u2);
        bool seen = false;
        for (int e = 0; e < nevents; e++)
                if (events[e].type == EVENT_STOPPED && strcmp(events[e].sandbox, id) == 0) {
                        seen = true;
                        CHECK(events[e].cpu_ns == u2 * 1000, "A's stopped event: %" PRIu64 " ns, usage_usec %llu",
                              events[e].cpu_ns, u2);
                }
        CHECK(seen, "no stopped event of A reached the host's broker");
}

static char *db_url;

/* The ledger bills the sandbox's stopped counter exactly (polled: the aggregator commits in batches). */
static void check_billed(const char *name, const char *id)
{
        uint64_t want = 0;
        for (int e = 0; e < nevents; e++)
                if (events[e].type == EVENT_STOPPED && strcmp(events[e].sandbox, id) == 0)
                        want = events[e].cpu_ns;
        CHECK(want > 0, "%s: no stopped event to bill", name);
        if (want == 0)
                return; /* nothing to wait for */
        char sql[512], *billed = NULL;
        snprintf(sql, sizeof(sql), "SELECT sum(cpu_ns)::text FROM usage_hourly WHERE sandbox_id = '%s'", id);
        /* 30 s on the clock: each query is a new connection, slow on a loaded machine */
        for (time_t until = time(NULL) + 30; time(NULL) < until;) {
                free(billed);
                billed = test_db_value(db_url, sql);
                if (billed && strtoull(billed, NULL, 10) == want)
                        break;
                sleep_ms(200);
        }
        CHECK(billed && strtoull(billed, NULL, 10) == want, "%s: billed CPU %s ns, stopped counter %" PRIu64,
              name, str(billed), want);
        free(billed);
}

/* Each sandbox's stopped event reached the host, and the collector's final sample equals it. */
static void check_stopped(const char *name, const char *id)
{
        const struct usage_event *stopped = NULL, *final = NULL;
        for (int e = 0; e < nevents; e++) {
                if (strcmp(events[e].sandbox, id) != 0)
                        continue;
                CHECK(strcmp(events[e].host, "v2-guest") == 0, "%s's event from host %s", name, events[e].host);
                if (events[e].type == EVENT_STOPPED)
                        stopped = &events[e];
                if (events[e].type == EVENT_SAMPLE && events[e].final)
                        final = &events[e];
        }
        CHECK(stopped && final && stopped->cpu_ns == final->cpu_ns && stopped->cpu_ns > 0,
              "%s (%s): stopped event %" PRIu64 " ns, the collector's final sample %" PRIu64 " ns", name, id,
              stopped ? stopped->cpu_ns : 0, final ? final->cpu_ns : 0);
}

int main(void)
{
        char *dir = test_tmpdir("vmm-cgroup-v2");
        db_url = test_db_create("cgroup_v2");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *merr = NULL;
        CHECK(test_run(migrate, NULL, &merr) == 0, "tally-migrate: %s", str(merr));
        free(merr);
        PGconn *pg = PQconnectdb(db_url);
        PGresult *pr = PQexec(pg, "INSERT INTO accounts (id, name) VALUES ('acct_v2', 'cgroup v2');"
                                  "INSERT INTO api_keys (id, account_id, key_hash) VALUES ('key_v2', 'acct_v2', sha256('key_v2'))");
        CHECK(PQresultStatus(pr) == PGRES_COMMAND_OK, "seed: %s", PQerrorMessage(pg));
        PQclear(pr);
        PQfinish(pg);
        struct test_kafka kafka;
        test_kafka_start(&kafka, dir, 2, 1);
        char alog[600];
        snprintf(alog, sizeof(alog), "%s/aggregator.log", dir);
        char *aggregator[] = { (char *)test_env("TALLY_AGGREGATOR_BIN"), "--database-url", db_url, "--kafka-brokers",
                               kafka.bootstrap, "--batch-ms", "100", NULL };
        pid_t agg = test_spawn(aggregator, NULL, alog);
        const char *colon = strrchr(kafka.bootstrap, ':');
        int port = colon ? atoi(colon + 1) : 0;
        CHECK(port > 0 && strncmp(kafka.bootstrap, "127.0.0.1:", 10) == 0 && !strchr(kafka.bootstrap, ','),
              "the development broker's bootstrap %s is not one port on the loopback", kafka.bootstrap);

        /* The run's own part of the initramfs (the broker's port), appended to the built one. */
        char cmd[4096], initrd[600], console[600], result[600];
        snprintf(initrd, sizeof(initrd), "%s/initrd", dir);
        snprintf(console, sizeof(console), "%s/console.log", dir);
        snprintf(result, sizeof(result), "%s/result.log", dir);
        snprintf(cmd, sizeof(cmd),
                 "set -e; mkdir -p '%s/overlay/etc/v2'; echo %d >'%s/overlay/etc/v2/broker_port'; "
                 "cp '%s' '%s'; (cd '%s/overlay' && find . -mindepth 1 | cpio -o -H newc -R 0:0 --quiet | gzip -1) >>'%s'",
                 dir, port, dir, test_env("TALLY_V2_INITRAMFS"), initrd, dir, initrd);
        char *sh[] = { "/bin/sh", "-c", cmd, NULL };
        char *err = NULL;
        CHECK(test_run(sh, NULL, &err) == 0, "could not make the guest's initramfs: %s", str(err));
        free(err);

        char netdev[300], serial0[700], serial1[700];
        /* Per guest connection QEMU runs the command, whose stdio is the connection. */
        snprintf(netdev, sizeof(netdev), "user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:%d-cmd:busybox nc 127.0.0.1 %d",
                 port, port);
        snprintf(serial0, sizeof(serial0), "file:%s", console);
        snprintf(serial1, sizeof(serial1), "file,id=result,path=%s", result);
        char *qemu[] = { "/usr/bin/qemu-system-x86_64", /* Debian's qemu-system-x86 */ "-M", "pc",
                         "-accel", "tcg,tb-size=64", "-cpu", "max", "-smp", "2", "-m", "512",
                         "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                         "-kernel", (char *)test_env("TALLY_GUEST_KERNEL"), "-initrd", initrd,
                         "-append", "console=ttyS0 loglevel=4 panic=-1 rdinit=/init cgroup_no_v1=all clocksource=hpet tsc=unstable",
                         "-serial", serial0, "-chardev", serial1, "-device", "isa-serial,chardev=result,iobase=0x2f8,irq=3",
                         "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0", NULL };
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        char qlog[600];
        snprintf(qlog, sizeof(qlog), "%s/qemu.log", dir);
        pid_t q = test_spawn(qemu, qlog, qlog);
        int status = 0, waited = 0, boots = 1;
        while (waitpid(q, &status, WNOHANG) == 0) {
                if (waited >= GUEST_TIMEOUT_S * 10) {
                        kill(q, SIGKILL);
                        waitpid(q, &status, 0);
                        CHECK(false, "the guest did not finish within %d s", GUEST_TIMEOUT_S);
                        break;
                }
                if (boots == 1 && waited == GUEST_SILENT_S * 10) {
                        char *con = test_read_file(console);
                        bool silent = !con || !*con;
                        free(con);
                        if (silent) {
                                fprintf(stderr, "the guest printed nothing in %d s: its boot hung; booting it once more\n",
                                        GUEST_SILENT_S);
                                kill(q, SIGKILL);
                                waitpid(q, &status, 0);
                                FILE *f = fopen(console, "w"), *g = fopen(result, "w");
                                if (f)
                                        fclose(f);
                                if (g)
                                        fclose(g);
                                q = test_spawn(qemu, qlog, qlog);
                                boots++;
                        }
                }
                sleep_ms(100);
                waited++;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        fprintf(stderr, "the guest ran %lld s\n", (long long)(t1.tv_sec - t0.tv_sec));

        char *guest = test_read_file(result);
        CHECK(guest && strstr(guest, "\nDONE") != NULL, "the guest's scenario did not finish");
        for (const char *l = guest; l && (l = strstr(l, "CHECK FAIL ")); l++) {
                const char *end = strchr(l, '\n');
                CHECK(false, "in the guest: %.*s", end ? (int)(end - l - 11) : (int)strlen(l + 11), l + 11);
        }
        int oks = 0;
        for (const char *l = guest; l && (l = strstr(l, "CHECK ok ")); l++)
                oks++;
        CHECK(oks >= 14, "only %d of the guest's checks passed", oks);

        /* The collector runs with cgroup_reader auto, as a host's would: say which reader it took. */
        char *con = test_read_file(console);
        const char *walk = con ? strstr(con, "the cgroup walk is not available") : NULL;
        const char *eol = walk ? strchr(walk, '\n') : NULL;
        fprintf(stderr, "the guest's collector: %.*s\n", walk ? (eol ? (int)(eol - walk) : 200) : 30,
                walk ? walk : "read counters with the BPF walk");
        free(con);

        const char *names[] = { "A", "B", "C", "D" };
        char ids[4][64];
        for (int i = 0; i < 4; i++) {
                char prefix[16];
                snprintf(prefix, sizeof(prefix), "ID %s ", names[i]);
                word(line_after(guest ? guest : "", prefix, 0), ids[i], sizeof(ids[i]));
                CHECK(strncmp(ids[i], "sbx-", 4) == 0, "the guest made no sandbox %s", names[i]);
        }
        read_events(kafka.bootstrap, ids, 4, 30000);
        fprintf(stderr, "the host's broker got %d events\n", nevents);
        if (guest && *ids[0])
                check_sandbox_a(guest, ids[0]);
        for (int i = 0; i < 4; i++) {
                check_stopped(names[i], ids[i]);
                check_billed(names[i], ids[i]);
        }
        kill(agg, SIGTERM);
        waitpid(agg, NULL, 0);

        if (test_failures) {
                char *c = test_read_file(console);
                fprintf(stderr, "---- the guest's console (tail)\n%s\n---- its results\n%s\n",
                        c ? (strlen(c) > 6000 ? c + strlen(c) - 6000 : c) : "", str(guest));
                free(c);
        }
        for (int e = 0; e < nevents; e++)
                event_clear(&events[e]);
        free(events);
        free(guest);
        test_kafka_stop(&kafka);
        test_db_drop(db_url);
        free(dir);
        return test_result();
}
