-- The recorder plans an agent's next step on a thread from what it wrote there last, without reading
-- the ledger first (design D14.23). It then has not read its partition's position either,
-- which that read would bring: the position moves in the statement that writes the records, and this
-- guard, raised from inside that statement, makes the write fail unless the store holds the position
-- the recorder expects.
-- CX003: the store's position is behind what the recorder saw committed (commits were lost, D14.20);
-- CX004: the store's position is at or past the batch's first event (another writer applied it).
-- DETAIL: the position the statement saw.
CREATE FUNCTION ctx.require_position(held bigint, committed bigint, first_seq bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(held, 0) < committed THEN
    RAISE EXCEPTION USING ERRCODE = 'CX003', MESSAGE = 'the position is behind what was committed',
      DETAIL = coalesce(held, 0)::text;
  END IF;
  IF coalesce(held, 0) >= first_seq THEN
    RAISE EXCEPTION USING ERRCODE = 'CX004', MESSAGE = 'the batch is applied already',
      DETAIL = coalesce(held, 0)::text;
  END IF;
  RETURN true;
END
$$;
