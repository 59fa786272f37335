// A runtime in another language, using only the generated schemas and the CTX_* lines of `ctxfleet env`:
// publish a thread's events, prepare, validate every reply in ajv strict mode, send each kind of bad input
// and check it is answered at once with its code, and parse the AsyncAPI document.
//
//   node roundtrip.mjs SCHEMA_DIR        (SCHEMA_DIR: what `ctxfleet schemas DIR` wrote)
//
// Prints one JSON line of what it checked; exits 1 with the reasons if anything failed.
import { createHash, randomUUID } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

import { Parser } from "@asyncapi/parser";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { connect, headers as natsHeaders, JSONCodec } from "nats";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node roundtrip.mjs SCHEMA_DIR");
  process.exit(2);
}
const env = process.env;
const tenant = env.CTX_TENANT || "default";
// The fleet under test refuses events over this many bytes (CTX_MAX_EVENT_BYTES); 0 skips that input.
const maxEventBytes = Number(env.ROUNDTRIP_MAX_EVENT_BYTES || 0);
const failures = [];
const checked = {};
const fail = (what) => failures.push(what);

// --- The contract: JSON Schemas (one per message) and the AsyncAPI document -----------------------------

// The schema files' Event is a oneOf discriminated on "kind" (OpenAPI's keyword, which ajv takes with
// discriminator: true): one error for a bad kind instead of one per branch. The AsyncAPI document
// writes AsyncAPI's form of it, the property's name, which ajv only carries along.
function strictAjv(options = {}) {
  const ajv = new Ajv2020({ strict: true, allErrors: true, ...options });
  addFormats(ajv);
  return ajv;
}

const files = strictAjv({ discriminator: true });
for (const name of fs.readdirSync(dir).filter((f) => f.endsWith(".schema.json"))) {
  files.addSchema(JSON.parse(fs.readFileSync(path.join(dir, name), "utf8")));
}
const fileValidator = (message) => {
  const validate = files.getSchema(`urn:ctxfleet:wire:1:${message}`);
  if (!validate) throw new Error(`no schema file for ${message}`);
  return validate;
};

const { document, diagnostics } = await new Parser().parse(fs.readFileSync(path.join(dir, "asyncapi.json"), "utf8"));
// Severity 0 is an error, 1 a warning; 2 and 3 are hints (such as "3.1.0 exists").
const serious = diagnostics.filter((d) => d.severity <= 1);
for (const d of serious) fail(`asyncapi: ${d.code}: ${d.message} at ${JSON.stringify(d.path)}`);
if (!document) throw new Error("the AsyncAPI document did not parse");
checked.asyncapi_diagnostics = serious.length;

// The client model generated from the AsyncAPI document: a validator per message (what a runtime sends,
// and every reply of every request operation), compiled from the parsed, dereferenced payloads. The
// parser marks each schema with extension keywords of its own; declaring them keeps ajv in strict mode.
const fromDocument = strictAjv();
fromDocument.addVocabulary([
  "x-parser-schema-id",
  "x-parser-circular",
  "x-parser-original-schema-format",
  "discriminator",
]);
const documentValidators = {};
for (const op of document.operations().all()) {
  for (const message of [...op.messages().all(), ...(op.reply()?.messages().all() ?? [])]) {
    documentValidators[message.id()] ??= fromDocument.compile(message.payload().json());
  }
}
checked.document_validators = Object.keys(documentValidators).sort();

function expectValid(message, body, where) {
  // Every message has both, but the body of a session inspection (ignored: no schema file of its own).
  const sources = [
    ["schema file", files.getSchema(`urn:ctxfleet:wire:1:${message}`)],
    ["asyncapi", documentValidators[message]],
  ].filter(([, validate]) => validate);
  if (sources.length < (message === "EmptyRequest" ? 1 : 2)) fail(`${where}: no schemas for ${message}`);
  for (const [source, validate] of sources) {
    if (!validate(body)) fail(`${where}: ${message} fails its ${source}: ${JSON.stringify(validate.errors)}`);
  }
}

// No null on the wire from the fleet: an absent field is an omitted one. Free-form JSON (an error's
// details, a provider's request body, tool parameters) is the sender's own and keeps what it holds.
const FREE_FORM = new Set(["details", "request", "parameters", "args", "input_schema"]);
function nullsIn(value, where = "$") {
  if (value === null) return [where];
  if (typeof value !== "object") return [];
  return Object.entries(value).flatMap(([k, v]) => (FREE_FORM.has(k) ? [] : nullsIn(v, `${where}.${k}`)));
}
function expectNoNulls(body, where) {
  const found = nullsIn(body);
  if (found.length) fail(`${where}: the reply carries null at ${found.join(", ")}`);
}

