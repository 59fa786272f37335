-- The indexer's full-text index: record text in chunks with byte and line offsets. The 'simple'
-- configuration keeps identifiers, paths, error codes and UUIDs as whole tokens (no stemming).
CREATE TABLE ctx.search_chunks (
    thread_id   text NOT NULL,
    seq         bigint NOT NULL,
    chunk       integer NOT NULL,
    session_id  text NOT NULL,
    kind        text NOT NULL,
    event_key   text NOT NULL,
    start_byte  bigint NOT NULL,
    end_byte    bigint NOT NULL,
    start_line  integer NOT NULL,
    end_line    integer NOT NULL,
    recorded_at timestamptz NOT NULL,
    text        text NOT NULL,
    tsv         tsvector NOT NULL,
    PRIMARY KEY (thread_id, seq, chunk)
);
CREATE INDEX search_chunks_tsv ON ctx.search_chunks USING gin (tsv);
CREATE INDEX search_chunks_session ON ctx.search_chunks (session_id);

CREATE TABLE ctx.index_positions (
    thread_id      text PRIMARY KEY,
    last_seq       bigint NOT NULL,
    index_version  integer NOT NULL
);
