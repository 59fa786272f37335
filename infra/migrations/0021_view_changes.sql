-- Every commit that changes what a thread's view is made of says so on one channel (design
-- D14.17): an assembler listening there may answer a prepare that names no event from the
-- view it loaded last, without reading the ledger again, for as long as no notice of its thread, its
-- session or its run has arrived. The notices come from triggers rather than from each writer, so a
-- writer added later cannot forget one; tests/integration/test_view_changes.py checks that every table
-- a view load reads either has them or is immutable.
--
-- Payloads: 't:<thread_id>', 's:<session_id>', 'r:<run_id>', and '*' after a TRUNCATE. PostgreSQL
-- sends them at commit only (never for a rolled-back write), one per distinct payload per transaction.
-- Statement-level triggers with a transition table: a batch is one notice per thread it moves,
-- not one per row.

-- TG_ARGV[0] names the key. PL/pgSQL plans a statement when it first runs, once per table a trigger
-- is on, so each table only ever plans the branch of its own key.
CREATE FUNCTION ctx.view_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  CASE TG_ARGV[0]
    WHEN 't' THEN
      PERFORM pg_notify('ctx_view_changes', 't:' || c.thread_id) FROM (SELECT DISTINCT thread_id FROM changed) c;
    WHEN 's' THEN
      PERFORM pg_notify('ctx_view_changes', 's:' || c.session_id) FROM (SELECT DISTINCT session_id FROM changed) c;
    WHEN 'r' THEN
      PERFORM pg_notify('ctx_view_changes', 'r:' || c.run_id) FROM (SELECT DISTINCT run_id FROM changed) c;
  END CASE;
  RETURN NULL;
END
$$;

-- A TRUNCATE names no rows: everything may have changed ('*', which no listener can attribute).
CREATE FUNCTION ctx.view_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ctx_view_changes', '*');
  RETURN NULL;
END
$$;

-- A session row is bumped by every batch of its events (``last_seq``, the session numbers taken):
-- that says nothing a view reads, and a notice of the session ends the trust in all its threads. So
-- a row trigger, announcing the rows in which anything else changed.
CREATE FUNCTION ctx.view_changed_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ctx_view_changes', 's:' || COALESCE(NEW.session_id, OLD.session_id));
  RETURN NULL;
END
$$;

CREATE TRIGGER view_changes_row AFTER INSERT OR DELETE ON ctx.sessions
FOR EACH ROW EXECUTE FUNCTION ctx.view_changed_session();
CREATE TRIGGER view_changes_row_upd AFTER UPDATE ON ctx.sessions
FOR EACH ROW WHEN ((to_jsonb(OLD) - 'last_seq') IS DISTINCT FROM (to_jsonb(NEW) - 'last_seq'))
EXECUTE FUNCTION ctx.view_changed_session();
CREATE TRIGGER view_changes_trunc AFTER TRUNCATE ON ctx.sessions
FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_truncated();

-- Not announced, because a view reads them only as of its head, which every write of them moves in
-- the same transaction: records (up to the head's last_seq; beyond it, a row is not yet in any
-- view) and the state facts and versions (by head revision, as the loader's facts cache already
-- holds them). Their triggers cost a copy of every recorded row on the recorder's path.
-- A transition table may serve one event only: three triggers per table, and one for TRUNCATE.
DO $$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM (VALUES
      ('thread_heads', 't'), ('thread_views', 't'), ('summaries', 't'), ('windows', 't'),
      ('window_handoffs', 't'), ('session_forks', 's'), ('runs', 'r')) AS v(tbl, keyed)
  LOOP
    EXECUTE format(
      'CREATE TRIGGER view_changes_ins AFTER INSERT ON ctx.%I REFERENCING NEW TABLE AS changed '
      'FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_changed(%L)', t.tbl, t.keyed);
    EXECUTE format(
      'CREATE TRIGGER view_changes_upd AFTER UPDATE ON ctx.%I REFERENCING NEW TABLE AS changed '
      'FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_changed(%L)', t.tbl, t.keyed);
    EXECUTE format(
      'CREATE TRIGGER view_changes_del AFTER DELETE ON ctx.%I REFERENCING OLD TABLE AS changed '
      'FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_changed(%L)', t.tbl, t.keyed);
    EXECUTE format(
      'CREATE TRIGGER view_changes_trunc AFTER TRUNCATE ON ctx.%I '
      'FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_truncated()', t.tbl);
  END LOOP;
END
$$;
