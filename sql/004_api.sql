-- 004_api: what tally-api needs to tell who is asking and to remember what it did.
-- Secrets are never stored: API keys and session tokens as SHA-256, passwords as
-- yescrypt (libcrypt) strings, CSRF tokens as SHA-256.

-- A person's password (crypt(3) string, "$y$..."); NULL: cannot sign in yet.
ALTER TABLE people ADD COLUMN password_hash text;

-- The visible start of a key ("tk_1a2b3c4d"), for lists; who made it.
ALTER TABLE api_keys ADD COLUMN prefix text NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN created_by text;
-- alert_only: alerts at 50/80/100% without enforcement (no block, no pause).
ALTER TABLE api_keys DROP CONSTRAINT api_keys_limit_policy_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_limit_policy_check
    CHECK (limit_policy IN ('pause', 'stop', 'alert_only'));
CREATE INDEX api_keys_account_id ON api_keys (account_id, id);

-- Dashboard sessions: the cookie's token and the CSRF token, both hashed.
CREATE TABLE sessions (
    token_hash  bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    csrf_hash   bytea NOT NULL CHECK (length(csrf_hash) = 32),
    person_id   text NOT NULL REFERENCES people (id),
    account_id  text NOT NULL REFERENCES accounts (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX sessions_expires ON sessions (expires_at);

-- Every change a person (or an operator with tally-admin) makes to keys and
-- limits: who, when, what it was, what it became.
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    account_id  text NOT NULL,
    actor       text NOT NULL,            -- 'person:<id>' or 'admin'
    action      text NOT NULL,            -- key.create, key.revoke, key.limit, account.plan, ...
    object_id   text NOT NULL DEFAULT '',
    old_value   jsonb,
    new_value   jsonb
);
CREATE INDEX audit_log_account ON audit_log (account_id, at);

-- Idempotency-Key: a row inserted (and committed) before the request runs is
-- the lock that keeps a retry from running it twice; the response is stored
-- into it afterwards and replayed for 24 hours.
CREATE TABLE idempotency_keys (
    account_id   text NOT NULL,
    idem_key     text NOT NULL,
    request_hash bytea NOT NULL,          -- SHA-256 of method, path and body
    status       integer,                 -- NULL while the first request runs
    body         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, idem_key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- alert_only keys are never blocked: whoever writes key_blocks (the
-- aggregator at 100% copies the key's policy), such a row is skipped here.
CREATE FUNCTION key_blocks_skip_alert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.policy = 'alert_only'
       OR EXISTS (SELECT 1 FROM api_keys WHERE id = NEW.key_id AND limit_policy = 'alert_only') THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER key_blocks_alert_only BEFORE INSERT ON key_blocks
    FOR EACH ROW EXECUTE FUNCTION key_blocks_skip_alert_only();
