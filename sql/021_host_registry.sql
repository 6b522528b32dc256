-- 021_host_registry.sql — the hosts as each tally-vmm registers itself: where
-- tally-api reaches it, what it may promise its sandboxes and what it has
-- promised now, when it last said so (PostgreSQL's clock, never the host's),
-- and an operator's wish to drain it (docs/operations.md, "The host registry
-- and draining a host").
--
-- Written by tally-vmm's heartbeat (vmm/host_registry.c, every 5 s, with
-- host_registry_database_url), the state by `tally-admin host drain|resume`;
-- read by tally-api (host_states: which hosts to skip, how much room each has)
-- and `tally-admin host list` / `status`.
--
-- A host may write its own row's heartbeat, address, capacity and promised
-- columns and never its state; which row is "its own" is the login that first
-- registered it (registered_by, row-level security below): with a login per
-- host (CREATE ROLE vmm_host7 LOGIN IN ROLE tally_vmm, docs/operations.md) a
-- host cannot touch another's row; hosts that share the tally_vmm login share
-- its rights, as they share its password.

CREATE TABLE host_registry (
    host_id                   text PRIMARY KEY CHECK (host_id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    -- what tally-api dials: vmm_sockets' form without "HOST_ID=", e.g.
    -- https://10.0.0.11:7443 (NULL: the host does not say; docs/vmm.md)
    address                   text CHECK (length(address) BETWEEN 1 AND 512),
    -- capacity before the ratios, and the ratios (vmm/capacity.h): what the
    -- host may promise is capacity × percent / 100
    capacity_vcpus            bigint NOT NULL CHECK (capacity_vcpus >= 0),
    capacity_memory_mib       bigint NOT NULL CHECK (capacity_memory_mib >= 0),
    capacity_disk_mib         bigint NOT NULL CHECK (capacity_disk_mib >= 0),
    vcpu_overcommit_percent   integer NOT NULL CHECK (vcpu_overcommit_percent BETWEEN 1 AND 10000),
    memory_overcommit_percent integer NOT NULL CHECK (memory_overcommit_percent BETWEEN 1 AND 10000),
    disk_overcommit_percent   integer NOT NULL CHECK (disk_overcommit_percent BETWEEN 1 AND 10000),
    -- promised now: vCPUs of running sandboxes, memory and disk of live ones
    -- (running and paused), creates under way included (vmm/create.c's admit)
    promised_vcpus            bigint NOT NULL DEFAULT 0 CHECK (promised_vcpus >= 0),
    promised_memory_mib       bigint NOT NULL DEFAULT 0 CHECK (promised_memory_mib >= 0),
    promised_disk_mib         bigint NOT NULL DEFAULT 0 CHECK (promised_disk_mib >= 0),
    live_sandboxes            integer NOT NULL DEFAULT 0 CHECK (live_sandboxes >= 0),
    registered_by             text NOT NULL DEFAULT current_user,
    registered_at             timestamptz NOT NULL DEFAULT now(),
    heartbeat_at              timestamptz NOT NULL DEFAULT now(),
    -- the operator's: a draining host takes no new sandbox; its own keep running
    state                     text NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'draining')),
    state_changed_by          text,
    state_changed_at          timestamptz
);

-- The database's clock, whatever a row says: a host cannot date its heartbeat
-- (a host that wrote a time in the future would never go down), nor its
-- registration, nor claim a row for another login; a change of state is
-- dated when it is made.
CREATE FUNCTION host_registry_stamp() RETURNS trigger LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.registered_at := now();
        NEW.heartbeat_at := now();
        NEW.registered_by := current_user;
        NEW.state_changed_at := CASE WHEN NEW.state_changed_by IS NULL THEN NULL ELSE now() END;
    ELSE
        IF NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at THEN
            NEW.heartbeat_at := now();
        END IF;
        IF NEW.state IS DISTINCT FROM OLD.state OR NEW.state_changed_by IS DISTINCT FROM OLD.state_changed_by THEN
            NEW.state_changed_at := now();
        END IF;
        NEW.registered_at := OLD.registered_at;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER host_registry_stamp BEFORE INSERT OR UPDATE ON host_registry
    FOR EACH ROW EXECUTE FUNCTION host_registry_stamp();

