-- A profile's calibration changing is announced like a view's change (design D14.22):
-- 'c:["<tenant>","<profile>"]' on the same channel. A trusted view is served with the calibration of
-- its profile; a process re-reading that row every 5 s whatever happened would bound how long any
-- view could be trusted: an agent pausing 10 s between steps would always read both again.
-- Announced, a calibration read while the process listens stays current until its notice arrives,
-- like the views it budgets. The key is a JSON array: a tenant or a profile may hold any character.
-- Statement triggers with a transition table, as migration 0021's: the upsert that finds its row
-- already there inserts nothing and sends nothing.

CREATE FUNCTION ctx.calibration_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ctx_view_changes', 'c:' || json_build_array(c.tenant, c.profile)::text)
  FROM (SELECT DISTINCT tenant, profile FROM changed) c;
  RETURN NULL;
END
$$;

CREATE TRIGGER view_changes_ins AFTER INSERT ON ctx.calibrations REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ctx.calibration_changed();
CREATE TRIGGER view_changes_upd AFTER UPDATE ON ctx.calibrations REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ctx.calibration_changed();
CREATE TRIGGER view_changes_del AFTER DELETE ON ctx.calibrations REFERENCING OLD TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ctx.calibration_changed();
CREATE TRIGGER view_changes_trunc AFTER TRUNCATE ON ctx.calibrations
FOR EACH STATEMENT EXECUTE FUNCTION ctx.view_truncated();
