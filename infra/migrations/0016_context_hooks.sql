-- Context hooks per agent release: every registration is a new revision; a session uses
-- the revision current when it was created (its first event), like a tool catalog.
CREATE TABLE ctx.context_hooks (
    tenant      text NOT NULL,
    release     text NOT NULL,
    revision    integer NOT NULL CHECK (revision > 0),
    body        jsonb NOT NULL,
    -- clock_timestamp, not now(): a registration's transaction may have begun before a session's.
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, release, revision)
);
