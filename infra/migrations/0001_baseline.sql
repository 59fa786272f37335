-- The schema ctxfleet starts from. The project is unreleased, so its schema begins here rather than
-- at a history of edits: a database this file built is the only kind there is. From here on the
-- runner (services/store/migrate.py) is forward-only: a change is a new numbered file beside this
-- one (0002_…), never an edit of a file a database may already have applied.
--
-- The runner creates the schema ctx and its bookkeeping table ctx.schema_migrations itself, and
-- runs each file in one transaction under an advisory lock.
--
-- Sections, in dependency order:
--   1. Sessions and what they pin (tenant, policy, tool catalog, context hooks)
--   2. The ledger: thread heads, append-only records, blobs, tool calls, receipts
--   3. Runs and forks
--   4. The recorder's positions, stream identities and dead letters
--   5. The recorder's batch: one read and a guard raised from inside one write
--   6. Views and compaction: summaries, view state, windows
--   7. Counting per provider: calibrations and provider overflows
--   8. State: facts with provenance, aggregate versions, proposals
--   9. Search
--  10. The model gateway's checks
--
-- Column order inside a table is the order its columns came to be, which asyncpg rows and any
-- `SELECT *` see; a new column goes at the end.


------------------------------------------------------------------------------------------------------
-- 1. Sessions and what they pin
------------------------------------------------------------------------------------------------------

-- A session belongs to the tenant on the subject of its first event — an identity the NATS server
-- vouches for, never a payload field — and pins, at that first event, the policy revision, the
-- tool catalog revision and the agent release current then.
CREATE TABLE ctx.sessions (
    session_id        text PRIMARY KEY,
    last_seq          bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    policy_name       text NOT NULL DEFAULT 'default',
    policy_revision   integer NOT NULL DEFAULT 1,
    principal_id      text,
    agent_release     text,
    -- Records with session_seq <= reset_seq are outside the current context origin (still readable).
    reset_seq         bigint NOT NULL DEFAULT 0,
    catalog_revision  integer,
    tenant            text NOT NULL DEFAULT 'default'
);

-- Policies are registered per tenant; every registration is a new revision. Tenant '' is shared:
-- every tenant may name its policies, and a tenant's own registrations number on from them, so a
-- session's (name, revision) is unambiguous within its tenant.
CREATE TABLE ctx.policies (
    name        text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    tenant      text NOT NULL DEFAULT 'default',
    PRIMARY KEY (tenant, name, revision)
);
-- The built-in policy every tenant may use (services/store/memory.py seeds its twin).
INSERT INTO ctx.policies (tenant, name, revision, body)
VALUES ('', 'default', 1, '{"schema_version": 1, "name": "default"}');

-- Tool catalogs per tenant and agent release: two tenants may ship releases of the same name.
CREATE TABLE ctx.tool_catalogs (
    release     text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    tenant      text NOT NULL DEFAULT 'default',
    PRIMARY KEY (tenant, release, revision)
);

-- Context hooks per agent release: a session uses the revision current at its first event, like a
-- tool catalog.
CREATE TABLE ctx.context_hooks (
    tenant      text NOT NULL,
    release     text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    -- clock_timestamp, not now(): a registration's transaction may have begun before a session's.
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, release, revision)
);


------------------------------------------------------------------------------------------------------
-- 2. The ledger
------------------------------------------------------------------------------------------------------

-- One row per thread: its head (revision, last seq and hash), checked and moved with every batch.
CREATE TABLE ctx.thread_heads (
    thread_id         text PRIMARY KEY,
    session_id        text NOT NULL REFERENCES ctx.sessions (session_id),
    run_id            text NOT NULL,
    instance_id       text NOT NULL,
    revision          bigint NOT NULL CHECK (revision > 0),
    last_seq          bigint NOT NULL,
    last_hash         text NOT NULL,
    last_event_key    text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Counter totals, maintained by the recorder with the records they count.
    user_turns        bigint NOT NULL DEFAULT 0,
    model_steps       bigint NOT NULL DEFAULT 0,
    role              text NOT NULL DEFAULT 'main' CHECK (role IN ('main', 'child')),
    parent_thread_id  text
);
CREATE INDEX thread_heads_session ON ctx.thread_heads (session_id);

