// Replay a trace (docs/trace-format.md) through the fleet as a runtime would, with this package only:
// publish every event, prepare before every assistant message (as one step with the event before it),
// in the three formats in turn with the context tools, each body typed as its SDK's request; then
// answer a context_search and two context_reads given in each provider's tool-call shape, publish
// the outcomes, and prepare after them.
//
//   node dist/replay.js TRACE [BUDGET_TOKENS]      (the CTX_* lines of `ctxfleet env` in the environment)
//
// Prints one JSON line of what it did; exits 1 with the reasons if anything failed.
import { randomUUID } from "node:crypto";
import fs from "node:fs";

import type { MessageCreateParamsNonStreaming, ToolUseBlock } from "@anthropic-ai/sdk/resources/messages";
import type { ChatCompletionCreateParamsNonStreaming, ChatCompletionMessage } from "openai/resources/chat/completions";
import type { ResponseCreateParamsNonStreaming, ResponseFunctionToolCall } from "openai/resources/responses/responses";

import { fromEnv, type FleetClient } from "./client.js";
import { type Answered, CONTEXT_READ, CONTEXT_SEARCH, ContextTools } from "./contextTools.js";
import { FleetError } from "./errors.js";
import type { Event, PreparedContext, PrepareRequest, SearchHit, ToolCall, ToolStatus } from "./generated/wire.js";
import { FORMATS, providerBody } from "./providers.js";

interface TraceLine {
  kind: "system" | "user_input" | "assistant_message" | "tool_outcome";
  text?: string;
  tool_calls?: { call_id: string; name: string; args?: Record<string, unknown> }[];
  call_id?: string;
  status?: ToolStatus;
  run?: string;
  usage?: { input_tokens: number; output_tokens: number; cost?: number };
}

const [tracePath, budgetArg] = process.argv.slice(2);
if (!tracePath) {
  console.error("usage: node dist/replay.js TRACE [BUDGET_TOKENS]");
  process.exit(2);
}
const budget = Number(budgetArg ?? 8000);
const lines = fs
  .readFileSync(tracePath, "utf8")
  .split("\n")
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l) as TraceLine);

const failures: string[] = [];
const done = {
  events: 0,
  prepares: 0,
  steps: 0,
  formats: {} as Record<string, number>,
  context_tools_in_every_body: true,
  search_hits: 0,
  read_heads: [] as string[],
  refused: [] as (string | null)[],
  outcomes_recorded: false,
};

const session = `ts-${randomUUID()}`;
const client = await fromEnv();
try {
  await replay(client);
} catch (err) {
  failures.push(err instanceof Error ? `${err.name}: ${err.message}` : String(err));
} finally {
  await client.close();
}
console.log(JSON.stringify({ ok: failures.length === 0, session, ...done, failures }));
process.exit(failures.length === 0 ? 0 : 1);

async function replay(client: FleetClient): Promise<void> {
  const events = traceEvents();
  let last: Event | undefined;
  for (const [i, event] of events.entries()) {
    const next = events[i + 1];
    if (next?.kind === "assistant_message" && sameThread(event, next)) {
      const { prepared } = await client.appendAndPrepare(event, prepareRequest(event));
      check(prepared);
      done.steps += 1;
    } else {
      if (event.kind === "assistant_message" && last && !sameThread(last, event)) {
        check(await client.prepare(prepareRequest(event)));
      }
      await client.publish(event);
    }
    done.events += 1;
    last = event;
  }
  if (last) await answerContextTools(client, last);
}

// The events a runtime publishes for the trace: a new run per `run` value, each closed before the next.
function traceEvents(): Event[] {
  const events: Event[] = [];
  const runs = new Map<string | undefined, string>();
  let current: string | undefined;
  for (const [index, line] of lines.entries()) {
    const run = runs.get(line.run) ?? `${session}-r${runs.size + 1}`;
    runs.set(line.run, run);
    const ids = { schema_version: 1 as const, session_id: session, run_id: run, instance_id: "main" };
    if (current !== undefined && current !== run) {
      events.push({ ...ids, run_id: current, event_key: `end-${current}`, kind: "run_status", payload: { status: "completed" } });
    }
    current = run;
    const key = `e${String(index + 1).padStart(6, "0")}`;
    const text = line.text ?? "";
    switch (line.kind) {
      case "system":
        events.push({ ...ids, event_key: key, kind: "system", payload: { text } });
        break;
      case "user_input":
        events.push({ ...ids, event_key: key, kind: "user_input", payload: { text } });
        break;
      case "assistant_message": {
        const tool_calls: ToolCall[] = (line.tool_calls ?? []).map((c) => ({ call_id: c.call_id, name: c.name, args: c.args ?? {} }));
        events.push({ ...ids, event_key: key, kind: "assistant_message", payload: { text, tool_calls, ...(line.usage ? { usage: line.usage } : {}) } });
        break;
      }
      case "tool_outcome":
        events.push({ ...ids, event_key: key, kind: "tool_outcome", payload: { call_id: line.call_id ?? "", status: line.status ?? "success", text } });
        break;
    }
  }
  return events;
}

function sameThread(a: Event, b: Event): boolean {
  return a.run_id === b.run_id && a.instance_id === b.instance_id;
}

