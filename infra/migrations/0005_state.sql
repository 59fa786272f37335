-- State: tool catalogs per release, facts with provenance and supersession, aggregate versions.

CREATE TABLE ctx.tool_catalogs (
    release     text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (release, revision)
);
ALTER TABLE ctx.sessions ADD COLUMN catalog_revision integer;

-- Tool effects need the call's arguments when its outcome is recorded in a later batch.
ALTER TABLE ctx.tool_calls ADD COLUMN args json;

CREATE TABLE ctx.state_facts (
    thread_id         text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    path              text NOT NULL,
    aggregate         text NOT NULL,
    seq               bigint NOT NULL,
    value             jsonb,
    status            text NOT NULL CHECK (status IN ('known', 'unknown', 'stale', 'conflicted')),
    source            text NOT NULL,
    event_key         text NOT NULL,
    observed_at       text,
    supersedes        text,
    superseded_value  jsonb,
    is_current        boolean NOT NULL,
    PRIMARY KEY (thread_id, path, seq)
);
CREATE INDEX state_facts_current ON ctx.state_facts (thread_id) WHERE is_current;

CREATE TABLE ctx.state_versions (
    thread_id  text NOT NULL,
    aggregate  text NOT NULL,
    version    bigint NOT NULL,
    PRIMARY KEY (thread_id, aggregate)
);

CREATE TABLE ctx.state_proposals (
    thread_id  text NOT NULL,
    seq        bigint NOT NULL,
    event_key  text NOT NULL,
    ops        jsonb NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
-- Provenance: the events that back a fact, and when it stopped being current.
ALTER TABLE ctx.state_facts ADD COLUMN evidence text[] NOT NULL DEFAULT '{}';
ALTER TABLE ctx.state_facts ADD COLUMN valid_to_seq bigint;
