-- Windows (seed 004 §22–24): a thread's context runs in numbered windows; window 1 is
-- implicit (no row). A rollover commits the closing window's handoff and the next window's row in one
-- transaction with a view-revision compare-and-set, so a crash while a window closes (K9) leaves
-- exactly one of the two windows, the handoff fully written or absent. Records are never rewritten:
-- a record's window follows from the seqs the windows opened after.
CREATE TABLE ctx.window_handoffs (
    handoff_id      uuid PRIMARY KEY,
    thread_id       text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    previous_window integer NOT NULL CHECK (previous_window >= 1),
    new_window      integer NOT NULL CHECK (new_window = previous_window + 1),
    trigger         text NOT NULL,
    body            jsonb NOT NULL,
    tokens          integer NOT NULL CHECK (tokens >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (thread_id, new_window)
);

CREATE TABLE ctx.windows (
    thread_id    text NOT NULL REFERENCES ctx.thread_heads (thread_id),
    window_no    integer NOT NULL CHECK (window_no >= 2),
    -- Session seq of the last record of the previous window: this one shows only what follows.
    opened_after bigint NOT NULL CHECK (opened_after >= 0),
    handoff_id   uuid NOT NULL UNIQUE REFERENCES ctx.window_handoffs (handoff_id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, window_no)
);
