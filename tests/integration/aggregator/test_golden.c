/* Integration: the product pages' worked figures, through the real pipeline.
 * Samples go to a development broker, a real tally-aggregator process bills
 * them into a real PostgreSQL, and the invoice is read back from the ledger's
 * invoice_lines view. The expected figures are the product pages' (docs/architecture.md), typed
 * in here, never computed by tally's code. The same run also sends messages
 * billing cannot use (they must become dead letters, and the process must go
 * on) and a `created` event after its sandbox's samples (labels join late). */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GiB (UINT64_C(1) << 30)

static int64_t q_int(struct aggtest *t, const char *sql)
{
        char *v = aggtest_query(t, sql);
        int64_t x = v && *v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return x;
}

/* One hour of a 2 vCPU / 4 GiB sandbox, a sample a minute, using `milli_vcpus` of CPU. */
static void one_hour(struct aggtest *t, const char *account, const char *key, const char *sandbox, int64_t from,
                     uint64_t milli_vcpus)
{
        for (int m = 0; m <= 60; m++) {
                uint64_t cpu = milli_vcpus * (uint64_t)m * 60 * NS_PER_SEC / 1000;
                struct usage_event ev = aggtest_sample(account, key, sandbox, 1, (uint64_t)m + 1,
                                                       from + m * 60 * NS_PER_SEC, STATE_RUNNING, cpu, 4 * GiB, 0, 2);
                aggtest_produce(t, &ev);
        }
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_golden", 3);
        aggtest_exec(&t, "INSERT INTO accounts (id, name) VALUES ('busy', 'b'), ('waiting', 'w'), ('tasks', 't');"
                         "INSERT INTO api_keys (id, account_id, key_hash) VALUES"
                         " ('kb', 'busy', sha256('kb')), ('kw', 'waiting', sha256('kw')), ('kt', 'tasks', sha256('kt'))");

        /* Sample times are checked against the aggregator's clock, so the usage is
         * recent: last month (UTC), whichever it is; every month has room for the
         * 1,000 tasks below (25.7 days of starts). */
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        int year = tm.tm_mon == 0 ? tm.tm_year + 1900 - 1 : tm.tm_year + 1900, mon = tm.tm_mon == 0 ? 12 : tm.tm_mon;
        int64_t month0 = aggtest_utc(year, mon, 1, 0, 0, 0), day2_10h = aggtest_utc(year, mon, 2, 10, 0, 0);

        /* "2 vCPU, 4 GiB, both CPUs busy: $0.08 an hour." */
        one_hour(&t, "busy", "kb", "sb-busy", day2_10h, 2000);
        /* "Same sandbox waiting on its model (0.05 vCPU): $0.03125 an hour." */
        one_hour(&t, "waiting", "kw", "sb-wait", day2_10h, 50);

        /* "1,000 tasks a month, each a 2 vCPU / 4 GiB sandbox running 30 minutes with
         * 300 CPU-seconds: CPU $2.08, memory $15.00, total $17.08." Starts spread
         * over the month so many tasks cross an hour boundary. */
        for (int i = 0; i < 1000; i++) {
                char id[32];
                snprintf(id, sizeof(id), "task-%04d", i);
                int64_t start = month0 + (int64_t)i * 37 * 60 * NS_PER_SEC;
                for (int s = 0; s <= 6; s++) {
                        struct usage_event ev = aggtest_sample("tasks", "kt", id, 1, (uint64_t)s + 1,
                                                               start + s * 5 * 60 * NS_PER_SEC,
                                                               s == 6 ? STATE_STOPPED : STATE_RUNNING,
                                                               (uint64_t)s * 50 * NS_PER_SEC, 4 * GiB, 0, 2);
                        ev.final = s == 6;
                        aggtest_produce(&t, &ev);
                }
        }

        /* Messages billing cannot use: each a dead letter, none fatal. */
        const char *bad[] = {
                "this is not json",
                "{\"v\":2,\"type\":\"sample\",\"sandbox\":\"x\",\"account\":\"busy\"}",
                "{\"v\":1,\"type\":\"sample\",\"host\":\"h\",\"sandbox\":\"x\",\"account\":\"busy\",\"key\":\"kb\","
                "\"epoch\":1,\"seq\":1,\"wall_ns\":1780000000000000000,\"state\":\"running\",\"cpu_ns\":-5,"
                "\"mem_size_bytes\":1,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"host\":\"h\",\"sandbox\":\"x\",\"account\":\"busy\","
                "\"epoch\":1,\"seq\":1,\"wall_ns\":1780000000000000000,\"state\":\"running\",\"cpu_ns\":5,"
                "\"mem_size_bytes\":1,\"vcpus\":1}",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
                aggtest_produce_raw(&t, "busy", bad[i], strlen(bad[i]));
        /* Valid JSON, impossible usage: 10^18 ns of CPU from 1 vCPU in a minute. */
        struct usage_event ok = aggtest_sample("other", "ko", "sb-crazy", 1, 1, day2_10h,
                                               STATE_RUNNING, 0, GiB, 0, 1);
        struct usage_event crazy = ok;
        crazy.seq = 2;
        crazy.wall_ns += 60 * NS_PER_SEC;
        crazy.cpu_ns = UINT64_C(1000000000000000000);
        aggtest_produce(&t, &ok);
        aggtest_produce(&t, &crazy);

        /* The created event arrives after the samples it describes. */
        struct usage_event created = { .type = EVENT_CREATED, .wall_ns = day2_10h,
                                       .mem_size_bytes = 4 * GiB, .vcpus = 2, .disk_size_bytes = 10 * GiB };
        strcpy(created.host, "host-1");
        strcpy(created.sandbox, "sb-busy");
        strcpy(created.account, "busy");
        strcpy(created.key, "kb");
        strcpy(created.backend, "process");
        event_add_label(&created, "team", "ml");
        /* (COPY's own characters in a label: each kept as it was.) */
        event_add_label(&created, "note", "tab\there \\N back\\ new\nline\r \"q\" \xc3\xa9");
        aggtest_produce(&t, &created);
        event_clear(&created);
        aggtest_flush(&t);

        const char *extra[] = { "--batch-messages", "1000", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not consume the stream");

        CHECK(q_int(&t, "SELECT sum(amount_nanodollars) FROM invoice_lines WHERE account_id = 'busy'") == 80000000,
              "busy hour: want $0.08 = 80000000 nano-dollars");
        CHECK(q_int(&t, "SELECT total_cents FROM invoices WHERE account_id = 'busy'") == 8, "busy hour: want 8 cents");
        CHECK(q_int(&t, "SELECT sum(amount_nanodollars) FROM invoice_lines WHERE account_id = 'waiting'") == 31250000,
              "waiting hour: want $0.03125 = 31250000 nano-dollars");
        CHECK(q_int(&t, "SELECT amount_cents FROM invoice_lines WHERE account_id = 'tasks' AND meter = 'cpu'") == 208,
              "1,000 tasks: CPU want $2.08");
        CHECK(q_int(&t, "SELECT amount_cents FROM invoice_lines WHERE account_id = 'tasks' AND meter = 'memory'") == 1500,
              "1,000 tasks: memory want $15.00");
        CHECK(q_int(&t, "SELECT total_cents FROM invoices WHERE account_id = 'tasks'") == 1708,
              "1,000 tasks: total want $17.08");
        CHECK(q_int(&t, "SELECT count(*) FROM invoices WHERE account_id = 'tasks'") == 1,
              "1,000 tasks in a month: one invoice");
        CHECK(q_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE account_id = 'tasks'") == 300000000000000,
              "1,000 tasks: 300,000 CPU-seconds");

        CHECK(q_int(&t, "SELECT count(*) FROM dead_letters") == 5, "five dead letters");
        CHECK(q_int(&t, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'impossible sample%'") == 1,
              "impossible usage is a dead letter");
        CHECK(q_int(&t, "SELECT coalesce(sum(cpu_ns), 0) FROM usage_hourly WHERE sandbox_id = 'sb-crazy'") == 0,
              "impossible usage is not billed");
        CHECK(q_int(&t, "SELECT count(*) FROM dead_letters WHERE raw = convert_to('this is not json', 'UTF8')"
                        " AND reason LIKE '%JSON%'") == 1, "the raw bytes and the reason are kept");
        CHECK(q_int(&t, "SELECT count(*) FROM sandboxes WHERE id = 'sb-busy' AND labels->>'team' = 'ml'"
                        " AND backend = 'process' AND vcpus = 2 AND key_id = 'kb'") == 1,
              "labels of a late created event join the sandbox billed from its samples");
        CHECK(q_int(&t, "SELECT count(*) FROM sandboxes WHERE id = 'sb-busy'"
                        " AND labels->>'note' = E'tab\\there \\\\N back\\\\ new\\nline\\r \"q\" \xc3\xa9'") == 1,
              "a label with a tab, backslashes, a newline, a carriage return, quotes and UTF-8 is kept as sent");
        CHECK(q_int(&t, "SELECT count(*) FROM sandboxes WHERE account_id = 'tasks' AND state = 'stopped'") == 1000,
              "sandboxes from samples");

        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly (after bad input, too)");
        aggtest_stop(&t);
        return test_result();
}