-- How long a host may be silent before it counts as down (tally-vmm beats
-- every 5 s: three beats missed). To change it, CREATE OR REPLACE this
-- function, as metering_gap_threshold().
CREATE FUNCTION host_heartbeat_bound() RETURNS interval LANGUAGE sql STABLE AS $$
    SELECT interval '15 seconds'
$$;

-- Each registered host's effective state — 'down' when its last heartbeat is
-- older than host_heartbeat_bound(), else its stored state ('ready' or
-- 'draining') — with what it may promise (capacity × percent / 100, as
-- vmm/capacity.c rounds) and what is left (never below 0). tally-api places
-- creates on effective_state = 'ready' hosts only.
CREATE VIEW host_states AS
SELECT r.host_id,
       CASE WHEN r.heartbeat_at < now() - host_heartbeat_bound() THEN 'down' ELSE r.state END AS effective_state,
       r.state, r.state_changed_by, r.state_changed_at,
       r.address,
       r.heartbeat_at, now() - r.heartbeat_at AS heartbeat_age, r.registered_at,
       r.capacity_vcpus, r.capacity_memory_mib, r.capacity_disk_mib,
       r.vcpu_overcommit_percent, r.memory_overcommit_percent, r.disk_overcommit_percent,
       r.capacity_vcpus * r.vcpu_overcommit_percent / 100 AS promisable_vcpus,
       r.capacity_memory_mib * r.memory_overcommit_percent / 100 AS promisable_memory_mib,
       r.capacity_disk_mib * r.disk_overcommit_percent / 100 AS promisable_disk_mib,
       r.promised_vcpus, r.promised_memory_mib, r.promised_disk_mib,
       greatest(0, r.capacity_vcpus * r.vcpu_overcommit_percent / 100 - r.promised_vcpus) AS free_vcpus,
       greatest(0, r.capacity_memory_mib * r.memory_overcommit_percent / 100 - r.promised_memory_mib)
           AS free_memory_mib,
       greatest(0, r.capacity_disk_mib * r.disk_overcommit_percent / 100 - r.promised_disk_mib) AS free_disk_mib,
       r.live_sandboxes
  FROM host_registry r;

-- ---------------------------------------------------------------------------
-- Grants, in 013_roles.sql's shape.
-- tally_vmm: its heartbeat (an upsert): registers, then changes only what it
-- reports; never the state, the registration or the login it is bound to.
GRANT SELECT ON host_registry TO tally_vmm;
GRANT INSERT (host_id, address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib, vcpu_overcommit_percent,
              memory_overcommit_percent, disk_overcommit_percent, promised_vcpus, promised_memory_mib,
              promised_disk_mib, live_sandboxes)
    ON host_registry TO tally_vmm;
GRANT UPDATE (address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib, vcpu_overcommit_percent,
              memory_overcommit_percent, disk_overcommit_percent, promised_vcpus, promised_memory_mib,
              promised_disk_mib, live_sandboxes, heartbeat_at)
    ON host_registry TO tally_vmm;
-- tally_admin: `host list`, `host drain|resume` (the state and who set it),
-- `host forget` (a row a retired host or another login left)
GRANT SELECT ON host_registry, host_states TO tally_admin;
GRANT UPDATE (state, state_changed_by) ON host_registry TO tally_admin;
GRANT DELETE ON host_registry TO tally_admin;
-- tally_api: reads where the hosts are and which may take a sandbox
GRANT SELECT ON host_registry, host_states TO tally_api;

ALTER TABLE host_registry ENABLE ROW LEVEL SECURITY;
CREATE POLICY host_registry_read ON host_registry FOR SELECT TO tally_api, tally_admin USING (true);
CREATE POLICY host_registry_state ON host_registry FOR UPDATE TO tally_admin USING (true) WITH CHECK (true);
CREATE POLICY host_registry_forget ON host_registry FOR DELETE TO tally_admin USING (true);
-- a host: the rows its login registered (registered_by is set by the trigger)
CREATE POLICY host_registry_own_read ON host_registry FOR SELECT TO tally_vmm
    USING (registered_by = current_user);
CREATE POLICY host_registry_register ON host_registry FOR INSERT TO tally_vmm
    WITH CHECK (registered_by = current_user);
CREATE POLICY host_registry_heartbeat ON host_registry FOR UPDATE TO tally_vmm
    USING (registered_by = current_user) WITH CHECK (registered_by = current_user);