function prepareRequest(event: Event): PrepareRequest {
  const format = FORMATS[done.prepares % FORMATS.length];
  return {
    schema_version: 1,
    session_id: event.session_id,
    run_id: event.run_id,
    instance_id: event.instance_id,
    budget_tokens: budget,
    after_event_key: event.event_key,
    wait_ms: 20_000,
    context_tools: true,
    ...(format ? { format } : {}),
  };
}

// Each body goes where its SDK takes it: these assignments are what `tsc --strict` holds the types to.
function check(prepared: PreparedContext): void {
  done.prepares += 1;
  const tagged = providerBody(prepared);
  done.formats[tagged.format] = (done.formats[tagged.format] ?? 0) + 1;
  let tools: string[];
  let items: number;
  switch (tagged.format) {
    case "openai.chat": {
      const params: ChatCompletionCreateParamsNonStreaming = { model: "gpt-4o", ...tagged.body };
      tools = (params.tools ?? []).map((t) => (t.type === "function" ? t.function.name : t.custom.name));
      items = params.messages.length;
      break;
    }
    case "openai.responses": {
      const params: ResponseCreateParamsNonStreaming = { model: "gpt-4o", ...tagged.body };
      tools = (params.tools ?? []).map((t) => ("name" in t ? String(t.name) : t.type));
      items = Array.isArray(params.input) ? params.input.length : 0;
      break;
    }
    case "anthropic.messages": {
      const params: MessageCreateParamsNonStreaming = { model: "claude-sonnet-4", max_tokens: 1024, ...tagged.body };
      tools = (params.tools ?? []).map((t) => ("name" in t ? String(t.name) : t.type));
      items = params.messages.length;
      break;
    }
  }
  if (items === 0) failures.push(`prepare ${done.prepares} (${tagged.format}): an empty body`);
  if (!tools.includes(CONTEXT_READ) || !tools.includes(CONTEXT_SEARCH)) done.context_tools_in_every_body = false;
}

// The model calls the context tools, once in each provider's shape; the answers are published as the
// outcomes of those calls and the thread prepares after them.
async function answerContextTools(client: FleetClient, last: Event): Promise<void> {
  const ids = { session_id: last.session_id, run_id: last.run_id, instance_id: last.instance_id };
  const tools = new ContextTools(client, ids);
  const query = lines.find((l) => l.kind === "user_input")?.text?.match(/[A-Za-z_]{6,}/)?.[0] ?? "the";

  const chat: ChatCompletionMessage = {
    role: "assistant",
    content: null,
    refusal: null,
    tool_calls: [{ id: "call_ts_search", type: "function", function: { name: CONTEXT_SEARCH, arguments: JSON.stringify({ query }) } }],
  };
  // The indexer follows the ledger asynchronously: ask again until the hit is there (or 10 s pass).
  const deadline = Date.now() + 10_000;
  let searched = await tools.answer(chat);
  let hits = hitsOf(searched);
  while (hits.length === 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    searched = await tools.answer(chat);
    hits = hitsOf(searched);
  }
  done.search_hits = hits.length;
  const first = hits[0];
  if (!first) throw new Error(`context_search for ${JSON.stringify(query)} found nothing`);
  const ref = `ctx://record/${first.thread_id}/${first.seq}`;

  const responses: ResponseFunctionToolCall[] = [
    { type: "function_call", call_id: "call_ts_read", name: CONTEXT_READ, arguments: JSON.stringify({ ref, start_line: 1, end_line: 2 }) },
  ];
  const anthropic: ToolUseBlock[] = [
    { type: "tool_use", id: "toolu_ts_read", name: CONTEXT_READ, input: { ref, offset: 0, length: 64 }, caller: { type: "direct" } },
    // Another session's record: refused as not found, never read.
    { type: "tool_use", id: "toolu_ts_other", name: CONTEXT_READ, input: { ref: "ctx://record/r-elsewhere.main/1" }, caller: { type: "direct" } },
  ];
  const read = [await tools.answer(responses), await tools.answer(anthropic)].flatMap((a) => a.answers);
  done.read_heads = read.filter((a) => a.refused === null).map((a) => (a.outcome.payload.text ?? "").split("\n")[0] ?? "");
  done.refused = read.map((a) => a.refused);

  // The calls the model made, then their outcomes: the fleet records a tool group whole.
  const answers = [...searched.answers, ...read];
  const calls: ToolCall[] = answers.map((a) => ({ call_id: a.call.callId, name: a.call.name, args: a.call.arguments ?? {} }));
  await client.publish({ schema_version: 1, ...ids, event_key: "ctx-tools-calls", kind: "assistant_message", payload: { text: "", tool_calls: calls } });
  for (const answer of answers.slice(0, -1)) await client.publish(answer.outcome);
  const lastOutcome = answers[answers.length - 1]?.outcome;
  if (!lastOutcome) return;
  try {
    const { prepared } = await client.appendAndPrepare(lastOutcome, prepareRequest(lastOutcome));
    check(prepared);
    done.steps += 1;
    // Answered, not event_rejected: every call and outcome was recorded.
    done.outcomes_recorded = true;
  } catch (err) {
    if (err instanceof FleetError) failures.push(`prepare after the context tools' outcomes: ${err.message}`);
    else throw err;
  }
}

function hitsOf(answered: Answered): SearchHit[] {
  const reply = answered.answers[0]?.reply;
  return reply && "hits" in reply ? reply.hits : [];
}
