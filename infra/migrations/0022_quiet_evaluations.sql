-- The budgeter marks every thread it measured as evaluated (``evaluated_revision``), one commit per
-- recorded batch, and migration 0021's statement trigger announced each of those commits as a change
-- of the thread's view (design D14.17). No view depends on that column: only the
-- budgeter's own scan for threads left to evaluate reads it. So every step of an agent sent two
-- notices, the recorder's and the budgeter's, and woke every listening assembler twice. The second
-- one ended no trust that the first had not ended already.
--
-- thread_views updates are announced by a row trigger instead, for rows in which a column other
-- than ``evaluated_revision`` and ``updated_at`` changed (the second is a timestamp no view reads).
-- A column added later is announced unless it is named here. An update touches one thread's row
-- (a session reset: its few threads' rows), so a row trigger costs no more than the statement
-- trigger did, and one that changes nothing else now costs no notice at all.
-- Inserts, deletes and TRUNCATE keep 0021's triggers.

CREATE FUNCTION ctx.view_changed_thread() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ctx_view_changes', 't:' || NEW.thread_id);
  RETURN NULL;
END
$$;

DROP TRIGGER view_changes_upd ON ctx.thread_views;

CREATE TRIGGER view_changes_row_upd AFTER UPDATE ON ctx.thread_views
FOR EACH ROW
WHEN ((to_jsonb(OLD) - 'evaluated_revision' - 'updated_at')
      IS DISTINCT FROM (to_jsonb(NEW) - 'evaluated_revision' - 'updated_at'))
EXECUTE FUNCTION ctx.view_changed_thread();
