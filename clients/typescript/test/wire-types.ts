// What `tsc --strict` holds a runtime to with the generated types (compiled by tsconfig.test.json;
// each @ts-expect-error fails the build if the line it marks ever compiles).
import type { Event, PrepareRequest, ReadRequest } from "../src/index.js";

const ids = { session_id: "s", run_id: "r", instance_id: "main" };

export const withProfile: PrepareRequest = { ...ids, model_profile: "gpt-4o" };
export const withBudget: PrepareRequest = { ...ids, budget_tokens: 8000 };
export const ownProfile: PrepareRequest = { ...ids, profile: { name: "m", context_window: 16000 } };
// @ts-expect-error a profile is a model profile, not any object
export const notAProfile: PrepareRequest = { ...ids, profile: { window: 16000 } };
// @ts-expect-error session_id is required
export const noSession: PrepareRequest = { run_id: "r", instance_id: "main", budget_tokens: 8000 };

export const lineRange: ReadRequest = { session_id: "s", ref: "ctx://record/r.main/1", line: 3, lines: 10 };

export const question: Event = { ...ids, event_key: "e1", kind: "user_input", payload: { text: "hi" } };
// @ts-expect-error an event's payload is its kind's
export const mismatched: Event = { ...ids, event_key: "e2", kind: "tool_outcome", payload: { text: "hi" } };
// @ts-expect-error no field beyond the schema's
export const extra: Event = { ...ids, event_key: "e3", kind: "system", payload: { text: "x" }, tenant: "t" };
