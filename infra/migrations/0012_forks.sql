-- Session forks (seed 003 §10): a session whose history is another session's up to a
-- session seq, by reference. The fork's own records number on from at_seq (its sessions row starts
-- with last_seq = at_seq), so parent and fork records never share a seq and a view merges them in
-- seq order. Nothing here or anywhere points from the parent to the fork: the parent cannot change.
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
