-- The recorder's reads before each batch, as a function whose statement is planned once per
-- connection. As a prepared statement PostgreSQL planned its dozen sub-selects again on
-- every call (0.95 ms of server time against 0.14 ms of execution, on every read-your-writes step),
-- because their estimates over parameter arrays never made the generic plan look cheaper. Here
-- `plan_cache_mode = force_generic_plan` holds for this function's statement alone.
--
-- A generic plan is made from the table sizes of its moment, and a fresh database starts empty: so
-- every lookup by key is a LATERAL sub-select on the key's unique index (OFFSET 0: one the planner
-- cannot flatten into a join), which can only be a nested loop over the parameter's keys, never a
-- hash join over a scan of the whole ledger.
-- The result is the statement's old one, column for column (services/store/batches.py).
CREATE FUNCTION ctx.batch_reads(
  threads text[], key_threads text[], key_names text[], call_threads text[], call_ids text[],
  session_ids text[], tenants text[], run_ids text[], state_threads text[], op_sessions text[],
  op_ids text[], release_tenants text[], release_names text[], consumer_name text, partition_no integer
)
RETURNS TABLE (
  heads json, keys json, calls json, sessions json, policies json, runs json, facts json,
  versions json, catalogs json, operations json, latest json, tracked bigint
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT
    (SELECT coalesce(json_agg(json_build_array(
         h.thread_id, h.session_id, h.revision, h.last_seq, h.last_hash, h.last_event_key, h.role,
         h.parent_thread_id)), '[]')
     FROM unnest(threads) AS k(thread_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.thread_heads t WHERE t.thread_id = k.thread_id OFFSET 0) h),
    (SELECT coalesce(json_agg(json_build_array(r.thread_id, r.event_key, r.seq, r.content_sha256)), '[]')
     FROM unnest(key_threads, key_names) AS k(thread_id, event_key)
     CROSS JOIN LATERAL (
       SELECT x.thread_id, x.event_key, x.seq, x.content_sha256 FROM ctx.records x
       WHERE x.thread_id = k.thread_id AND x.event_key = k.event_key OFFSET 0) r),
    (SELECT coalesce(json_agg(json_build_array(
         c.thread_id, c.call_id, c.call_seq, c.outcome_seq, c.name, c.args::text)), '[]')
     FROM unnest(call_threads, call_ids) AS k(thread_id, call_id)
     CROSS JOIN LATERAL (
       SELECT * FROM ctx.tool_calls x WHERE x.thread_id = k.thread_id AND x.call_id = k.call_id OFFSET 0) c),
    (SELECT coalesce(json_agg(json_build_array(s.session_id, s.tenant, s.principal_id, s.agent_release)), '[]')
     FROM unnest(session_ids) AS k(session_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.sessions x WHERE x.session_id = k.session_id OFFSET 0) s),
    (SELECT coalesce(json_agg(json_build_array(p.tenant, p.name)), '[]') FROM (
       SELECT DISTINCT x.tenant, x.name FROM ctx.policies x
       WHERE x.tenant = ANY(tenants) OR x.tenant = '') p),
    (SELECT coalesce(json_agg(json_build_array(r.run_id, r.session_id, r.status, r.main_thread_id)), '[]')
     FROM ctx.runs r
     WHERE r.run_id = ANY(run_ids) OR (r.session_id = ANY(session_ids) AND r.status = 'active')),
    (SELECT json_agg(json_build_array(
         f.thread_id, f.path, f.value::text, f.status, f.source, f.event_key, f.seq, f.observed_at,
         f.supersedes, f.superseded_value::text, f.evidence))
     FROM ctx.state_facts f WHERE f.thread_id = ANY(state_threads) AND f.is_current),
    (SELECT json_agg(json_build_array(v.thread_id, v.aggregate, v.version))
     FROM ctx.state_versions v WHERE v.thread_id = ANY(state_threads)),
    (SELECT coalesce(json_agg(json_build_array(s.session_id, c.revision, c.body::text)), '[]')
     FROM unnest(session_ids) AS k(session_id)
     CROSS JOIN LATERAL (SELECT * FROM ctx.sessions x WHERE x.session_id = k.session_id OFFSET 0) s
     CROSS JOIN LATERAL (
       SELECT x.revision, x.body FROM ctx.tool_catalogs x
       WHERE x.tenant = s.tenant AND x.release = s.agent_release AND x.revision = s.catalog_revision OFFSET 0) c),
    (SELECT coalesce(json_agg(json_build_array(o.session_id, o.operation_id)), '[]')
     FROM unnest(op_sessions, op_ids) AS k(session_id, operation_id)
     CROSS JOIN LATERAL (
       SELECT x.session_id, x.operation_id FROM ctx.receipts x
       WHERE x.session_id = k.session_id AND x.operation_id = k.operation_id OFFSET 0) o),
    (SELECT coalesce(json_agg(json_build_array(l.tenant, l.release, l.revision, l.body)), '[]') FROM (
       SELECT DISTINCT ON (k.tenant, k.release) k.tenant, k.release, c.revision, c.body::text AS body
       FROM unnest(release_tenants, release_names) AS k(tenant, release)
       CROSS JOIN LATERAL (
         SELECT x.revision, x.body FROM ctx.tool_catalogs x
         WHERE x.tenant = k.tenant AND x.release = k.release ORDER BY x.revision DESC LIMIT 1) c
       ORDER BY k.tenant, k.release) l),
    (SELECT t.last_stream_seq FROM ctx.tracking t
     WHERE t.consumer = consumer_name AND t.partition = partition_no);
END
$$;
