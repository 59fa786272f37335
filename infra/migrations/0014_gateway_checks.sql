-- The model gateway's final check. What a check needs of each prepared context — its
-- protected block manifest, unit digests and budget figures, never its content — written behind the
-- prepare's reply, keyed by prepared id and format (one id serves every provider shape). And what the
-- model was actually sent (design D5.8): one row per check attempt.
CREATE TABLE ctx.prepared_contexts (
    prepared_id text        NOT NULL,
    format      text        NOT NULL,
    tenant      text        NOT NULL,
    thread_id   text        NOT NULL,
    record      jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prepared_id, format)
);

CREATE TABLE ctx.gateway_checks (
    prepared_id      text        NOT NULL,
    attempt          integer     NOT NULL CHECK (attempt >= 1),
    tenant           text        NOT NULL,
    thread_id        text        NOT NULL,
    format           text        NOT NULL,
    outcome          text        NOT NULL CHECK (outcome IN ('ok', 'context_reprepare_required')),
    final_tokens     integer     NOT NULL,
    input_budget     integer     NOT NULL,
    soft_limit       integer,
    request_sha256   text        NOT NULL,
    addition_sources text[]      NOT NULL,
    -- The validated additions (source, category, text): a re-prepare carries them by check id.
    additions        jsonb       NOT NULL,
    checked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prepared_id, attempt)
);
