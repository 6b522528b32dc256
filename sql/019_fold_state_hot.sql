-- 019_fold_state_hot.sql — fold_state rows are rewritten in place (HOT) by
-- every batch that bills their sandbox. The index fold_state_prune() reads
-- keyed them by updated_at, which every batch sets: an indexed column that
-- changes forbids a HOT update, so each batch wrote a new primary-key entry
-- per sandbox (and the index grew until pruned). Keyed by sandbox_id instead
-- (never changed), still only over stopped rows: the prune reads the stopped
-- rows and keeps those updated long enough ago, as before.
DROP INDEX fold_state_stopped;
CREATE INDEX fold_state_stopped ON fold_state (sandbox_id) WHERE stopped;
