-- Every commit that changes what a thread's view is made of says so on one channel (issue 16,
-- design D14.17): an assembler listening there may answer a prepare that names no event from the
-- view it loaded last, without reading the ledger again, for as long as no notice of its thread, its
-- session or its run has arrived. The notices come from triggers rather than from each writer, so a
-- writer added later cannot forget one; tests/integration/test_view_changes.py checks that every table
-- a view load reads either has them or is immutable.
--
-- Payloads: 't:<thread_id>', 's:<session_id>', 'r:<run_id>'. PostgreSQL sends them at commit only
-- (never for a rolled-back write), and one per distinct payload per transaction.
-- Statement-level triggers with a transition table: a batch of records is one notice per thread,
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

-- A transition table may serve one event only: three triggers per table.
DO $$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM (VALUES
      ('thread_heads', 't'), ('records', 't'), ('thread_views', 't'), ('summaries', 't'),
      ('windows', 't'), ('window_handoffs', 't'), ('state_facts', 't'), ('state_versions', 't'),
      ('sessions', 's'), ('session_forks', 's'),
      ('runs', 'r')) AS v(tbl, keyed)
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
  END LOOP;
END
$$;
