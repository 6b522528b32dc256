/* Integration: randomized differential test of the aggregator against the
 * reference biller (tests/reference/refbill.py, written from docs/events.md
 * and docs/billing.md alone, never from tally's code).
 *
 * tests/reference/pack.py draws streams of usage messages the spec allows
 * (streamgen.py), tags each stream's ids so that many share one ledger
 * without touching, and writes what the model says each must bill. The
 * messages go through the real development broker to a real tally-aggregator
 * on real PostgreSQL; mid-round that aggregator is killed with SIGKILL and a
 * second one takes over. Then usage_hourly per (sandbox, hour), spend_daily
 * per (key, day) and the dead letters per reason class must equal the
 * model's, stream by stream, exactly, with no reading left held.
 *
 * Modes (environment):
 * - default: one round of the fixed seeds, one from the clock (printed) and
 *   every corpus case of tests/reference/corpus/ (the minimal streams earlier
 *   differences were shrunk to), produced a millisecond apart so that the
 *   aggregator keeps up and takes its partitions in commit groups (checked
 *   in its log); TALLY_REFERENCE_SEED=n runs only seed n;
 * - TALLY_REFERENCE_SECONDS=s (scripts/fuzz billing): rounds of
 *   TALLY_REFERENCE_STREAMS small streams (default 4000) until s seconds
 *   have passed, a kill in every other round; a stream that differs is
 *   shrunk (pack.py shrink, this program as the check) and written to
 *   TALLY_REFERENCE_CORPUS (default tests/reference/corpus/);
 * - one argument, a stream file: that stream alone on a fresh broker and
 *   database; exit 0 if the ledger equals the model, 1 if it differs, 2 if it
 *   could not tell (the shrinker's check). */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Seed 8 holds a forged reading under an unannounced epoch that reaches the
 * topic before its sandbox's `created` event: once the created came it waits
 * for the epoch, and its dead letter must say so (it once kept saying "no
 * created event"). */
static const unsigned long fixed_seeds[] = { 1, 2, 3, 4, 5, 6, 7, 8 };

static const char *refdir;

/* provenance_grace_ms of the rounds: an honest held reading's proof comes a
 * few hundred offsets later, but after a SIGKILL the second aggregator gets
 * the partitions only once the first one's session ran out (10 s) and it
 * started, tens of seconds on a loaded machine; a forged reading under an
 * epoch nobody announced is dead-lettered that long after it was held */
#define GRACE "60000"

/* messages produced ahead of the ledger's offsets at most, a round's total */
#define PRODUCE_AHEAD 10000

/* The fixed round's messages are paced (a millisecond apart): an aggregator
 * that keeps up takes its partitions in commit groups (aggregator/loop.c),
 * the messages of one group waiting while the other's batch commits, so the
 * round is billed through them; its log (debug) says when they engaged. */
static bool paced;
#define PACE_NS NS_PER_MS

/* Runs a shell command; returns its exit status (-1 if it did not exit). */
static int sh(const char *cmd)
{
        int st = system(cmd);
        return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Produces every ACCOUNT<TAB>JSON line of a stream file; returns the count,
 * or -1 if a `#commit` line's wait timed out. A corpus case's directives:
 * `#commit` waits until every message produced before it is committed (a
 * batch boundary: the aggregator is idle after it), `#held TEXT` then checks
 * that a reading of round `round` is held with TEXT in its reason (else
 * *missed is set: the case no longer takes the path it was written for). */
/* A SIGKILL inside a round: once `at` messages are produced and half of them
 * committed, the aggregator *agg is killed and a second one started; the
 * rest of the round goes to the second. */
struct killer {
        pid_t *agg;
        const char *grace;
        int64_t at;               /* -1: no kill */
        int64_t committed, total; /* at the kill: committed of the round, and produced */
};

static pid_t spawn(struct aggtest *t, const char *grace_ms);

static int64_t produce_stream(struct aggtest *t, const char *path, int round, int64_t start, bool *missed,
                              struct killer *k)
{
        FILE *f = fopen(path, "r");
        CHECK(f != NULL, "open %s", path);
        if (!f)
                return 0;
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        int64_t n = 0;
        while ((len = getline(&line, &cap, f)) > 0) {
                if (line[len - 1] == '\n')
                        line[--len] = '\0';
                if (strcmp(line, "#commit") == 0) {
                        aggtest_flush(t);
                        if (aggtest_wait_committed(t, start + n, 120000) != 0) {
                                fprintf(stderr, "FAIL: %s: the messages before line #commit were not committed in"
                                                " 120 s (a batch the aggregator cannot commit?)\n", path);
                                n = -1;
                                break;
                        }
                        continue;
                }
                if (strncmp(line, "#held ", 6) == 0) {
                        char sql[1024], *q = PQescapeLiteral(t->db, line + 6, strlen(line + 6));
                        snprintf(sql, sizeof(sql),
                                 "SELECT count(*) FROM held_readings WHERE sandbox_id LIKE 'r%d.%%'"
                                 " AND strpos(reason, %s) > 0", round, q ? q : "''");
                        PQfreemem(q);
                        char *v = aggtest_query(t, sql);
                        if (!v || strcmp(v, "0") == 0) {
                                char *all = aggtest_query(t, "SELECT coalesce(string_agg(reason, '; '), '') FROM held_readings");
                                fprintf(stderr, "%s: no reading held for \"%s\" (held: %s)\n", path, line + 6,
                                        all ? all : "?");
                                free(all);
                                *missed = true;
                        }
                        free(v);
                        continue;
                }
                char *tab = strchr(line, '\t');
                if (!tab || line[0] == '#')
                        continue;
                if (n % 1000 == 0 && n - (aggtest_committed(t) - start) > PRODUCE_AHEAD) {
                        /* the development broker keeps 5 MiB a partition and
                         * drops the oldest beyond: stay close to the fold */
                        aggtest_flush(t);
                        if (aggtest_wait_committed(t, start + n - PRODUCE_AHEAD / 2, 600000) != 0) {
                                fprintf(stderr, "FAIL: %s: the aggregator committed nothing more in 600 s\n", path);
                                n = -1;
                                break;
                        }
                }
                if (k && n == k->at) {
                        aggtest_flush(t);
                        aggtest_wait_committed(t, start + n / 2, 120000);
                        k->committed = aggtest_committed(t) - start;
                        k->total = n;
                        kill(*k->agg, SIGKILL);
                        waitpid(*k->agg, NULL, 0);
                        *k->agg = spawn(t, k->grace);
                }
                *tab = '\0';
                aggtest_produce_raw(t, line, tab + 1, (size_t)(line + len - tab - 1));
                n++;
                if (paced)
                        time_sleep_ns(PACE_NS);
        }
        free(line);
        fclose(f);
        return n;
}

/* Writes what the ledger holds for round `round`'s streams (ids starting
 * "rROUND.") in the model's line format; 0 or -1. */
static int dump_ledger(struct aggtest *t, int round, const char *path)
{
        char sql[4096];
        char *parts[6];
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('usage ' || sandbox_id || ' ' || extract(epoch FROM hour)::bigint || ' ' ||"
                 " cpu_ns || ' ' || mem_byte_ns || ' ' || storage_byte_ns, E'\\n'), '') FROM usage_hourly"
                 " WHERE sandbox_id LIKE 'r%d.%%' AND (cpu_ns <> 0 OR mem_byte_ns <> 0 OR storage_byte_ns <> 0)",
                 round);
        parts[0] = aggtest_query(t, sql);
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('spend ' || key_id || ' ' || day || ' ' || cpu_rated || ' ' ||"
                 " memory_rated || ' ' || storage_rated || ' ' || nanodollars, E'\\n'), '') FROM spend_daily"
                 " WHERE key_id LIKE 'r%d.%%' AND (cpu_rated <> 0 OR memory_rated <> 0 OR storage_rated <> 0)",
                 round);
        parts[1] = aggtest_query(t, sql);
        /* dead letters per stream and reason class: the aggregator's reasons
         * (docs/billing.md) sorted into the model's classes */
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('deadclass ' || tag || ' ' || c || ' ' || n, E'\\n'), '') FROM"
                 " (SELECT tag, c, count(*) AS n FROM (SELECT"
                 " substring(convert_from(raw, 'UTF8') FROM '\"sandbox\":\"(r%d\\.[^-\"]*)-') AS tag, CASE"
                 " WHEN reason LIKE '%% from host %%, but the sandbox was created on host%%' THEN 'host'"
                 " WHEN reason LIKE 'seq generation %% is more than 65536 above%%' THEN 'seq_jump'"
                 " WHEN reason LIKE '%%epoch %% is more than 65536 above%%' THEN 'epoch_jump'"
                 " WHEN reason LIKE 'impossible first%%' THEN 'impossible_first'"
                 " WHEN reason LIKE 'impossible%%' THEN 'impossible'"
                 " WHEN reason LIKE 'stopped event behind%%' THEN 'stopped_behind'"
                 " WHEN reason LIKE 'no created event%%' THEN 'no_created'"
                 " WHEN reason LIKE '%%never announced%%' THEN 'unannounced'"
                 " WHEN reason LIKE 'field %% out of range%%' THEN 'decode'"
                 " ELSE 'other:' || replace(left(reason, 60), ' ', '_') END AS c FROM dead_letters) x"
                 " WHERE tag IS NOT NULL GROUP BY tag, c) y",
                 round);
        parts[2] = aggtest_query(t, sql);
        /* the daily limits: each key's blocks and threshold alerts per day */
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('block ' || key_id || ' ' || day || ' ' || policy, E'\\n'), '')"
                 " FROM key_blocks WHERE key_id LIKE 'r%d.%%'", round);
        parts[3] = aggtest_query(t, sql);
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('alert ' || key_id || ' ' || day || ' ' || threshold_pct, E'\\n'), '')"
                 " FROM alerts WHERE key_id LIKE 'r%d.%%' AND threshold_pct IS NOT NULL", round);
        parts[4] = aggtest_query(t, sql);
        /* usage of hours with no rate in force (rating gaps) */
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg('gap ' || account_id || ' ' || plan_id || ' ' || meter || ' ' ||"
                 " extract(epoch FROM hour)::bigint, E'\\n'), '') FROM rating_gaps WHERE account_id LIKE 'r%d.%%'",
                 round);
        parts[5] = aggtest_query(t, sql);
        FILE *f = fopen(path, "w");
        int rc = f && parts[0] && parts[1] && parts[2] && parts[3] && parts[4] && parts[5] ? 0 : -1;
        for (int i = 0; i < 6; i++) {
                if (f && parts[i] && parts[i][0])
                        fprintf(f, "%s\n", parts[i]);
                free(parts[i]);
        }
        if (f && fclose(f) != 0)
                rc = -1;
        return rc;
}

