// What the package decides without a fleet: the environment it reads, the context tools' mapping to
// ReadRequest / SearchRequest, the tool calls of each provider's response shape. Run: node --test test/
import assert from "node:assert/strict";
import { test } from "node:test";

import { ContextTools, FleetError, optionsFromEnv, readText, toolCallsOf } from "../dist/index.js";

const BLOB = `ctx://blob/${"a".repeat(64)}`;
const ids = { session_id: "s1", run_id: "r1", instance_id: "main" };

// A client that answers with the request it was asked, so the mapping can be read back.
function echo() {
  const asked = [];
  const client = {
    read: async (request) => {
      asked.push(request);
      return { ref: request.ref, content: "x", offset: 0, total_bytes: 1, total_lines: 1, sha256_verified: true };
    },
    search: async (request) => {
      asked.push(request);
      return { hits: [] };
    },
  };
  return { client, asked };
}

const read = (args, id = "c1") => ({ callId: id, name: "context_read", arguments: args });

test("optionsFromEnv splits a cluster's comma-separated URLs and reads the identity and tenant", () => {
  const options = optionsFromEnv({
    CTX_NATS_URL: "nats://127.0.0.1:4250, nats://127.0.0.1:4251",
    CTX_NATS_USER: "runtime-acme",
    CTX_NATS_PASSWORD: "pw",
    CTX_TENANT: "acme",
  });
  assert.deepEqual(options, {
    servers: ["nats://127.0.0.1:4250", "nats://127.0.0.1:4251"],
    user: "runtime-acme",
    password: "pw",
    tenant: "acme",
  });
});

test("optionsFromEnv takes credentials written in a URL for every server, and the default tenant", () => {
  const options = optionsFromEnv({ CTX_NATS_URL: "nats://op%40x:p%3Aw@h1:4222,nats://h2:4222" });
  assert.deepEqual(options, { servers: ["nats://h1:4222", "nats://h2:4222"], user: "op@x", password: "p:w", tenant: "default" });
});

test("optionsFromEnv without CTX_NATS_URL is an invalid_configuration error", () => {
  assert.throws(() => optionsFromEnv({}), (err) => err instanceof FleetError && err.code === "invalid_configuration");
});

test("context_read's start_line and end_line become ReadRequest line and lines", async () => {
  const { client, asked } = echo();
  const tools = new ContextTools(client, ids);
  await tools.answerCall(read({ ref: BLOB, start_line: 10, end_line: 19 }));
  await tools.answerCall(read({ ref: BLOB, start_line: 5 }));
  await tools.answerCall(read({ ref: BLOB, end_line: 3.0 }));
  await tools.answerCall(read({ ref: BLOB, offset: 100 }));
  assert.deepEqual(
    asked.map(({ line, lines, offset, length }) => ({ line, lines, offset, length })),
    [
      { line: 10, lines: 10, offset: undefined, length: undefined },
      { line: 5, lines: 200, offset: undefined, length: undefined },
      { line: 1, lines: 3, offset: undefined, length: undefined },
      { line: undefined, lines: undefined, offset: 100, length: 65536 },
    ],
  );
});

test("a context_read with both ranges, a fraction or a foreign ref is refused as an error outcome, never sent", async () => {
  const { client, asked } = echo();
  const tools = new ContextTools(client, ids);
  const refused = [
    await tools.answerCall(read({ ref: BLOB, start_line: 1, offset: 0 })),
    await tools.answerCall(read({ ref: BLOB, start_line: 1.5 })),
    await tools.answerCall(read({ ref: BLOB, start_line: 9, end_line: 3 })),
    await tools.answerCall(read({ ref: "file:///etc/passwd" })),
  ];
  assert.deepEqual(asked, []);
  assert.deepEqual(
    refused.map((a) => [a.refused, a.outcome.payload.status]),
    Array(4).fill(["invalid_request", "error"]),
  );
  assert.match(refused[0].outcome.payload.text, /^\[context_read refused: invalid_request\] /);
});

test("a retryable fleet error is thrown, not answered: the runtime retries the step", async () => {
  const client = {
    read: async () => {
      throw new FleetError("fleet_unavailable", "down", true);
    },
    search: async () => ({ hits: [] }),
  };
  await assert.rejects(new ContextTools(client, ids).answerCall(read({ ref: BLOB })), { code: "fleet_unavailable" });
});

test("the outcome of a call has one event key per call id, so an answer published twice is one event", async () => {
  const tools = new ContextTools(echo().client, ids);
  const [a, b, c] = [await tools.answerCall(read({ ref: BLOB }, "x")), await tools.answerCall(read({ ref: BLOB }, "x")), await tools.answerCall(read({ ref: BLOB }, "y"))];
  assert.equal(a.outcome.event_key, b.outcome.event_key);
  assert.notEqual(a.outcome.event_key, c.outcome.event_key);
  assert.deepEqual(a.outcome.payload, { call_id: "x", status: "success", text: `[${BLOB} bytes 0–1 of 1; end of content; sha256 verified]\nx` });
});

test("a ReadReply of a line range names where it lies and the next start_line", () => {
  const reply = { ref: BLOB, content: "a\nb\n", line: 3, next_line: 5, offset: 4, total_bytes: 20, total_lines: 9, sha256_verified: true };
  assert.equal(readText(reply), `[${BLOB} lines 3–4 of 9; next start_line 5; sha256 verified]\na\nb\n`);
});

test("toolCallsOf reads a Chat completion, a Responses response and an Anthropic message alike", () => {
  const args = { ref: BLOB };
  const chat = { choices: [{ message: { role: "assistant", tool_calls: [{ id: "c", type: "function", function: { name: "context_read", arguments: JSON.stringify(args) } }] } }] };
  const responses = { output: [{ type: "message", content: [] }, { type: "function_call", call_id: "r", name: "context_read", arguments: JSON.stringify(args) }] };
  const anthropic = { content: [{ type: "text", text: "…" }, { type: "tool_use", id: "t", name: "bash", input: { cmd: "ls" } }] };
  assert.deepEqual(
    [...toolCallsOf(chat), ...toolCallsOf(responses), ...toolCallsOf(anthropic)],
    [
      { callId: "c", name: "context_read", arguments: args },
      { callId: "r", name: "context_read", arguments: args },
      { callId: "t", name: "bash", arguments: { cmd: "ls" } },
    ],
  );
  assert.deepEqual(toolCallsOf([{ type: "function_call", call_id: "r", name: "x", arguments: "not json" }]), [
    { callId: "r", name: "x", arguments: null },
  ]);
});
