-- Receipts of side-effecting tool calls (seed 004 §19–20): one per operation id, in its session.
CREATE TABLE ctx.receipts (
    session_id       text NOT NULL,
    operation_id     text NOT NULL,
    thread_id        text NOT NULL,
    call_id          text NOT NULL,
    tool             text NOT NULL,
    request_sha256   text NOT NULL,
    status           text NOT NULL CHECK (status IN ('requested', 'success', 'failed', 'timeout', 'unknown')),
    requested_event  text NOT NULL,
    finished_event   text,
    response_sha256  text,
    external_ref     text,
    PRIMARY KEY (session_id, operation_id)
);
CREATE UNIQUE INDEX receipts_call ON ctx.receipts (thread_id, call_id);
-- A receipt left unknown is settled only by an explicit reconciliation, recorded with its event.
ALTER TABLE ctx.receipts ADD COLUMN reconciled_event text;