/* Waits until nothing is left in held_readings (a reading under an epoch
 * nobody announced is dead-lettered after the grace); 0 or -1. */
static int wait_nothing_held(struct aggtest *t, int timeout_s)
{
        for (int i = 0; i < timeout_s * 10; i++) {
                char *h = aggtest_query(t, "SELECT count(*) FROM held_readings");
                bool none = h && strcmp(h, "0") == 0;
                free(h);
                if (none)
                        return 0;
                time_sleep_ns(100 * NS_PER_MS);
        }
        return -1;
}

static pid_t spawn(struct aggtest *t, const char *grace_ms)
{
        const char *extra[] = { "--provenance-grace-ms", grace_ms, paced ? "--log-level" : NULL, "debug", NULL };
        return aggtest_spawn(t, extra);
}

struct round_result {
        int64_t messages, streams, failed;
        bool killed_mid;
        int64_t kill_committed, kill_produced; /* of the round, when the first aggregator was killed */
};

/* One round: its stream file produced while *agg runs (SIGKILLed and
 * replaced mid-round when `kill_mid`), folded, then compared with the model
 * stream by stream. Failing tags go to DIR/fails-ROUND. Returns 0 if every
 * stream equals the model, 1 if one differs, 2 if the round could not be
 * told (not caught up, readings left held). */