// --- The fleet -------------------------------------------------------------------------------------------

// An identity may read replies only on its own inboxes: _INBOX.<user>.
const nc = await connect({
  // One URL, or a cluster's comma-separated: nats.js takes a string as one server, so split it.
  servers: env.CTX_NATS_URL.split(",").map((url) => url.trim()),
  ...(env.CTX_NATS_USER
    ? { user: env.CTX_NATS_USER, pass: env.CTX_NATS_PASSWORD, inboxPrefix: `_INBOX.${env.CTX_NATS_USER}` }
    : {}),
});
const js = nc.jetstream();
const json = JSONCodec();

const session = `node-${randomUUID().slice(0, 8)}`;
const run = `r-${randomUUID()}`; // run ids are global across sessions: a fresh one per run
const thread = `${run}.main`;
const envelope = (key, kind, payload) => ({
  schema_version: 1,
  event_key: key,
  session_id: session,
  run_id: run,
  instance_id: "main",
  kind,
  payload,
});

// Nats-Msg-Id = <thread>/<event_key>/<first 16 hex digits of sha256 of the exact bytes published>.
const msgIdOf = (key, bytes) => `${thread}/${key}/${createHash("sha256").update(bytes).digest("hex").slice(0, 16)}`;

async function publish(key, bytes) {
  await js.publish(`ctx.events.${tenant}.${session}.${thread}`, bytes, { msgID: msgIdOf(key, bytes) });
}

async function publishEvent(event) {
  expectValid("Event", event, `event ${event.event_key}`);
  await publish(event.event_key, Buffer.from(JSON.stringify(event)));
}

async function prepare(request, where) {
  expectValid("PrepareRequest", request, where);
  const h = natsHeaders();
  h.set("ctx-deadline-ms", String(Date.now() + 30_000));
  const started = Date.now();
  const msg = await nc.request(`ctx.prepare.${tenant}.${thread}`, Buffer.from(JSON.stringify(request)), {
    timeout: 30_000,
    headers: h,
  });
  const status = msg.headers?.get("ctx-status");
  const body = json.decode(msg.data);
  expectValid(status === "ok" ? "PreparedContext" : "ErrorReply", body, where);
  expectNoNulls(body, where);
  return { status, body, ms: Date.now() - started };
}

// Dead letters are the operator's to read: a runtime identity is refused the subscription, and then
// only the prepares below tell it what was rejected.
const dead = [];
let deadVisible = true;
const deadSub = nc.subscribe(`ctx.dead.events.${thread}`);
(async () => {
  try {
    for await (const m of deadSub) dead.push(json.decode(m.data));
  } catch {
    deadVisible = false;
  }
})();

// --- A context hook this runtime serves: the fleet calls it on hooks.<tenant>.…, and every call and answer
// is checked against the schemas (the AsyncAPI document's "send_hooks" operation and the schema files).
const release = `rel-${session}`;
const hookSubject = `hooks.${tenant}.node-policy`;
const POLICY = "Node policy: pin engines in package.json.";
const hookCalls = [];
const hookSub = nc.subscribe(hookSubject);
(async () => {
  try {
    for await (const m of hookSub) {
      const call = json.decode(m.data);
      expectValid("HookCall", call, "hook call");
      expectNoNulls(call, "hook call");
      hookCalls.push(call.point);
      const reply =
        call.point === "context.prepare.before"
          ? {
              schema_version: 1,
              type: "hook_reply",
              decision: "patch",
              patch: { add: [{ category: "material", title: "engines", text: POLICY }] },
            }
          : { decision: "continue" };
      expectValid("HookReply", reply, "hook reply");
      m.respond(Buffer.from(JSON.stringify(reply)));
    }
  } catch {
    // A runtime identity without hooks.<tenant>.> may not serve hooks: nothing calls it then.
  }
})();
const hookSet = {
  release,
  hooks: [
    {
      name: "node-policy",
      version: "1",
      point: "context.prepare.before",
      subject: hookSubject,
      timeout_ms: 5000,
      grants: ["material"],
    },
  ],
};
checked.hooks_register = await ask(`ctx.hooks.register.${tenant}`, "HookSet", hookSet, "HooksRegistered");
const hooked = checked.hooks_register === "HooksRegistered";