-- Large content, addressed by its hash and shared by every record that holds it.
CREATE TABLE ctx.blobs (
    sha256      text PRIMARY KEY,
    content     bytea NOT NULL,
    size        bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ctx.records (
    thread_id           text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    seq                 bigint NOT NULL CHECK (seq > 0),
    session_id          text NOT NULL,
    session_seq         bigint NOT NULL,
    run_id              text NOT NULL,
    instance_id         text NOT NULL,
    event_key           text NOT NULL,
    kind                text NOT NULL,
    -- json, not jsonb: tool-call arguments keep the key order the model wrote.
    payload             json NOT NULL,
    text                text,
    blob_sha256         text REFERENCES ctx.blobs (sha256),
    view_text           text,
    tokens_o200k        integer NOT NULL,
    -- The recorder counts o200k only; cl100k is counted by the first reader whose profile needs it.
    tokens_cl100k       integer,
    content_sha256      text NOT NULL,
    prev_hash           text NOT NULL,
    record_hash         text NOT NULL,
    client_ts           timestamptz,
    stream_seq          bigint NOT NULL,
    recorded_by         text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT now(),
    -- Old tool output masked down to a short preview when the hot path must shed tokens.
    mask_text           text,
    mask_tokens_o200k   integer,
    mask_tokens_cl100k  integer,
    PRIMARY KEY (thread_id, seq),
    CONSTRAINT records_event_key UNIQUE (thread_id, event_key),
    CONSTRAINT records_session_seq UNIQUE (session_id, session_seq),
    CONSTRAINT records_text_xor_blob CHECK ((text IS NULL) <> (blob_sha256 IS NULL))
);
-- Read-back checks that a blob belongs to a record of the asking session.
CREATE INDEX records_blob ON ctx.records (blob_sha256, session_id) WHERE blob_sha256 IS NOT NULL;

-- Append-only is enforced by the database, not by convention.
CREATE FUNCTION ctx.forbid_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ctx.records is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON ctx.records
    FOR EACH ROW EXECUTE FUNCTION ctx.forbid_record_change();

-- Each tool call and, once recorded, its outcome. The arguments are kept because a tool's effects
-- need them when its outcome arrives in a later batch.
CREATE TABLE ctx.tool_calls (
    thread_id    text NOT NULL,
    call_id      text NOT NULL,
    name         text NOT NULL,
    call_seq     bigint NOT NULL,
    outcome_seq  bigint,
    status       text,
    args         json,
    PRIMARY KEY (thread_id, call_id)
);
CREATE INDEX tool_calls_open ON ctx.tool_calls (thread_id) WHERE outcome_seq IS NULL;

-- Receipts of side-effecting tool calls: one per operation id, in its session. A receipt left
-- unknown is settled only by an explicit reconciliation, recorded with its event.
CREATE TABLE ctx.receipts (
    session_id        text NOT NULL,
    operation_id      text NOT NULL,
    thread_id         text NOT NULL,
    call_id           text NOT NULL,
    tool              text NOT NULL,
    request_sha256    text NOT NULL,
    status            text NOT NULL CHECK (status IN ('requested', 'success', 'failed', 'timeout', 'unknown')),
    requested_event   text NOT NULL,
    finished_event    text,
    response_sha256   text,
    external_ref      text,
    reconciled_event  text,
    PRIMARY KEY (session_id, operation_id)
);
CREATE UNIQUE INDEX receipts_call ON ctx.receipts (thread_id, call_id);


------------------------------------------------------------------------------------------------------
-- 3. Runs and forks
------------------------------------------------------------------------------------------------------

CREATE TABLE ctx.runs (
    run_id            text PRIMARY KEY,
    session_id        text NOT NULL REFERENCES ctx.sessions (session_id),
    status            text NOT NULL CHECK (status IN ('active', 'completed', 'failed', 'cancelled', 'interrupted')),
    main_thread_id    text NOT NULL,
    -- The immutable session history snapshot this run inherits: every record up to this session seq.
    snapshot_through  bigint NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- The TaskBudget the run's first event declared, kept so a restart or another assembler
    -- applies the same one. NULL: the run declared none (a prepare may still bring one).
    task_budget       jsonb
);
-- One active run per session, enforced by the database.
CREATE UNIQUE INDEX runs_one_active ON ctx.runs (session_id) WHERE status = 'active';

-- A fork is a session whose history is another session's up to a session seq, by reference. The
-- fork's own records number on from at_seq (its sessions row starts with last_seq = at_seq), so
-- parent and fork records never share a seq and a view merges them in seq order. Nothing points
-- from the parent to the fork: the parent cannot change.
CREATE TABLE ctx.session_forks (
    session_id         text PRIMARY KEY REFERENCES ctx.sessions (session_id),
    parent_session_id  text NOT NULL REFERENCES ctx.sessions (session_id),
    at_seq             bigint NOT NULL CHECK (at_seq > 0),
    -- The context origin of the history at at_seq (the newest reset at or before it), which the
    -- fork's sessions.reset_seq starts from; kept here so a fork of this fork can find it again.
    inherited_reset    bigint NOT NULL DEFAULT 0 CHECK (inherited_reset >= 0 AND inherited_reset <= at_seq),
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX session_forks_parent ON ctx.session_forks (parent_session_id);


------------------------------------------------------------------------------------------------------
-- 4. Positions, stream identities and dead letters
------------------------------------------------------------------------------------------------------

-- Each consumer's position per partition, moved in the same transaction as the effects it covers:
-- that is what makes a redelivered event a no-op.
CREATE TABLE ctx.tracking (
    consumer         text NOT NULL,
    partition        integer NOT NULL,
    last_stream_seq  bigint NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, partition)
);

-- Which events stream the positions in ctx.tracking are sequences of. A stream that is lost and
-- re-created (its JetStream store deleted) restarts its sequences, so a position only means
-- something together with the identity of the stream it was read from: JetStream's creation time.
-- The recorder records it on first start and halts when it changes; 'ctxfleet rebaseline' moves it.
CREATE TABLE ctx.stream_baselines (
    stream      text PRIMARY KEY,
    created     timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Events the recorder refused, with their raw bytes (possibly truncated), once per delivery.
CREATE TABLE ctx.dead_letters (
    id               bigserial PRIMARY KEY,
    thread_id        text,
    event_key        text,
    code             text NOT NULL,
    reason           text NOT NULL,
    details          jsonb NOT NULL,
    subject          text NOT NULL,
    stream_seq       bigint NOT NULL,
    raw_sha256       text NOT NULL,
    raw_size         bigint NOT NULL,
    raw              bytea NOT NULL,
    raw_truncated    boolean NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- A prepare waiting for an event learns of its rejection only when it was its own tenant's.
    tenant           text NOT NULL DEFAULT 'default',
    -- An event published on one thread's subject whose body names another is filed under the
    -- subject's thread; the runtime may be waiting on the body's thread, kept here, so a prepare on
    -- either thread naming the key hears event_rejected at once. Only such rows have one.
    named_thread_id  text,
    CONSTRAINT dead_letters_once UNIQUE (stream_seq, raw_sha256)
);
CREATE INDEX dead_letters_event ON ctx.dead_letters (thread_id, event_key);
CREATE INDEX dead_letters_named_event ON ctx.dead_letters (named_thread_id, event_key)
WHERE named_thread_id IS NOT NULL;


------------------------------------------------------------------------------------------------------
-- 5. The recorder's batch
------------------------------------------------------------------------------------------------------

-- Every read a batch needs, as a function whose statement is planned once per connection. As a
-- prepared statement PostgreSQL planned its dozen sub-selects again on every call (most of the
-- server time of a read-your-writes step), because their estimates over parameter arrays never made
-- the generic plan look cheaper. Here `plan_cache_mode = force_generic_plan` holds for this
-- function's statement alone.
--
-- A generic plan is made from the table sizes of its moment, and a fresh database starts empty: so
-- every lookup by key is a LATERAL sub-select on the key's unique index (OFFSET 0: one the planner
-- cannot flatten into a join), which can only be a nested loop over the parameter's keys, never a
-- hash join over a scan of the whole ledger. services/store/batches.py reads its columns.
CREATE FUNCTION ctx.batch_reads(
  threads text[], key_threads text[], key_names text[], call_threads text[], call_ids text[],
  session_ids text[], tenants text[], run_ids text[], state_threads text[], op_sessions text[],
  op_ids text[], release_tenants text[], release_names text[], consumer_name text, partition_no integer
)
RETURNS TABLE (
  heads json, keys json, calls json, sessions json, policies json, runs json, facts json,
  versions json, catalogs json, operations json, latest json, tracked bigint
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT
    (SELECT coalesce(json_agg(json_build_array(
         h.thread_id, h.session_id, h.revision, h.last_seq, h.last_hash, h.last_event_key, h.role,
         h.parent_thread_id)), '[]')
     FROM unnest(threads) AS k(thread_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.thread_heads t WHERE t.thread_id = k.thread_id OFFSET 0) h),
    (SELECT coalesce(json_agg(json_build_array(r.thread_id, r.event_key, r.seq, r.content_sha256)), '[]')
     FROM unnest(key_threads, key_names) AS k(thread_id, event_key)
     CROSS JOIN LATERAL (
       SELECT x.thread_id, x.event_key, x.seq, x.content_sha256 FROM ctx.records x
       WHERE x.thread_id = k.thread_id AND x.event_key = k.event_key OFFSET 0) r),
    (SELECT coalesce(json_agg(json_build_array(
         c.thread_id, c.call_id, c.call_seq, c.outcome_seq, c.name, c.args::text)), '[]')
     FROM unnest(call_threads, call_ids) AS k(thread_id, call_id)
     CROSS JOIN LATERAL (
       SELECT * FROM ctx.tool_calls x WHERE x.thread_id = k.thread_id AND x.call_id = k.call_id OFFSET 0) c),
    (SELECT coalesce(json_agg(json_build_array(s.session_id, s.tenant, s.principal_id, s.agent_release)), '[]')
     FROM unnest(session_ids) AS k(session_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.sessions x WHERE x.session_id = k.session_id OFFSET 0) s),
    (SELECT coalesce(json_agg(json_build_array(p.tenant, p.name)), '[]') FROM (
       SELECT DISTINCT x.tenant, x.name FROM ctx.policies x
       WHERE x.tenant = ANY(tenants) OR x.tenant = '') p),
    (SELECT coalesce(json_agg(json_build_array(r.run_id, r.session_id, r.status, r.main_thread_id)), '[]')
     FROM ctx.runs r
     WHERE r.run_id = ANY(run_ids) OR (r.session_id = ANY(session_ids) AND r.status = 'active')),
    (SELECT json_agg(json_build_array(
         f.thread_id, f.path, f.value::text, f.status, f.source, f.event_key, f.seq, f.observed_at,
         f.supersedes, f.superseded_value::text, f.evidence))
     FROM ctx.state_facts f WHERE f.thread_id = ANY(state_threads) AND f.is_current),
    (SELECT json_agg(json_build_array(v.thread_id, v.aggregate, v.version))
     FROM ctx.state_versions v WHERE v.thread_id = ANY(state_threads)),
    (SELECT coalesce(json_agg(json_build_array(s.session_id, c.revision, c.body::text)), '[]')
     FROM unnest(session_ids) AS k(session_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.sessions x WHERE x.session_id = k.session_id OFFSET 0) s
     CROSS JOIN LATERAL (
       SELECT x.revision, x.body FROM ctx.tool_catalogs x
       WHERE x.tenant = s.tenant AND x.release = s.agent_release AND x.revision = s.catalog_revision OFFSET 0) c),
    (SELECT coalesce(json_agg(json_build_array(o.session_id, o.operation_id)), '[]')
     FROM unnest(op_sessions, op_ids) AS k(session_id, operation_id)
     CROSS JOIN LATERAL (
       SELECT x.session_id, x.operation_id FROM ctx.receipts x
       WHERE x.session_id = k.session_id AND x.operation_id = k.operation_id OFFSET 0) o),
    (SELECT coalesce(json_agg(json_build_array(l.tenant, l.release, l.revision, l.body)), '[]') FROM (
       SELECT DISTINCT ON (k.tenant, k.release) k.tenant, k.release, c.revision, c.body::text AS body
       FROM unnest(release_tenants, release_names) AS k(tenant, release)
       CROSS JOIN LATERAL (
         SELECT x.revision, x.body FROM ctx.tool_catalogs x
         WHERE x.tenant = k.tenant AND x.release = k.release ORDER BY x.revision DESC LIMIT 1) c
       ORDER BY k.tenant, k.release) l),
    (SELECT t.last_stream_seq FROM ctx.tracking t
     WHERE t.consumer = consumer_name AND t.partition = partition_no);
END
$$;

-- The batch's write commits by itself when it is one statement: no BEGIN and COMMIT round trips
-- around it. A thread whose head another writer moved first, or an outcome whose call another
-- writer closed, must then fail that statement, so nothing of it stays (the session numbers it
-- took, the position it moved): this guard raises from inside the statement.
-- CX001: the head of thread MESSAGE was not written (DETAIL: its revision as the statement saw it);
-- CX002: fewer calls were closed than the batch has outcomes for.
CREATE FUNCTION ctx.require_written(lost_thread text, lost_revision bigint, closed bigint, to_close bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF lost_thread IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = lost_thread,
      DETAIL = coalesce(lost_revision::text, '');
  END IF;
  IF closed <> to_close THEN
    RAISE EXCEPTION USING ERRCODE = 'CX002', MESSAGE = 'a call the batch closes was closed already';
  END IF;
  RETURN true;
END
$$;


------------------------------------------------------------------------------------------------------
-- 6. Views and compaction
------------------------------------------------------------------------------------------------------

-- Views are versioned, summaries chain, and the records a summary covers stay in the ledger.
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
    -- The context hooks that shaped the summary: each compact.before hook that ended its range
    -- earlier or lowered its target, and each compact.after hook that patched it, with the
    -- binding's source and subject and the hook-set revision the session pinned. '[]': none did.
    hooks               jsonb NOT NULL DEFAULT '[]'::jsonb,
    CONSTRAINT summaries_revision UNIQUE (thread_id, view_revision),
    CHECK (covered_from <= covered_to)
);

-- The compaction state of a thread's view, moved by compare-and-set on view_revision.
CREATE TABLE ctx.thread_views (
    thread_id             text PRIMARY KEY REFERENCES ctx.thread_heads (thread_id),
    view_revision         bigint NOT NULL DEFAULT 0,
    summary_id            uuid REFERENCES ctx.summaries (summary_id),
    covered_to            bigint NOT NULL DEFAULT 0,
    baseline_user_turns   bigint NOT NULL DEFAULT 0,
    baseline_model_steps  bigint NOT NULL DEFAULT 0,
    baseline_watermark    bigint NOT NULL DEFAULT 0,
    evaluated_revision    bigint NOT NULL DEFAULT 0,
    pending_fingerprint   text,
    pending_since         timestamptz,
    throttle              jsonb,
    deferred_reason       text,
    attempts              bigint NOT NULL DEFAULT 0,
    failures              bigint NOT NULL DEFAULT 0,
    last_failure          text,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- The budget the thread is actually prepared at. A runtime may ask under a smaller budget than
    -- its policy names (a smaller model, a cap per request): once a prepare had to wait for an
    -- urgent compaction under such a budget, the budgeter compacts ahead of it at that budget, so
    -- later steps find a view that fits instead of each waiting on the hot path again.
    prepare_budget        integer CHECK (prepare_budget > 0),
    prepare_reserved      integer NOT NULL DEFAULT 0 CHECK (prepare_reserved >= 0)
);

-- A thread's context runs in numbered windows; window 1 is implicit (no row). A rollover commits
-- the closing window's handoff and the next window's row in one transaction with a view-revision
-- compare-and-set, so a crash while a window closes leaves exactly one of the two windows, the
-- handoff fully written or absent. Records are never rewritten: a record's window follows from the
-- seqs the windows opened after.
CREATE TABLE ctx.window_handoffs (
    handoff_id       uuid PRIMARY KEY,
    thread_id        text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    previous_window  integer NOT NULL CHECK (previous_window >= 1),
    new_window       integer NOT NULL CHECK (new_window = previous_window + 1),
    trigger          text NOT NULL,
    body             jsonb NOT NULL,
    tokens           integer NOT NULL CHECK (tokens >= 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (thread_id, new_window)
);

CREATE TABLE ctx.windows (
    thread_id     text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    window_no     integer NOT NULL CHECK (window_no >= 2),
    -- Session seq of the last record of the previous window: this one shows only what follows.
    opened_after  bigint NOT NULL CHECK (opened_after >= 0),
    handoff_id    uuid NOT NULL UNIQUE REFERENCES ctx.window_handoffs (handoff_id),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, window_no)
);


------------------------------------------------------------------------------------------------------
-- 7. Counting per provider
------------------------------------------------------------------------------------------------------

-- A profile without an offline tokenizer (Anthropic's) is counted as the local o200k count times a
-- factor learned from the provider's own figures: usage reports and explicit context-length
-- refusals. Kept per tenant and profile, so one tenant's usage reports (or a mistaken runtime's)
-- never shrink another tenant's contexts.
CREATE TABLE ctx.calibrations (
    tenant      text             NOT NULL,
    profile     text             NOT NULL,
    factor      double precision NOT NULL DEFAULT 1.0 CHECK (factor >= 1.0),
    reports     integer          NOT NULL DEFAULT 0 CHECK (reports >= 0),
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, profile)
);

-- Provider overflows per view of a thread: the first one on a view recalibrates and forces a
-- compaction, a second one on the same view is refused (provider_context_exceeded) instead of looping.
CREATE TABLE ctx.provider_overflows (
    thread_id       text        NOT NULL,
    view_revision   integer     NOT NULL CHECK (view_revision >= 0),
    profile         text        NOT NULL,
    provider_limit  integer,
    provider_count  integer,
    our_estimate    integer     NOT NULL,
    reported_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, view_revision)
);


