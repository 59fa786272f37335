-- The ledger: sessions, thread heads, append-only records, content-addressed blobs,
-- tool-call states, dead letters and consumer positions. Forward-only; never edit once released.

CREATE TABLE ctx.sessions (
    session_id  text PRIMARY KEY,
    last_seq    bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ctx.thread_heads (
    thread_id       text PRIMARY KEY,
    session_id      text NOT NULL REFERENCES ctx.sessions (session_id),
    run_id          text NOT NULL,
    instance_id     text NOT NULL,
    revision        bigint NOT NULL CHECK (revision > 0),
    last_seq        bigint NOT NULL,
    last_hash       text NOT NULL,
    last_event_key  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX thread_heads_session ON ctx.thread_heads (session_id);

CREATE TABLE ctx.blobs (
    sha256      text PRIMARY KEY,
    content     bytea NOT NULL,
    size        bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ctx.records (
    thread_id       text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    seq             bigint NOT NULL CHECK (seq > 0),
    session_id      text NOT NULL,
    session_seq     bigint NOT NULL,
    run_id          text NOT NULL,
    instance_id     text NOT NULL,
    event_key       text NOT NULL,
    kind            text NOT NULL,
    -- json, not jsonb: tool-call arguments keep the key order the model wrote.
    payload         json NOT NULL,
    text            text,
    blob_sha256     text REFERENCES ctx.blobs (sha256),
    view_text       text,
    tokens_o200k    integer NOT NULL,
    tokens_cl100k   integer NOT NULL,
    content_sha256  text NOT NULL,
    prev_hash       text NOT NULL,
    record_hash     text NOT NULL,
    client_ts       timestamptz,
    stream_seq      bigint NOT NULL,
    recorded_by     text NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, seq),
    CONSTRAINT records_event_key UNIQUE (thread_id, event_key),
    CONSTRAINT records_session_seq UNIQUE (session_id, session_seq),
    CONSTRAINT records_text_xor_blob CHECK ((text IS NULL) <> (blob_sha256 IS NULL))
);

-- Append-only is enforced by the database, not by convention.
CREATE FUNCTION ctx.forbid_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ctx.records is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON ctx.records
    FOR EACH ROW EXECUTE FUNCTION ctx.forbid_record_change();

CREATE TABLE ctx.tool_calls (
    thread_id    text NOT NULL,
    call_id      text NOT NULL,
    name         text NOT NULL,
    call_seq     bigint NOT NULL,
    outcome_seq  bigint,
    status       text,
    PRIMARY KEY (thread_id, call_id)
);
CREATE INDEX tool_calls_open ON ctx.tool_calls (thread_id) WHERE outcome_seq IS NULL;

CREATE TABLE ctx.dead_letters (
    id             bigserial PRIMARY KEY,
    thread_id      text,
    event_key      text,
    code           text NOT NULL,
    reason         text NOT NULL,
    details        jsonb NOT NULL,
    subject        text NOT NULL,
    stream_seq     bigint NOT NULL,
    raw_sha256     text NOT NULL,
    raw_size       bigint NOT NULL,
    raw            bytea NOT NULL,
    raw_truncated  boolean NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_once UNIQUE (stream_seq, raw_sha256)
);
CREATE INDEX dead_letters_event ON ctx.dead_letters (thread_id, event_key);

CREATE TABLE ctx.tracking (
    consumer         text NOT NULL,
    partition        integer NOT NULL,
    last_stream_seq  bigint NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, partition)
);