static int run_round(struct aggtest *t, int round, const char *stream, const char *model, pid_t *agg,
                     bool kill_mid, const char *grace_ms, struct round_result *res)
{
        /* the round's price plans and the accounts on them (pack.py) */
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s.sql", model);
        char *plans = test_read_file(path);
        if (plans && *plans)
                aggtest_exec(t, plans);
        free(plans);
        int64_t start = aggtest_committed(t);
        bool missed = false;
        struct killer k = { .agg = agg, .grace = grace_ms, .at = -1, .committed = -1 };
        if (kill_mid) {
                /* a moment inside the round, 20 to 80 % of its messages in */
                int64_t lines = 0;
                FILE *f = fopen(stream, "r");
                for (int c; f && (c = fgetc(f)) != EOF;)
                        lines += c == '\t';
                if (f)
                        fclose(f);
                k.at = lines * (20 + (int64_t)(time_wall_ns() / 1000 % 60)) / 100;
        }
        res->messages = produce_stream(t, stream, round, start, &missed, &k);
        res->killed_mid = k.committed >= 0;
        res->kill_committed = k.committed;
        res->kill_produced = k.total;
        res->streams = res->failed = 0;
        if (res->messages < 0)
                return 2;
        aggtest_flush(t);
        if (aggtest_wait_caught_up(t, 600) != 0) {
                fprintf(stderr, "FAIL: round %d: the aggregator did not catch up in 600 s\n", round);
                return 2;
        }
        char *gaps = aggtest_query(t, "SELECT count(*) FROM offset_gaps");
        if (!gaps || strcmp(gaps, "0") != 0) {
                fprintf(stderr, "FAIL: round %d: the broker dropped messages before they were read (offset_gaps: %s):"
                                " the round cannot be compared\n", round, gaps ? gaps : "?");
                free(gaps);
                return 2;
        }
        free(gaps);
        if (wait_nothing_held(t, 120) != 0) {
                fprintf(stderr, "FAIL: round %d: readings still held after 120 s\n", round);
                return 2;
        }
        char ledger[PATH_MAX], fails[PATH_MAX], cmd[4 * PATH_MAX];
        snprintf(ledger, sizeof(ledger), "%s/ledger-%d.txt", t->dir, round);
        snprintf(fails, sizeof(fails), "%s/fails-%d", t->dir, round);
        if (dump_ledger(t, round, ledger) != 0)
                return 2;
        snprintf(cmd, sizeof(cmd), "python3 '%s/pack.py' compare '%s' '%s' --tags '%s.tags' --fails '%s'", refdir, model,
                 ledger, model, fails);
        int rc = sh(cmd);
        FILE *f = fopen(fails, "r");
        res->failed = 0;
        for (int c; f && (c = fgetc(f)) != EOF;)
                res->failed += c == '\n';
        if (f)
                fclose(f);
        snprintf(cmd, sizeof(cmd), "%s.tags", model);
        char *tags = test_read_file(cmd);
        res->streams = tags && *tags ? 1 : 0; /* its last newline is cut */
        for (const char *p = tags; p && *p; p++)
                res->streams += *p == '\n';
        free(tags);
        if (missed && rc == 0)
                rc = 1;
        return rc == 0 ? 0 : rc == 1 ? 1 : 2;
}