await publishEvent({
  ...envelope("e1", "system", { text: "You are a careful coding agent." }),
  ...(hooked ? { agent_release: release } : {}),
});
await publishEvent(envelope("e2", "user_input", { text: "Why does the build fail on Node 20?" }));
await publishEvent(
  envelope("e3", "assistant_message", {
    text: "Let me look at the log.",
    tool_calls: [{ call_id: "c1", name: "read_file", args: { path: "build.log" } }],
  }),
);
await publishEvent(envelope("e4", "tool_outcome", { call_id: "c1", status: "success", text: "error: engine node>=22" }));

const base = { schema_version: 1, session_id: session, run_id: run, instance_id: "main" };
const ok = await prepare({ ...base, model_profile: "gpt-4o", after_event_key: "e4", wait_ms: 10_000 }, "prepare");
if (ok.status !== "ok") fail(`prepare answered ${ok.status}: ${JSON.stringify(ok.body)}`);
else {
  const text = JSON.stringify(ok.body.messages);
  if (!text.includes("Node 20") || !text.includes("engine node>=22")) fail("the prepared messages lack the events");
  checked.prepared_messages = ok.body.messages.length;
  if (hooked) {
    const touched = (ok.body.hooks ?? []).map((h) => `${h.source}:${h.outcome}`);
    checked.hook_touches = touched;
    if (!text.includes(POLICY)) fail("the prepared context lacks the hook's addition");
  }
}

// The schema states the validator's budget rule and the field types, and the fleet agrees with it.
const notPrepares = {
  "without a budget": { ...base, after_event_key: "e4" },
  "with a string for an integer": { ...base, budget_tokens: "8000", after_event_key: "e4" },
};
for (const [what, request] of Object.entries(notPrepares)) {
  if (fileValidator("PrepareRequest")(request)) fail(`the PrepareRequest schema accepts a request ${what}`);
  const refused = await nc.request(`ctx.prepare.${tenant}.${thread}`, Buffer.from(JSON.stringify(request)), {
    timeout: 10_000,
  });
  const refusal = json.decode(refused.data);
  expectValid("ErrorReply", refusal, `prepare ${what}`);
  if (refused.headers?.get("ctx-status") !== "error" || refusal.code !== "invalid_request") {
    fail(`a prepare ${what} answered ${JSON.stringify(refusal)}`);
  }
}

// An event without a kind is one error, not one per kind.
const validateEvent = fileValidator("Event");
const { kind: _kind, ...kindless } = envelope("e-none", "user_input", { text: "x" });
if (validateEvent(kindless)) fail("the Event schema accepts an event without a kind");
checked.missing_kind_errors = validateEvent.errors?.length ?? 0;

// --- Bad input: each is dead-lettered under its key, so a prepare waiting on it is told at once --------

const raw = (obj) => Buffer.from(JSON.stringify(obj));
const bad = [
  ["missing field", "invalid_event", "b-missing", raw(envelope("b-missing", "user_input", {}))],
  ["unknown kind", "unknown_event_kind", "b-kind", raw(envelope("b-kind", "telepathy", { text: "x" }))],
  [
    "malformed JSON",
    "malformed_json",
    "b-json",
    Buffer.from(`{"event_key": "b-json", "session_id": "${session}", "kind": "user_input", "payload": {`),
  ],
  [
    "invalid UTF-8",
    "invalid_encoding",
    "b-utf8",
    Buffer.concat([
      Buffer.from(`{"event_key": "b-utf8", "session_id": "${session}", "kind": "user_input", "payload": {"text": "`),
      Buffer.from([0xff, 0xfe]),
      Buffer.from('"}}'),
    ]),
  ],
  [
    "duplicate keys",
    "invalid_event",
    "b-dup",
    // The key twice: JSON.parse would keep the second, and the fleet refuses both.
    Buffer.from(
      JSON.stringify(envelope("b-dup", "user_input", { text: "x" })).replace('"b-dup",', '"b-dup","event_key":"b-dup2",'),
    ),
  ],
  [
    "wrong thread",
    "thread_mismatch",
    "b-thread",
    raw({ ...envelope("b-thread", "user_input", { text: "x" }), run_id: `r-${randomUUID()}` }),
  ],
];
if (maxEventBytes > 0) {
  const text = "x".repeat(maxEventBytes + 1);
  bad.push(["oversize", "payload_too_large", "b-size", raw(envelope("b-size", "user_input", { text }))]);
}
checked.bad_inputs = {};
for (const [what, code, key, bytes] of bad) {
  await publish(key, bytes);
  // wait_ms far above "at once": a reply after it would mean the key was lost and the wait ran out.
  const answer = await prepare({ ...base, budget_tokens: 8000, after_event_key: key, wait_ms: 20_000 }, what);
  const got = answer.body.details?.rejected_code;
  checked.bad_inputs[what] = { code: answer.body.code, rejected_code: got, ms: answer.ms };
  if (answer.body.code !== "event_rejected" || got !== code || answer.body.retryable !== false) {
    fail(`${what}: expected event_rejected (${code}), got ${JSON.stringify(answer.body)}`);
  } else if (answer.ms > 5_000) {
    fail(`${what}: answered after ${answer.ms} ms, not at once`);
  }
}

