-- Policies, counters and compaction: views are versioned, summaries chain, source records stay.

CREATE TABLE ctx.policies (
    name        text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, revision)
);
INSERT INTO ctx.policies (name, revision, body) VALUES ('default', 1, '{"schema_version": 1, "name": "default"}');

-- A session pins the policy revision current at its first event.
ALTER TABLE ctx.sessions ADD COLUMN policy_name text NOT NULL DEFAULT 'default';
ALTER TABLE ctx.sessions ADD COLUMN policy_revision integer NOT NULL DEFAULT 1;

-- Counter totals (seed 000 §5.2), maintained by the recorder with the records they count.
ALTER TABLE ctx.thread_heads ADD COLUMN user_turns bigint NOT NULL DEFAULT 0;
ALTER TABLE ctx.thread_heads ADD COLUMN model_steps bigint NOT NULL DEFAULT 0;

-- Old tool output masked down to a short preview when the hot path must shed tokens.
ALTER TABLE ctx.records ADD COLUMN mask_text text;
ALTER TABLE ctx.records ADD COLUMN mask_tokens_o200k integer;
ALTER TABLE ctx.records ADD COLUMN mask_tokens_cl100k integer;

CREATE TABLE ctx.summaries (
    summary_id          uuid PRIMARY KEY,
    thread_id           text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    view_revision       bigint NOT NULL,
    parent_summary_id   uuid REFERENCES ctx.summaries (summary_id),
    covered_from        bigint NOT NULL,
    covered_to          bigint NOT NULL,
    source_watermark    bigint NOT NULL,
    policy_name         text NOT NULL,
    policy_revision     integer NOT NULL,
    body                jsonb NOT NULL,
    text                text NOT NULL,
    tokens_o200k        integer NOT NULL,
    tokens_cl100k       integer NOT NULL,
    summarizer          text NOT NULL,
    calls               integer NOT NULL,
    trigger_reasons     text[] NOT NULL,
    tokens_before       integer NOT NULL,
    tokens_after        integer NOT NULL,
    target_reached      boolean NOT NULL,
    job_id              text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT summaries_revision UNIQUE (thread_id, view_revision),
    CHECK (covered_from <= covered_to)
);

-- The compaction state of a thread's view (seed 000 §3 CompactionState). Revision-checked.
CREATE TABLE ctx.thread_views (
    thread_id                 text PRIMARY KEY REFERENCES ctx.thread_heads (thread_id),
    view_revision             bigint NOT NULL DEFAULT 0,
    summary_id                uuid REFERENCES ctx.summaries (summary_id),
    covered_to                bigint NOT NULL DEFAULT 0,
    baseline_user_turns       bigint NOT NULL DEFAULT 0,
    baseline_model_steps      bigint NOT NULL DEFAULT 0,
    baseline_watermark        bigint NOT NULL DEFAULT 0,
    evaluated_revision        bigint NOT NULL DEFAULT 0,
    pending_fingerprint       text,
    pending_since             timestamptz,
    throttle                  jsonb,
    deferred_reason           text,
    attempts                  bigint NOT NULL DEFAULT 0,
    failures                  bigint NOT NULL DEFAULT 0,
    last_failure              text,
    updated_at                timestamptz NOT NULL DEFAULT now()
);
