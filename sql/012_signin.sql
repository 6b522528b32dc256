-- 012_signin: sign-in failure counts that no flood of other emails can wear
-- away, and Idempotency-Key answers scoped to who sent them.

-- Sign-in attempts per email and per client address (an IPv6 client counts
-- by its /64): tally-api charges one attempt to both rows in one statement
-- BEFORE it checks a password (the rows' locks order concurrent attempts,
-- so no more than signin_max_failures of a window reach the hash), and a
-- right password gives the attempt back. A row is never evicted while its
-- window runs; tally-api's janitor deletes rows whose window ended.
CREATE TABLE signin_attempts (
    subject      text PRIMARY KEY,        -- 'email:<lowercased email>' or 'addr:<address>'
    attempts     integer NOT NULL CHECK (attempts >= 0),
    window_start timestamptz NOT NULL
);
CREATE INDEX signin_attempts_window ON signin_attempts (window_start);

-- An Idempotency-Key belongs to the key (or person) that sent it and to the
-- route it was sent to: another key of the same account, or another route,
-- never sees its answer. An answer that showed a secret once (a new API key,
-- a webhook's signing secret) is stored without it.
ALTER TABLE idempotency_keys ADD COLUMN caller text NOT NULL DEFAULT '';  -- key id, or 'person:<id>'
ALTER TABLE idempotency_keys ADD COLUMN route text NOT NULL DEFAULT '';   -- 'POST /v1/sandboxes/{id}/exec'
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (account_id, caller, route, idem_key);
