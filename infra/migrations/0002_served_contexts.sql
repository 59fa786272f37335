-- Served history: every context the fleet answered a thread, as a manifest (blocks, sources, tokens,
-- digests), and the text of each block, stored once per thread under its digest. Written by the
-- gateway's write-behind beside ctx.prepared_contexts, in the same batch.

-- One row per answered context and format; ``step`` counts a thread's served contexts from 1.
-- Bounded: the write keeps a thread's newest 500 steps.
CREATE TABLE ctx.served_contexts (
    prepared_id  text        NOT NULL,
    format       text        NOT NULL,
    tenant       text        NOT NULL,
    thread_id    text        NOT NULL,
    step         integer     NOT NULL CHECK (step >= 1),
    manifest     jsonb       NOT NULL,
    served_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prepared_id, format)
);
-- Replicas writing one thread's steps take turns (an advisory lock per thread), so steps are unique.
CREATE UNIQUE INDEX served_contexts_thread ON ctx.served_contexts (thread_id, step);

-- A block's text as the model saw it (its messages, rendered), keyed by the thread and the digest
-- the manifest names: a block kept in view for many steps is stored once. Grows with what a thread
-- ever showed (its records, summaries and their reduced forms), not with its steps.
CREATE TABLE ctx.served_texts (
    thread_id  text NOT NULL,
    digest     text NOT NULL,
    tenant     text NOT NULL,
    text       text NOT NULL,
    PRIMARY KEY (thread_id, digest)
);
