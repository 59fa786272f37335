-- Counting per provider family. A profile without an offline tokenizer (Anthropic's) is
-- counted as the local o200k count times a factor learned from the provider's own figures: usage
-- reports and explicit context-length refusals. Kept per tenant and profile name, so one tenant's
-- usage reports (or a mistaken runtime's) never shrink another tenant's contexts.
CREATE TABLE ctx.calibrations (
    tenant     text             NOT NULL,
    profile    text             NOT NULL,
    factor     double precision NOT NULL DEFAULT 1.0 CHECK (factor >= 1.0),
    reports    integer          NOT NULL DEFAULT 0 CHECK (reports >= 0),
    updated_at timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, profile)
);

-- Provider overflows reported per view of a thread: the first one on a view recalibrates and forces a
-- compaction, a second one on the same view is refused (provider_context_exceeded) instead of looping.
CREATE TABLE ctx.provider_overflows (
    thread_id      text        NOT NULL,
    view_revision  integer     NOT NULL CHECK (view_revision >= 0),
    profile        text        NOT NULL,
    provider_limit integer,
    provider_count integer,
    our_estimate   integer     NOT NULL,
    reported_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, view_revision)
);