------------------------------------------------------------------------------------------------------
-- 8. State
------------------------------------------------------------------------------------------------------

-- Facts with provenance and supersession: a fact stops being current, it is never overwritten.
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
    -- The events that back the fact, and the seq at which it stopped being current.
    evidence          text[] NOT NULL DEFAULT '{}',
    valid_to_seq      bigint,
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


------------------------------------------------------------------------------------------------------
-- 9. Search
------------------------------------------------------------------------------------------------------

-- The indexer's full-text index: record text in chunks with byte and line offsets. Queries use the
-- 'simple' configuration, which keeps identifiers, paths, error codes and UUIDs as whole tokens.
CREATE TABLE ctx.search_chunks (
    thread_id    text NOT NULL,
    seq          bigint NOT NULL,
    chunk        integer NOT NULL,
    session_id   text NOT NULL,
    kind         text NOT NULL,
    event_key    text NOT NULL,
    start_byte   bigint NOT NULL,
    end_byte     bigint NOT NULL,
    start_line   integer NOT NULL,
    end_line     integer NOT NULL,
    recorded_at  timestamptz NOT NULL,
    text         text NOT NULL,
    tsv          tsvector NOT NULL,
    PRIMARY KEY (thread_id, seq, chunk)
);
CREATE INDEX search_chunks_tsv ON ctx.search_chunks USING gin (tsv);
CREATE INDEX search_chunks_session ON ctx.search_chunks (session_id);

