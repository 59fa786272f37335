-- The recorder's batch write commits by itself when it is one statement: no BEGIN and
-- COMMIT round trips around it. A thread whose head another writer moved first, or an outcome whose
-- call another writer closed, must then fail that statement, so nothing of it stays (the session
-- numbers it took, the position it moved): this guard raises from inside the statement.
-- CX001: the head of thread MESSAGE was not written (DETAIL: its revision as the statement saw it);
-- CX002: fewer calls were closed than the batch has outcomes for.
CREATE FUNCTION ctx.require_written(lost_thread text, lost_revision bigint, closed bigint, to_close bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF lost_thread IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = lost_thread,
      DETAIL = coalesce(lost_revision::text, '');
  END IF;
  IF closed <> to_close THEN
    RAISE EXCEPTION USING ERRCODE = 'CX002', MESSAGE = 'a call the batch closes was closed already';
  END IF;
  RETURN true;
END
$$;