/* The shrinker's check: one stream file alone on a fresh broker and database. */
static int one_file(const char *input)
{
        struct aggtest t;
        aggtest_start(&t, "agg_refone", 2);
        int64_t now = time_wall_ns();
        char stream[PATH_MAX], model[PATH_MAX], cmd[4 * PATH_MAX];
        snprintf(stream, sizeof(stream), "%s/stream.txt", t.dir);
        snprintf(model, sizeof(model), "%s/model.txt", t.dir);
        snprintf(cmd, sizeof(cmd),
                 "python3 '%s/pack.py' file '%s' --tag r0.c0 --now-ns %" PRId64 " --stream '%s' --model '%s'"
                 " && echo r0.c0 > '%s.tags'",
                 refdir, input, now, stream, model, model);
        if (sh(cmd) != 0) {
                aggtest_stop(&t);
                return 2;
        }
        pid_t agg = spawn(&t, "4000");
        struct round_result res;
        int rc = run_round(&t, 0, stream, model, &agg, false, "4000", &res);
        kill(agg, SIGKILL);
        waitpid(agg, NULL, 0);
        aggtest_stop(&t);
        return rc;
}

/* Shrinks each failing stream of a round (at most 3) into the corpus; the
 * round's small streams have seeds first..first + per - 1, its big ones after. */
