-- The recorder counts o200k only; a record's cl100k count is made by the first reader whose profile
-- needs it. NULL means "not counted at recording"; records written before keep theirs.
ALTER TABLE ctx.records ALTER COLUMN tokens_cl100k DROP NOT NULL;
