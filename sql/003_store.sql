-- 003_store: the aggregator's store follows the sandbox, gaps are recorded,
-- and a missing rate refuses loudly.
-- Written by tally-aggregator (docs/billing.md, "Exactly once", "Dead letters",
-- "Retention gaps", "Metering gaps", "Memory and pruning").

-- The fold state per sandbox, as the one line of text fold_state_format()
-- writes (aggregator/fold.h): the store never knows its fields. It is loaded
-- by sandbox id, whatever partition the sandbox's messages arrive on, so a
-- change of partition count or owner bills each sandbox from where it was
-- left. version is +1 at every commit that writes the row; a commit states
-- the version it read and writes nothing (rolls back) when the row moved on:
-- two aggregators can never both bill from the same old state.
ALTER TABLE fold_state RENAME TO fold_state_002;
CREATE TABLE fold_state (
    sandbox_id  text PRIMARY KEY,
    account_id  text NOT NULL,
    key_id      text NOT NULL,
    fold        text NOT NULL,
    version     bigint NOT NULL CHECK (version > 0),
    -- the fold's last state was stopped (its final reading billed): see
    -- fold_state_prune() for when such rows may go
    stopped     boolean NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70); -- updated in place every batch: leave room for HOT updates
CREATE INDEX fold_state_stopped ON fold_state (updated_at) WHERE stopped;

-- The rows of 002 in the v1 text (state: 0 running, 1 paused, 2 stopped).
INSERT INTO fold_state (sandbox_id, account_id, key_id, fold, version, stopped)
SELECT sandbox_id, account_id, key_id,
       format('v1 known=1 epoch=%s seq=%s cpu_ns=%s wall_ns=%s state=%s mem_size_bytes=%s disk_bytes=%s',
              epoch, seq, cpu_ns, wall_ns,
              CASE state WHEN 'running' THEN 0 WHEN 'paused' THEN 1 ELSE 2 END, mem_size_bytes, disk_bytes),
       1, state = 'stopped'
  FROM fold_state_002;
DROP TABLE fold_state_002;

-- A stopped sandbox's fold state may be deleted once no message of it can
-- arrive any more: when every message older than the row has left the topic
-- (retention) — a later sample of a sandbox with no row would be billed as a
-- first sample. Call with the usage topic's retention (plus margin); returns
-- the rows deleted.
CREATE FUNCTION fold_state_prune(p_older_than interval) RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM fold_state WHERE stopped AND updated_at < now() - p_older_than RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Offsets a consumer group lost: the next offset it had stored was no longer
-- in the broker (retention, or a development broker's memory limit), so the
-- messages [from_offset, to_offset] were never billed. Written in the same
-- transaction that moves the group's offset past them. kind 'behind': the
-- stored offset was below the partition's first offset; 'ahead': above its
-- end (topic recreated), the consumer restarts at the partition's first offset.
CREATE TABLE offset_gaps (
    id           bigserial PRIMARY KEY,
    group_id     text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    from_offset  bigint NOT NULL,
    to_offset    bigint NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('behind', 'ahead')),
    detected_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX offset_gaps_detected ON offset_gaps (detected_at);

-- Per host, when the aggregator last committed a sample of it (its own clock,
-- never the host's) and the host's own time of that sample.
CREATE TABLE hosts (
    host             text PRIMARY KEY,
    last_sample_at   timestamptz NOT NULL,
    last_sample_wall timestamptz
);

-- The threshold after which a host with running sandboxes and no sample is a
-- metering gap (the collector samples about once a second). To change it,
-- CREATE OR REPLACE this function.
CREATE FUNCTION metering_gap_threshold() RETURNS interval LANGUAGE sql STABLE AS $$
    SELECT interval '30 seconds'
$$;

-- Every aggregator reads metering_gaps every few seconds: only running
-- sandboxes are looked at.
CREATE INDEX sandboxes_running_host ON sandboxes (host) WHERE state = 'running';

-- Hosts that have running sandboxes (per the ledger) and no sample committed
-- for longer than metering_gap_threshold(): their sandboxes are not being
-- metered. A host never sampled counts from its sandboxes' rows.
CREATE VIEW metering_gaps AS
SELECT s.host,
       count(*) AS running_sandboxes,
       h.last_sample_at,
       now() - coalesce(h.last_sample_at, min(s.updated_at)) AS silent_for
  FROM sandboxes s LEFT JOIN hosts h ON h.host = s.host
 WHERE s.state = 'running' AND s.host <> ''
 GROUP BY s.host, h.last_sample_at
HAVING coalesce(h.last_sample_at, min(s.updated_at)) < now() - metering_gap_threshold();

-- Usage a plan has no rate for (an account on a plan missing a meter's
-- rate, or an hour before the plan's first rate). The usage itself is kept
-- exactly in usage_hourly — the message is not at fault, the plan is — but it
-- cannot be rated: it counts as nothing toward spend_daily and the limits, the
-- aggregator logs it at error, counts it in /metrics and records one row per
-- (account, plan, meter, hour) here. Invoices rate usage_hourly when they are
-- read, so adding the missing plan_rates row prices it there; spend_daily of
-- the days already past is not rewritten.
CREATE TABLE rating_gaps (
    account_id  text NOT NULL,
    plan_id     text NOT NULL,
    meter       text NOT NULL,
    hour        timestamptz NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, meter, hour)
);
