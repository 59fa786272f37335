// The client side of the context tools: answer a model's context_read / context_search calls.
//
// A runtime that asked for `context_tools` hands each model response to ContextTools; the context
// tools are answered through ctx.read / ctx.search (scope-checked by the fleet like any read-back)
// and come back as tool outcomes to publish; every other call is left to the runtime. A refusal
// (another session's ref, a malformed call) is answered as an error outcome naming its code; a
// retryable fleet error is thrown, so the runtime can retry the whole step.
//
// The mapping, for any runtime (services/edge/context_tools.py does the same):
//   context_read {ref, start_line, end_line}  ->  ReadRequest {ref, line: start_line, lines: end_line - start_line + 1}
//     (start_line alone reads 200 lines; end_line alone starts at 1), {ref, offset, length} -> the same
//     fields (offset alone reads 64 KiB); both ranges at once are refused.
//   ReadReply -> "[<ref> lines <line>–<last> of <total_lines>; next start_line <next_line> | end of content;
//     sha256 verified]\n<content>" (bytes <offset>–<end> of <total_bytes> for a byte range).
//   context_search {query, kind} -> SearchRequest {query, kinds: [kind], limit: 10}; SearchReply -> one
//     line per hit: "ctx://record/<thread_id>/<seq> (<kind>, lines a–b): <snippet>".
import { createHash } from "node:crypto";

import type { ContentBlock, Message } from "@anthropic-ai/sdk/resources/messages";
import type { ChatCompletion, ChatCompletionMessage, ChatCompletionMessageToolCall } from "openai/resources/chat/completions";
import type { Response, ResponseInputItem, ResponseOutputItem } from "openai/resources/responses/responses";

import { FleetError } from "./errors.js";
import type { ReadReply, ReadRequest, SearchReply, SearchRequest, ToolOutcomeEvent, ToolStatus } from "./generated/wire.js";

export const CONTEXT_READ = "context_read";
export const CONTEXT_SEARCH = "context_search";
export const CONTEXT_TOOL_NAMES: ReadonlySet<string> = new Set([CONTEXT_READ, CONTEXT_SEARCH]);
/** A line range with only its start reads this many lines. */
export const DEFAULT_LINES = 200;
/** A byte range with only its offset reads this many bytes. */
export const DEFAULT_LENGTH = 65_536;
/** Hits a context_search answers with. */
export const SEARCH_LIMIT = 10;

const BLOB_REF = /^ctx:\/\/blob\/[0-9a-f]{64}$/;
const RECORD_REF = /^ctx:\/\/record\/[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}\/[1-9][0-9]{0,18}$/;

/** A model response in any shape the helper reads, as the SDKs return it (or as plain JSON of it). */
export type ModelResponse =
  | ChatCompletion
  | ChatCompletionMessage
  | readonly ChatCompletionMessageToolCall[]
  | Response
  | readonly (ResponseOutputItem | ResponseInputItem)[]
  | Message
  | readonly ContentBlock[];

/** One tool call of a model response, whatever the provider. */
export interface ModelToolCall {
  callId: string;
  name: string;
  /** `null` when the model's arguments were not a JSON object. */
  arguments: Record<string, unknown> | null;
}

/** A context tool call answered: the outcome to publish, and what the fleet replied. */
export interface ContextToolAnswer {
  call: ModelToolCall;
  outcome: ToolOutcomeEvent;
  reply: ReadReply | SearchReply | null;
  /** The error code of a refused call, else `null`. */
  refused: string | null;
}

/** A response's tool calls split: the context tools answered, the rest left to the runtime. */
export interface Answered {
  answers: ContextToolAnswer[];
  others: ModelToolCall[];
  /** The tool outcomes to publish, in call order. */
  outcomes: ToolOutcomeEvent[];
}

/** What the helper needs of a client (FleetClient is one). */
export interface ReadsContext {
  read(request: ReadRequest): Promise<ReadReply>;
  search(request: SearchRequest): Promise<SearchReply>;
}

export interface ThreadIds {
  session_id: string;
  run_id: string;
  instance_id: string;
  principal_id?: string;
}

/** Answers the context tools of one thread's model responses through a fleet client. */
export class ContextTools {
  readonly #client: ReadsContext;
  readonly #ids: ThreadIds;

