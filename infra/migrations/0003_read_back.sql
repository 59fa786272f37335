-- Read-back checks that a blob belongs to a record of the asking session.
CREATE INDEX records_blob ON ctx.records (blob_sha256, session_id) WHERE blob_sha256 IS NOT NULL;
