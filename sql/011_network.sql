-- 011_network: a sandbox's network (docs/security.md, "The network").
--
--   * api_keys.internet: whether sandboxes this key creates (or forks) may ask
--     for internet at all ("network": true or {"internet": true, ...}). Off by
--     default; like the daily limit, only a person (a dashboard session) may
--     set it, never an API key (tally-api refuses), and each change is audited.
--   * sandboxes.net_rx_bytes / net_tx_bytes: bytes tally-vmm's egress proxy
--     relayed to and from the sandbox, cumulative, as the last sample carried
--     them (recorded, not priced).
ALTER TABLE api_keys ADD COLUMN internet boolean NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN net_rx_bytes bigint NOT NULL DEFAULT 0 CHECK (net_rx_bytes >= 0);
ALTER TABLE sandboxes ADD COLUMN net_tx_bytes bigint NOT NULL DEFAULT 0 CHECK (net_tx_bytes >= 0);
