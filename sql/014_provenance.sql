-- 014_provenance: readings held until their sandbox's provenance is known.
-- Written by tally-aggregator (docs/billing.md, "Provenance").
--
-- A sample or `stopped` event of a sandbox whose `created` event has not been
-- seen yet, or under an epoch its host has not announced, is not billed: it
-- waits here, written in the same transaction that moves the Kafka offset past
-- it. When the `created` (or `restarted`) event comes, the aggregator bills the
-- held readings in order and deletes them in the same transaction; what is
-- still held after the aggregator's provenance_grace_ms goes to dead_letters
-- with its reason.
CREATE TABLE held_readings (
    partition   integer NOT NULL,
    "offset"    bigint NOT NULL,
    sandbox_id  text NOT NULL,
    raw         bytea NOT NULL,
    reason      text NOT NULL,
    held_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, "offset")
);
CREATE INDEX held_readings_sandbox ON held_readings (sandbox_id);
CREATE INDEX held_readings_held_at ON held_readings (held_at);

-- tally_aggregator (013's roles): holds, replays and expires the readings; an
-- expired one moves to dead_letters, whose new rows come back to be logged.
GRANT SELECT, INSERT, DELETE ON held_readings TO tally_aggregator;
-- a reading replayed and held again for another reason gets that reason
GRANT UPDATE (reason) ON held_readings TO tally_aggregator;
GRANT SELECT (partition, "offset", reason) ON dead_letters TO tally_aggregator;