// The other requests of a runtime (and of an operator, where this identity may): every answer, reply or
// error, satisfies its schemas. A refused permission is the broker's answer, not the fleet's.
async function ask(subject, message, request, reply) {
  expectValid(message, request, subject);
  try {
    const msg = await nc.request(subject, Buffer.from(JSON.stringify(request)), { timeout: 10_000 });
    const body = json.decode(msg.data);
    const ok = msg.headers?.get("ctx-status") === "ok";
    expectValid(ok ? reply : "ErrorReply", body, subject);
    expectNoNulls(body, subject);
    return ok ? reply : body.code;
  } catch (e) {
    if (e.code === "PERMISSIONS_VIOLATION" || /Permissions Violation/.test(String(e))) return "not permitted";
    throw e;
  }
}
const who = { session_id: session };
checked.requests = {
  read: await ask(`ctx.read.${tenant}`, "ReadRequest", { ...who, ref: `ctx://record/${thread}/2` }, "ReadReply"),
  search: await ask(`ctx.search.${tenant}`, "SearchRequest", { ...who, query: "Node" }, "SearchReply"),
  operation_status: await ask(
    `ctx.operation.status.${tenant}`,
    "OperationStatusRequest",
    { ...who, operation_id: "never-ran" },
    "Receipt",
  ),
  inspect: await ask(`ctx.inspect.${tenant}.${thread}`, "InspectRequest", { limit: 10 }, "ThreadInspection"),
  session_inspect: await ask(`ctx.session.inspect.${tenant}.${session}`, "EmptyRequest", {}, "SessionInspection"),
  policy_register: await ask(
    `ctx.policy.register.${tenant}`,
    "ContextPolicy",
    { name: `p-${session}`, model_profile: null, budget_tokens: 6000 },
    "PolicyRegistered",
  ),
  tools_register: await ask(
    `ctx.tools.register.${tenant}`,
    "ToolCatalog",
    { release: `rel-${session}`, tools: [{ name: "read_file", idempotency: "optional" }] },
    "CatalogRegistered",
  ),
};

// The fleet keeps serving after all of it.
await publishEvent(envelope("e5", "user_input", { text: "And on Node 22?" }));
const after = await prepare({ ...base, budget_tokens: 8000, after_event_key: "e5", wait_ms: 10_000 }, "prepare after");
if (after.status !== "ok") fail(`prepare after bad input answered ${JSON.stringify(after.body)}`);

await nc.flush();
const deadline = Date.now() + 5_000;
while (deadVisible && dead.length < bad.length && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
if (deadVisible) {
  for (const letter of dead) {
    expectValid("DeadLetter", letter, `dead letter ${letter.event_key}`);
    expectNoNulls(letter, `dead letter ${letter.event_key}`);
  }
  checked.dead_letters = dead.map((d) => d.code).sort();
  if (dead.length !== bad.length) fail(`expected ${bad.length} dead letters on ctx.dead.events.${thread}, saw ${dead.length}`);
} else {
  checked.dead_letters = "not permitted to this identity";
}

checked.hook_calls = hookCalls.length;
if (hooked && hookCalls.some((p) => p !== "context.prepare.before")) fail(`hook called at ${hookCalls}`);

await nc.drain();
console.log(JSON.stringify({ ok: failures.length === 0, checked, failures }));
process.exit(failures.length === 0 ? 0 : 1);