static void shrink_fails(struct aggtest *t, int round, int64_t now, unsigned long first, long per)
{
        char fails[PATH_MAX], exe[PATH_MAX], cmd[8 * PATH_MAX];
        snprintf(fails, sizeof(fails), "%s/fails-%d", t->dir, round);
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0)
                return;
        exe[n] = '\0';
        const char *corpus = getenv("TALLY_REFERENCE_CORPUS");
        char corpus_default[PATH_MAX];
        if (!corpus || !*corpus) {
                snprintf(corpus_default, sizeof(corpus_default), "%s/corpus", refdir);
                corpus = corpus_default;
        }
        FILE *f = fopen(fails, "r");
        char tag[128];
        for (int k = 0; f && k < 3 && fgets(tag, sizeof(tag), f); k++) {
                tag[strcspn(tag, "\n")] = '\0';
                const char *seed = strchr(tag, '.');
                if (!seed || seed[1] == 'c')
                        continue; /* a corpus case: already kept */
                fprintf(stderr, "shrinking stream %s (seed %s) to a minimal case...\n", tag, seed + 1);
                unsigned long s = strtoul(seed + 1, NULL, 10);
                snprintf(cmd, sizeof(cmd),
                         "mkdir -p '%s' && python3 '%s/pack.py' shrink --tag %s --now-ns %" PRId64
                         " --kind %s --plans '%s/model-%d.txt.plans' --out '%s/seed-%s.txt' '%s'",
                         corpus, refdir, tag, now, s >= first && s < first + (unsigned long)per ? "small" : "big",
                         t->dir, round, corpus, seed + 1, exe);
                if (sh(cmd) != 0)
                        fprintf(stderr, "FAIL: could not shrink %s\n", tag);
        }
        if (f)
                fclose(f);
}