CREATE TABLE ctx.index_positions (
    thread_id      text PRIMARY KEY,
    last_seq       bigint NOT NULL,
    index_version  integer NOT NULL
);


------------------------------------------------------------------------------------------------------
-- 10. The model gateway's checks
------------------------------------------------------------------------------------------------------

-- What a check needs of each prepared context — its protected block manifest, unit digests and
-- budget figures, never its content — written behind the prepare's reply, keyed by prepared id and
-- format (one id serves every provider shape).
CREATE TABLE ctx.prepared_contexts (
    prepared_id  text        NOT NULL,
    format       text        NOT NULL,
    tenant       text        NOT NULL,
    thread_id    text        NOT NULL,
    record       jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prepared_id, format)
);

-- What the model was actually sent: one row per check attempt.
CREATE TABLE ctx.gateway_checks (
    prepared_id       text        NOT NULL,
    attempt           integer     NOT NULL CHECK (attempt >= 1),
    tenant            text        NOT NULL,
    thread_id         text        NOT NULL,
    format            text        NOT NULL,
    outcome           text        NOT NULL CHECK (outcome IN ('ok', 'context_reprepare_required')),
    final_tokens      integer     NOT NULL,
    input_budget      integer     NOT NULL,
    soft_limit        integer,
    request_sha256    text        NOT NULL,
    addition_sources  text[]      NOT NULL,
    -- The validated additions (source, category, text): a re-prepare carries them by check id.
    additions         jsonb       NOT NULL,
    checked_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prepared_id, attempt)
);
