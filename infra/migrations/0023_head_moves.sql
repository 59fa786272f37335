-- A thread's head moving is announced with the revision it moved to (design D14.21):
-- 'h:<revision>:<thread_id>' instead of 't:<thread_id>'. A process whose recorder committed the move
-- has extended the view it holds to that head already; told only "the thread changed", it would drop
-- that view before the prepare waiting for the event could be answered from it. A view at an older
-- head stops being trusted as before. A head that is deleted still says 't:' (nothing holds it after).

CREATE FUNCTION ctx.head_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ctx_view_changes', 'h:' || c.revision || ':' || c.thread_id)
  FROM (SELECT DISTINCT thread_id, revision FROM changed) c;
  RETURN NULL;
END
$$;

DROP TRIGGER view_changes_ins ON ctx.thread_heads;
DROP TRIGGER view_changes_upd ON ctx.thread_heads;
CREATE TRIGGER view_changes_ins AFTER INSERT ON ctx.thread_heads REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ctx.head_moved();
CREATE TRIGGER view_changes_upd AFTER UPDATE ON ctx.thread_heads REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ctx.head_moved();
