-- The context hooks that shaped a committed summary: each compact.before hook that ended
-- its range earlier or lowered its target, and each compact.after hook that patched it, with the
-- binding's source and subject and the hook-set revision the session pinned. '[]': none did.
ALTER TABLE ctx.summaries ADD COLUMN hooks jsonb NOT NULL DEFAULT '[]'::jsonb;
