-- The budget a thread is actually prepared at. A runtime may ask for contexts under a smaller budget
-- than its session's policy names (a smaller model, a cap per request): once a prepare had to wait
-- for an urgent compaction under such a budget, the budgeter compacts ahead of it at that budget,
-- so later steps find a view that fits instead of each waiting on the hot path again.
ALTER TABLE ctx.thread_views
    ADD COLUMN prepare_budget   integer CHECK (prepare_budget > 0),
    ADD COLUMN prepare_reserved integer NOT NULL DEFAULT 0 CHECK (prepare_reserved >= 0);