/* The fixed-seed round (or TALLY_REFERENCE_SEED's one seed) with the corpus. */
static int fixed(void)
{
        char seeds[256] = "";
        const char *one = getenv("TALLY_REFERENCE_SEED");
        bool only = one && *one;
        if (only) {
                snprintf(seeds, sizeof(seeds), "%lu", strtoul(one, NULL, 10));
        } else {
                for (size_t i = 0; i < sizeof(fixed_seeds) / sizeof(fixed_seeds[0]); i++)
                        snprintf(seeds + strlen(seeds), sizeof(seeds) - strlen(seeds), "%lu,", fixed_seeds[i]);
                snprintf(seeds + strlen(seeds), sizeof(seeds) - strlen(seeds), "%lu",
                         (unsigned long)(time_wall_ns() / 1000) % 1000000000UL);
        }
        fprintf(stderr, "reference seeds: %s (TALLY_REFERENCE_SEED=n reruns one)\n", seeds);

        struct aggtest t;
        aggtest_start(&t, "agg_reference", 4);
        int64_t now = time_wall_ns();
        char stream[PATH_MAX], model[PATH_MAX], cmd[4 * PATH_MAX];
        snprintf(stream, sizeof(stream), "%s/stream.txt", t.dir);
        snprintf(model, sizeof(model), "%s/model.txt", t.dir);
        snprintf(cmd, sizeof(cmd),
                 "python3 '%s/pack.py' round --round 0 --now-ns %" PRId64 " --seeds %s %s%s%s --stream '%s' --model '%s'",
                 refdir, now, seeds, only ? "" : "--corpus '", only ? "" : refdir, only ? "" : "/corpus'", stream,
                 model);
        CHECK(sh(cmd) == 0, "the generator or the model failed: %s", cmd);
        int64_t t0 = time_wall_ns();
        paced = true;
        pid_t agg = spawn(&t, GRACE);
        struct round_result res;
        int rc = run_round(&t, 0, stream, model, &agg, true, GRACE, &res);
        snprintf(cmd, sizeof(cmd), "%s/aggregator.0.log", t.dir);
        char *log = test_read_file(cmd);
        CHECK(log && strstr(log, "msg=\"batches take one commit group\""),
              "the first aggregator, kept up with, never took its partitions in commit groups");
        free(log);
        fprintf(stderr, "%" PRId64 " messages of %" PRId64 " streams folded and compared in %" PRId64
                        " ms; the first aggregator SIGKILLed with %" PRId64 " of the round's messages produced and %"
                        PRId64 " committed, a second one took over\n",
                res.messages, res.streams, (time_wall_ns() - t0) / NS_PER_MS, res.kill_produced,
                res.kill_committed);
        CHECK(res.killed_mid && res.kill_produced < res.messages, "no aggregator was killed mid-round");
        CHECK(rc == 0, "the ledger differs from the model (seeds %s; a stream's tag r0.SEED names its seed;"
                       " scripts/fuzz billing shrinks what it finds)", seeds);
        char *v = aggtest_query(&t, "SELECT coalesce(string_agg(n || ' x ' || r, E'\\n' ORDER BY r), '') FROM"
                                    " (SELECT left(reason, 60) AS r, count(*) AS n FROM dead_letters GROUP BY 1) x");
        fprintf(stderr, "dead letters:\n%s\n", v ? v : "?");
        free(v);
        /* every dead letter belongs to a stream of the round */
        v = aggtest_query(&t, "SELECT count(*) FROM dead_letters WHERE convert_from(raw, 'UTF8') !~ '\"sandbox\":\"r0\\.'");
        CHECK(v && strcmp(v, "0") == 0, "dead letters of no stream: %s", v ? v : "?");
        free(v);
        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}

/* A round drawn in the background (pack.py), while the one before is folded. */
struct drawn {
        int round;
        int64_t now;
        unsigned long first;
        char stream[PATH_MAX], model[PATH_MAX];
        pid_t pid;
};

static void draw_round(struct drawn *d, const char *dir, int round, unsigned long base, long per)
{
        d->round = round;
        d->now = time_wall_ns();
        d->first = base + (unsigned long)(round - 1) * (unsigned long)(per + 1);
        snprintf(d->stream, sizeof(d->stream), "%s/stream-%d.txt", dir, round);
        snprintf(d->model, sizeof(d->model), "%s/model-%d.txt", dir, round);
        char cmd[4 * PATH_MAX];
        snprintf(cmd, sizeof(cmd),
                 "python3 '%s/pack.py' round --round %d --now-ns %" PRId64 " --seed-base %lu --count %ld"
                 " --small --big 1 --stream '%s' --model '%s'",
                 refdir, round, d->now, d->first, per, d->stream, d->model);
        d->pid = fork();
        if (d->pid == 0) {
                execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
                _exit(127);
        }
}

static int drawn_wait(struct drawn *d)
{
        int st;
        if (d->pid < 0 || waitpid(d->pid, &st, 0) != d->pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "FAIL: round %d: the generator or the model failed\n", d->round);
                return -1;
        }
        return 0;
}