  constructor(client: ReadsContext, ids: ThreadIds) {
    this.#client = client;
    this.#ids = ids;
  }

  /** Answer the context tool calls of `response`; other calls are returned untouched. */
  async answer(response: ModelResponse): Promise<Answered> {
    const calls = toolCallsOf(response);
    const answers: ContextToolAnswer[] = [];
    for (const call of calls.filter((c) => CONTEXT_TOOL_NAMES.has(c.name))) answers.push(await this.answerCall(call));
    return { answers, others: calls.filter((c) => !CONTEXT_TOOL_NAMES.has(c.name)), outcomes: answers.map((a) => a.outcome) };
  }

  /** One context tool call, answered (or refused) as a tool outcome. */
  async answerCall(call: ModelToolCall): Promise<ContextToolAnswer> {
    try {
      if (call.name === CONTEXT_READ) {
        const reply = await this.#client.read(this.#readRequest(call));
        return { call, outcome: this.#outcome(call, readText(reply), "success"), reply, refused: null };
      }
      if (call.name === CONTEXT_SEARCH) {
        const reply = await this.#client.search(this.#searchRequest(call));
        return { call, outcome: this.#outcome(call, searchText(reply), "success"), reply, refused: null };
      }
      throw new FleetError("invalid_request", `${call.name} is not a context tool`, false);
    } catch (err) {
      if (!(err instanceof FleetError) || err.retryable) throw err;
      const text = `[${call.name} refused: ${err.code}] ${err.message}`;
      return { call, outcome: this.#outcome(call, text, "error"), reply: null, refused: err.code };
    }
  }

  #readRequest(call: ModelToolCall): ReadRequest {
    const args = argumentsOf(call);
    const ref = args.ref;
    if (typeof ref !== "string" || !(BLOB_REF.test(ref) || RECORD_REF.test(ref))) {
      throw new FleetError(
        "invalid_request",
        `ref must be ctx://blob/<sha256> or ctx://record/<thread_id>/<seq>, not ${JSON.stringify(ref)}`,
        false,
      );
    }
    const lines = lineRange(args);
    const bytes = byteRange(args);
    if (lines && bytes) {
      throw new FleetError("invalid_request", "give a line range (start_line, end_line) or a byte range (offset, length)", false);
    }
    const base = {
      session_id: this.#ids.session_id,
      ...(this.#ids.principal_id ? { principal_id: this.#ids.principal_id } : {}),
      ref,
    };
    return lines ? { ...base, line: lines.line, lines: lines.lines } : { ...base, ...bytes };
  }

  #searchRequest(call: ModelToolCall): SearchRequest {
    const args = argumentsOf(call);
    if (typeof args.query !== "string" || args.query === "") {
      throw new FleetError("invalid_request", "invalid arguments: query must be a non-empty string", false);
    }
    return {
      session_id: this.#ids.session_id,
      ...(this.#ids.principal_id ? { principal_id: this.#ids.principal_id } : {}),
      query: args.query,
      kinds: typeof args.kind === "string" ? [args.kind] : [],
      limit: SEARCH_LIMIT,
    };
  }

  #outcome(call: ModelToolCall, text: string, status: ToolStatus): ToolOutcomeEvent {
    // One key per call: an answer published twice is the same event, dropped as a retry.
    const digest = createHash("sha256").update(call.callId).digest("hex").slice(0, 24);
    return {
      schema_version: 1,
      event_key: `ctx-tool:${digest}`,
      session_id: this.#ids.session_id,
      run_id: this.#ids.run_id,
      instance_id: this.#ids.instance_id,
      ...(this.#ids.principal_id ? { principal_id: this.#ids.principal_id } : {}),
      kind: "tool_outcome",
      payload: { call_id: call.callId, status, text },
    };
  }
}

/** The tool calls of a model response in any supported provider shape, in call order. */
export function toolCallsOf(response: ModelResponse | unknown): ModelToolCall[] {
  if (Array.isArray(response)) return response.flatMap(callsOfItem);
  if (!isObject(response)) return [];
  const choices = response.choices;
  if (Array.isArray(choices) && choices.length > 0) {
    // A Chat completion: its first choice's message.
    const first: unknown = choices[0];
    return toolCallsOf(isObject(first) ? first.message : undefined);
  }
  // A Chat message's tool_calls, a Responses response's output, an Anthropic message's content.
  for (const key of ["tool_calls", "output", "content"]) {
    const items = response[key];
    if (Array.isArray(items)) return items.flatMap(callsOfItem);
  }
  return [];
}

function callsOfItem(item: unknown): ModelToolCall[] {
  if (!isObject(item)) return [];
  if (item.type === "function" && isObject(item.function)) {
    // OpenAI Chat
    return [{ callId: String(item.id ?? ""), name: String(item.function.name ?? ""), arguments: parsed(item.function.arguments) }];
  }
  if (item.type === "function_call") {
    // OpenAI Responses
    return [{ callId: String(item.call_id ?? ""), name: String(item.name ?? ""), arguments: parsed(item.arguments) }];
  }
  if (item.type === "tool_use") {
    // Anthropic Messages
    return [{ callId: String(item.id ?? ""), name: String(item.name ?? ""), arguments: isObject(item.input) ? item.input : null }];
  }
  return [];
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function parsed(args: unknown): Record<string, unknown> | null {
  if (isObject(args)) return args;
  if (typeof args !== "string") return null;
  try {
    const value: unknown = JSON.parse(args || "{}");
    return isObject(value) ? value : null;
  } catch {
    return null;
  }
}

function argumentsOf(call: ModelToolCall): Record<string, unknown> {
  if (call.arguments === null) throw new FleetError("invalid_request", `the arguments of ${call.name} are not a JSON object`, false);
  return call.arguments;
}

function lineRange(args: Record<string, unknown>): { line: number; lines: number } | null {
  const { start_line: start, end_line: end } = args;
  if (start === undefined && end === undefined) return null;
  const first = start !== undefined ? integer(start, "start_line") : 1;
  const last = end !== undefined ? integer(end, "end_line") : first + DEFAULT_LINES - 1;
  if (first < 1 || last < first) {
    throw new FleetError("invalid_request", `lines ${first}–${last} are not a range (1-based, end at or after start)`, false);
  }
  return { line: first, lines: last - first + 1 };
}

function byteRange(args: Record<string, unknown>): { offset: number; length: number } | null {
  const { offset, length } = args;
  if (offset === undefined && length === undefined) return null;
  return {
    offset: offset !== undefined ? integer(offset, "offset") : 0,
    length: length !== undefined ? integer(length, "length") : DEFAULT_LENGTH,
  };
}

function integer(value: unknown, name: string): number {
  // JSON has one number type: 40000.0 is the model's 40000, 1.5 is not a position.
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new FleetError("invalid_request", `${name} must be an integer, not ${JSON.stringify(value)}`, false);
  }
  return value;
}

/** The tool's answer to a read: one line saying where the range lies and where to continue, then it. */
export function readText(reply: ReadReply): string {
  let where: string;
  let more: string;
  if (reply.line !== undefined) {
    const last = reply.next_line !== undefined ? reply.next_line - 1 : reply.total_lines;
    where = `lines ${reply.line}–${last} of ${reply.total_lines}`;
    more = reply.next_line !== undefined ? `; next start_line ${reply.next_line}` : "; end of content";
  } else {
    const end = reply.offset + Buffer.byteLength(reply.content, "utf8");
    where = `bytes ${reply.offset}–${end} of ${reply.total_bytes}`;
    more = reply.next_offset !== undefined ? `; next offset ${reply.next_offset}` : "; end of content";
  }
  return `[${reply.ref} ${where}${more}; sha256 verified]\n${reply.content}`;
}

/** The tool's answer to a search: one line per hit, best first, each naming its ref. */
export function searchText(reply: SearchReply): string {
  if (reply.hits.length === 0) return "[no hits]";
  const lines = [`[${reply.hits.length} hit(s), best first; each names its ref]`];
  for (const h of reply.hits) {
    const stale = h.superseded ? ", superseded" : "";
    lines.push(`ctx://record/${h.thread_id}/${h.seq} (${h.kind}${stale}, lines ${h.start_line}–${h.end_line}): ${h.snippet}`);
  }
  return lines.join("\n");
}
