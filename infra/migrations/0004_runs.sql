-- Runs, thread roles, snapshots, principals and resets (seed 000 §8).

ALTER TABLE ctx.sessions ADD COLUMN principal_id text;
ALTER TABLE ctx.sessions ADD COLUMN agent_release text;
-- Records with session_seq <= reset_seq are outside the current context origin (still readable).
ALTER TABLE ctx.sessions ADD COLUMN reset_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE ctx.runs (
    run_id            text PRIMARY KEY,
    session_id        text NOT NULL REFERENCES ctx.sessions (session_id),
    status            text NOT NULL CHECK (status IN ('active', 'completed', 'failed', 'cancelled', 'interrupted')),
    main_thread_id    text NOT NULL,
    -- The immutable session history snapshot this run inherits: every record up to this session seq.
    snapshot_through  bigint NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
-- One active run per session, enforced by the database.
CREATE UNIQUE INDEX runs_one_active ON ctx.runs (session_id) WHERE status = 'active';

ALTER TABLE ctx.thread_heads ADD COLUMN role text NOT NULL DEFAULT 'main' CHECK (role IN ('main', 'child'));
ALTER TABLE ctx.thread_heads ADD COLUMN parent_thread_id text;