/* scripts/fuzz billing: rounds of small streams until the time is up. */
static int fuzz(long seconds)
{
        long per = getenv("TALLY_REFERENCE_STREAMS") ? strtol(getenv("TALLY_REFERENCE_STREAMS"), NULL, 10) : 4000;
        const char *s0 = getenv("TALLY_REFERENCE_SEED");
        unsigned long base = s0 && *s0 ? strtoul(s0, NULL, 10)
                                       : (unsigned long)(time_wall_ns() / 1000) % 1000000000UL * 1000UL;
        fprintf(stderr, "billing: rounds of %ld small streams and one of 1 to 1,000 sandboxes; seeds from %lu"
                        " (TALLY_REFERENCE_SEED=%lu repeats them within the hour)\n", per, base, base);
        struct aggtest t;
        aggtest_start(&t, "agg_fuzz", 4);
        /* the model and generator as they were at the start: editing the
         * source tree during a long run changes no round */
        static char copy[PATH_MAX], corpus[PATH_MAX + 16], cmd[3 * PATH_MAX];
        snprintf(corpus, sizeof(corpus), "%s/corpus", refdir);
        if (!getenv("TALLY_REFERENCE_CORPUS"))
                setenv("TALLY_REFERENCE_CORPUS", corpus, 1);
        snprintf(copy, sizeof(copy), "%s/reference", t.dir);
        snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", refdir, copy);
        if (sh(cmd) != 0) {
                fprintf(stderr, "FAIL: %s\n", cmd);
                return 1;
        }
        refdir = copy;
        pid_t agg = spawn(&t, GRACE);
        int64_t t0 = time_wall_ns(), passed = 0, failed = 0, messages = 0;
        int rc = 0;
        struct drawn cur, next;
        draw_round(&cur, t.dir, 1, base, per);
        for (int round = 1;; round++) {
                if (drawn_wait(&cur) != 0) {
                        rc = 1;
                        break;
                }
                bool last = (time_wall_ns() - t0) / NS_PER_SEC >= seconds;
                if (!last)
                        draw_round(&next, t.dir, round + 1, base, per);
                int64_t r0 = time_wall_ns();
                struct round_result res;
                int r = run_round(&t, round, cur.stream, cur.model, &agg, round % 2 == 0, GRACE, &res);
                messages += res.messages;
                passed += res.streams - res.failed;
                failed += res.failed;
                int64_t el = time_wall_ns() - t0;
                fprintf(stderr,
                        "round %d: seeds %lu..%lu, %" PRId64 " messages, %" PRId64 " streams passed, %" PRId64
                        " failed (%" PRId64 " s%s); total %" PRId64 " passed in %" PRId64 " s, %" PRId64
                        " streams/s\n",
                        round, cur.first, cur.first + (unsigned long)per, res.messages, res.streams - res.failed,
                        res.failed, (time_wall_ns() - r0) / NS_PER_SEC,
                        res.killed_mid ? ", aggregator killed mid-round" : "", passed, el / NS_PER_SEC,
                        passed * NS_PER_SEC / (el > 0 ? el : 1));
                if (r != 0)
                        rc = 1;
                if (r == 1)
                        shrink_fails(&t, round, cur.now, cur.first, per);
                if (r != 0 || last) {
                        if (!last) {
                                kill(next.pid, SIGKILL);
                                waitpid(next.pid, NULL, 0);
                        }
                        break;
                }
                remove(cur.stream);
                cur = next;
        }
        int64_t el = time_wall_ns() - t0;
        fprintf(stderr, "billing: %" PRId64 " streams (%" PRId64 " messages) in %" PRId64 " s, %" PRId64
                        " streams/s; seeds from %lu\n",
                passed + failed, messages, el / NS_PER_SEC, (passed + failed) * NS_PER_SEC / (el > 0 ? el : 1),
                base);
        printf("billing: %" PRId64 " passed, %" PRId64 " failed\n", passed, failed);
        kill(agg, SIGKILL);
        waitpid(agg, NULL, 0);
        aggtest_stop(&t);
        return rc;
}

int main(int argc, char **argv)
{
        refdir = getenv("TALLY_REFERENCE_DIR");
        if (!refdir) {
                fprintf(stderr, "FAIL: TALLY_REFERENCE_DIR is not set\n");
                return 1;
        }
        if (argc == 2)
                return one_file(argv[1]);
        const char *secs = getenv("TALLY_REFERENCE_SECONDS");
        if (secs && *secs)
                return fuzz(strtol(secs, NULL, 10));
        return fixed();
}
