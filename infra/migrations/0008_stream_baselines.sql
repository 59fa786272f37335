-- Which events stream the recorder's positions in ctx.tracking are sequences of. A stream that is
-- lost and re-created (its JetStream store deleted) restarts its sequences, so a position only means
-- something together with the identity of the stream it was read from: JetStream's creation time.
-- The recorder records it on first start and halts when it changes; 'ctxfleet rebaseline' moves it.
CREATE TABLE ctx.stream_baselines (
    stream      text PRIMARY KEY,
    created     timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
