// Each request a runtime sends, built from the types json-schema-to-typescript generated (generate_types.mjs),
// compiled with `tsc --strict`: a request type that came out anonymous, `any` or a map would not compile here.
import type { CompactRequest } from "./CompactRequest";
import type { ContextPolicy } from "./ContextPolicy";
import type { Event } from "./Event";
import type { ExportRequest } from "./ExportRequest";
import type { FinalCheckRequest } from "./FinalCheckRequest";
import type { ForkRequest } from "./ForkRequest";
import type { HookReply } from "./HookReply";
import type { HookSet } from "./HookSet";
import type { InspectRequest } from "./InspectRequest";
import type { OperationStatusRequest } from "./OperationStatusRequest";
import type { ModelProfile, PrepareRequest } from "./PrepareRequest";
import type { ReadRequest } from "./ReadRequest";
import type { SearchRequest } from "./SearchRequest";
import type { ToolCatalog } from "./ToolCatalog";

const who = { session_id: "s1", run_id: "r1", instance_id: "main" };
const profile: ModelProfile = { name: "m", context_window: 16_000, output_reserve: 1_000 };
export const prepares: PrepareRequest[] = [
  { ...who, model_profile: "gpt-4o" },
  { ...who, profile, format: "anthropic.messages", tools: [{ name: "read", parameters: { type: "object" } }] },
  { ...who, budget_tokens: 8_000, evidence: [{ thread_id: "r1.main", seq: 2, start_line: 1, end_line: 4 }] },
];
// The profile is typed, not a map: its window is a number.
export const window: number = profile.context_window;
// @ts-expect-error session_id is required
export const noSession: PrepareRequest = { run_id: "r1", instance_id: "main", budget_tokens: 8_000 };
// @ts-expect-error a profile is an object with a name and a window, not any object
export const notAProfile: PrepareRequest = { ...who, profile: { window: 1 } };

export const reads: ReadRequest[] = [
  { session_id: "s1", ref: "ctx://record/r1.main/2" },
  { session_id: "s1", ref: "ctx://record/r1.main/2", line: 3, lines: 10 },
];
export const policy: ContextPolicy = {
  name: "tight",
  model_profile: null,
  profile,
  compaction: { triggers: { context_ratio: 0.8, user_turns: 3 } },
  window: { strategy: "rollover" },
};
export const search: SearchRequest = { session_id: "s1", query: "build", kinds: ["tool_outcome"], limit: 5 };
export const inspect: InspectRequest = { limit: 20 };
export const compact: CompactRequest = { ...who };
export const fork: ForkRequest = { session_id: "s1", at_seq: 4, new_session_id: "s2" };
export const exported: ExportRequest = { after_seq: 2 };
export const status: OperationStatusRequest = { session_id: "s1", operation_id: "op-1" };
export const catalog: ToolCatalog = {
  release: "rel-1",
  tools: [{ name: "ship", effects: [{ path: "order:{args.id}.status", op: "set", value: "shipped" }] }],
};
export const hooks: HookSet = {
  release: "rel-1",
  hooks: [{ name: "policy", version: "2", point: "context.prepare.before", subject: "hooks.default.policy" }],
};
export const check: FinalCheckRequest = {
  run_id: "r1",
  instance_id: "main",
  prepared_id: "pc-1",
  request: { model: "gpt-4o", messages: [{ role: "user", content: "hi" }] },
};
export const reply: HookReply = { decision: "continue" };

export const events: Event[] = [
  { ...who, event_key: "e1", kind: "user_input", payload: { text: "fix the build" } },
  {
    ...who,
    event_key: "e2",
    kind: "assistant_message",
    payload: { tool_calls: [{ call_id: "c1", name: "read", args: { path: "a.txt" } }] },
  },
  { ...who, event_key: "e3", kind: "tool_outcome", payload: { call_id: "c1", status: "success", text: "ok" } },
  {
    ...who,
    event_key: "e4",
    kind: "state_patch",
    payload: { source: "user", ops: [{ op: "set", path: "goal:1.text", value: "ship it" }] },
  },
];
// @ts-expect-error an event names its kind
export const noKind: Event = { ...who, event_key: "e5", payload: { text: "hi" } };

// The kind discriminates: narrowed on it, the payload is that kind's.
export function callIdOf(event: Event): string | undefined {
  return event.kind === "tool_outcome" ? event.payload.call_id : undefined;
}
