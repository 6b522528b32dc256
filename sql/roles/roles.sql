-- roles.sql — tally's PostgreSQL roles, one per program; run once per cluster by
-- an administrator (a superuser, or a role with CREATEROLE), before the first
-- `tally-migrate apply`, and again after an upgrade adds a role: it makes the
-- roles missing and leaves the others as they are. Roles belong to the cluster,
-- not to a database, so the migrations cannot make them without CREATEROLE,
-- which the owner must not have (on PostgreSQL 15 it can grant itself
-- pg_execute_server_program). The grants are the migration sql/013_roles.sql's.
--
--   tally_owner       owns the database and every object of tally's: tally-migrate
--   tally_aggregator  tally-aggregator: the ledger's writer
--   tally_api         tally-api: people, keys, limits, sessions, reads
--   tally_admin       tally-admin: accounts, people, keys, plans, closing months
--   tally_vmm         tally-vmm's spend-limit check (limits_database_url): reads key_blocks;
--                     its heartbeat (host_registry_database_url): its row of host_registry (sql/021)
--   tally_notifier    tally-notifier: the alert outbox
--   tally_close_due   tally-admin close-due (the timer): close_due() and nothing else
--   finance           NOLOGIN: the finance views; people log in as members of it
--
-- A program's role can log in once it has a password (`\password tally_api` in
-- psql; pg_hba.conf: scram-sha-256). To give each host its own login (revoked
-- alone), make members: CREATE ROLE vmm_host7 LOGIN IN ROLE tally_vmm.
-- None is a superuser, none may create roles or databases or bypass row-level
-- security (docs/security.md).
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['tally_owner', 'tally_aggregator', 'tally_api', 'tally_admin', 'tally_vmm',
                             'tally_notifier', 'tally_close_due'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', r);
        END IF;
        EXECUTE format('ALTER ROLE %I NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS', r);
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'finance') THEN
        CREATE ROLE finance NOLOGIN;
    END IF;
    ALTER ROLE finance NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
END $$;
