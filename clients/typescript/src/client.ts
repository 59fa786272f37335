// The fleet over NATS, for one tenant: publish events, prepare contexts, read back, search.
//
// A client speaks for one tenant: every subject it uses names it, and the NATS server's permissions
// decide whether this identity may. Replies come back on inboxes under _INBOX.<user>, the only ones
// a runtime identity may subscribe to. Every request carries the caller's deadline
// (ctx-deadline-ms), so an assembler never computes an answer nobody waits for.
import { createHash } from "node:crypto";

import { connect, headers as natsHeaders, type NatsConnection, type JetStreamClient } from "nats";

import { FleetError } from "./errors.js";
import type {
  ErrorReply,
  Event,
  PreparedContext,
  PrepareRequest,
  ReadReply,
  ReadRequest,
  SearchReply,
  SearchRequest,
} from "./generated/wire.js";

/** The tenant of a client that names none, as the fleet's CTX_TENANT defaults. */
export const DEFAULT_TENANT = "default";
/** The request header with the caller's deadline (epoch ms): an assembler drops a request past it. */
export const DEADLINE_HEADER = "ctx-deadline-ms";
/** The label of every reply: "ok" (the request's reply) or "error" (an ErrorReply). */
export const STATUS_HEADER = "ctx-status";
// PrepareRequest.wait_ms when the request says none (contracts/prepare.py).
const DEFAULT_WAIT_MS = 5_000;
const PUBLISH_TIMEOUT_MS = 10_000;
const REQUEST_TIMEOUT_MS = 10_000;
// Subject tokens: a dot would split one, a wildcard would widen it (docs/wire.md, "Subjects").
const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;
// A longer subject overruns the server's protocol line and costs the connection.
const MAX_SUBJECT = 1_024;

/** Where the fleet is and who this client is. */
export interface FleetOptions {
  /** One URL per server of the cluster. */
  servers: string[];
  user?: string;
  password?: string;
  tenant?: string;
  /** The connection's name, as the server shows it. */
  name?: string;
}

/** Where JetStream stored an event, and whether it was a duplicate publish. */
export interface AppendAck {
  streamSeq: number;
  duplicate: boolean;
}

/** One step's outcome: where its event was stored, and the prepared context that includes it. */
export interface StepReply {
  ack: AppendAck;
  prepared: PreparedContext;
}

export interface RequestOptions {
  timeoutMs?: number;
}

type Env = Readonly<Record<string, string | undefined>>;

/**
 * The options `ctxfleet env` prints, from the environment: CTX_NATS_URL (a cluster's URLs
 * comma-separated; credentials in a URL serve every server), CTX_NATS_USER, CTX_NATS_PASSWORD,
 * CTX_TENANT.
 */
export function optionsFromEnv(env: Env = process.env): FleetOptions {
  const url = env.CTX_NATS_URL;
  if (!url) {
    throw new FleetError("invalid_configuration", "CTX_NATS_URL is not set: eval \"$(ctxfleet env)\" first", false);
  }
  let user = env.CTX_NATS_USER || undefined;
  let password = env.CTX_NATS_PASSWORD || undefined;
  const servers: string[] = [];
  for (const entry of url.split(",").map((u) => u.trim()).filter(Boolean)) {
    const parsed = new URL(entry.includes("://") ? entry : `nats://${entry}`);
    if (parsed.username && user === undefined) {
      user = decodeURIComponent(parsed.username);
      password = decodeURIComponent(parsed.password);
    }
    parsed.username = "";
    parsed.password = "";
    servers.push(`${parsed.protocol}//${parsed.host}`);
  }
  return { servers, user, password, tenant: env.CTX_TENANT || DEFAULT_TENANT };
}

/** A client connected with what `ctxfleet env` printed into the environment. */
export async function fromEnv(env: Env = process.env): Promise<FleetClient> {
  return FleetClient.connect(optionsFromEnv(env));
}

export class FleetClient {
  readonly tenant: string;
  readonly #nc: NatsConnection;
  readonly #js: JetStreamClient;

  private constructor(nc: NatsConnection, tenant: string) {
    this.#nc = nc;
    this.#js = nc.jetstream({ timeout: PUBLISH_TIMEOUT_MS });
    this.tenant = tenant;
  }

  /** Connect; a wrong URL or password fails now, a connection lost later reconnects for ever. */
  static async connect(options: FleetOptions): Promise<FleetClient> {
    const tenant = checkToken(options.tenant ?? DEFAULT_TENANT, "tenant");
    try {
      const nc = await connect({
        servers: options.servers,
        name: options.name ?? "ctxfleet-client-ts",
        maxReconnectAttempts: -1,
        ...(options.user
          ? { user: options.user, pass: options.password ?? "", inboxPrefix: `_INBOX.${options.user}` }
          : {}),
      });
      return new FleetClient(nc, tenant);
    } catch (err) {
      throw new FleetError("fleet_unavailable", `cannot connect to NATS at ${options.servers.join(",")}: ${err}`, true);
    }
  }

  /** Drain and close the connection. */
  async close(): Promise<void> {
    if (!this.#nc.isClosed()) await this.#nc.drain();
  }

  /** Publish one event; resolves once JetStream stored it. */
  async publish(event: Event): Promise<AppendAck> {
    const data = Buffer.from(JSON.stringify(event));
    const thread = `${checkToken(event.run_id, "run_id")}.${checkToken(event.instance_id, "instance_id")}`;
    const subject = checkSubject(`ctx.events.${this.tenant}.${checkToken(event.session_id, "session_id")}.${thread}`);
    const limit = this.#nc.info?.max_payload;
    if (limit !== undefined && data.length > limit) {
      throw new FleetError("payload_too_large", `the event is ${data.length} bytes, over ${limit}`, false, {
        size: data.length,
        limit,
      });
    }
    // Nats-Msg-Id: JetStream drops a byte-identical retry within its window (docs/wire.md).
    const msgID = `${thread}/${event.event_key}/${createHash("sha256").update(data).digest("hex").slice(0, 16)}`;
    try {
      const ack = await this.#js.publish(subject, data, { msgID, timeout: PUBLISH_TIMEOUT_MS });
      return { streamSeq: ack.seq, duplicate: ack.duplicate };
    } catch (err) {
      throw fromNats(err, subject);
    }
  }

  /** The prepared context for the request's thread. */
  async prepare(request: PrepareRequest, options: RequestOptions = {}): Promise<PreparedContext> {
    const thread = `${checkToken(request.run_id, "run_id")}.${checkToken(request.instance_id, "instance_id")}`;
    const timeoutMs = options.timeoutMs ?? (request.wait_ms ?? DEFAULT_WAIT_MS) + 10_000;
    return this.#request<PreparedContext>(`ctx.prepare.${this.tenant}.${thread}`, request, timeoutMs);
  }

  /**
   * One agent step: publish `event` and get the prepared context that includes it. The prepare
   * names the event (after_event_key) and is sent with the publish, not after its ack: the
   * assembler waits for the event to be recorded either way. A failed publish wins: its error is
   * thrown and the prepare abandoned. The whole step can be retried with the same event.
   */
  async appendAndPrepare(event: Event, request: PrepareRequest, options: RequestOptions = {}): Promise<StepReply> {
    const asked = [request.session_id, request.run_id, request.instance_id].join(".");
    const recorded = [event.session_id, event.run_id, event.instance_id].join(".");
    if (asked !== recorded) {
      throw new FleetError("invalid_request", "a step's prepare must be for its event's session and thread", false, {
        event: recorded,
        request: asked,
      });
    }
    if (request.after_event_key != null && request.after_event_key !== event.event_key) {
      throw new FleetError("invalid_request", "a step's prepare names the step's own event", false, {
        event_key: event.event_key,
        after_event_key: request.after_event_key,
      });
    }
    const prepared = this.prepare({ ...request, after_event_key: event.event_key }, options);
    // Abandoned when the publish fails: its own error would only be not_yet_recorded.
    prepared.catch(() => undefined);
    const ack = await this.publish(event);
    return { ack, prepared: await prepared };
  }

  /** A verified range of stored content (ctx://blob/… or ctx://record/…) of the request's session. */
  async read(request: ReadRequest, options: RequestOptions = {}): Promise<ReadReply> {
    return this.#request<ReadReply>(`ctx.read.${this.tenant}`, request, options.timeoutMs ?? REQUEST_TIMEOUT_MS);
  }

  /** Full-text search within the request's session: pointers to read back. */
  async search(request: SearchRequest, options: RequestOptions = {}): Promise<SearchReply> {
    return this.#request<SearchReply>(`ctx.search.${this.tenant}`, request, options.timeoutMs ?? REQUEST_TIMEOUT_MS);
  }

  async #request<Reply>(subject: string, body: unknown, timeoutMs: number): Promise<Reply> {
    checkSubject(subject);
    const h = natsHeaders();
    h.set(DEADLINE_HEADER, String(Date.now() + timeoutMs));
    let reply;
    try {
      reply = await this.#nc.request(subject, Buffer.from(JSON.stringify(body)), { timeout: timeoutMs, headers: h });
    } catch (err) {
      throw fromNats(err, subject);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(new TextDecoder().decode(reply.data));
    } catch (err) {
      throw new FleetError("internal_error", `unreadable reply on ${subject}: ${String(err)}`, false);
    }
    const status = reply.headers?.get(STATUS_HEADER);
    const isError = status ? status === "error" : (parsed as { type?: unknown }).type === "error";
    if (isError) throw FleetError.of(parsed as ErrorReply);
    return parsed as Reply;
  }
}

function checkToken(value: string, name: string): string {
  if (!TOKEN.test(value)) {
    throw new FleetError("invalid_request", `${name} must be 1 to 128 letters, digits, _ or -, not ${JSON.stringify(value)}`, false);
  }
  return value;
}

function checkSubject(subject: string): string {
  if (subject.length > MAX_SUBJECT) {
    throw new FleetError("invalid_request", `the subject is ${subject.length} characters, over ${MAX_SUBJECT}`, false);
  }
  return subject;
}

// nats.js errors as the fleet's codes: the same conditions the Python client maps.
function fromNats(err: unknown, subject: string): FleetError {
  const code = (err as { code?: unknown }).code;
  switch (code) {
    case "PERMISSIONS_VIOLATION":
      return new FleetError("permission_denied", `this identity may not use ${subject}`, false, { subject });
    case "MAX_PAYLOAD_EXCEEDED":
      return new FleetError("payload_too_large", `the message to ${subject} is over the server's max_payload`, false);
    case "503":
      return new FleetError("fleet_unavailable", `no fleet worker is serving ${subject}`, true);
    case "TIMEOUT":
      return new FleetError("fleet_unavailable", `no reply on ${subject} in time`, true);
    default:
      return new FleetError("fleet_unavailable", `${subject}: ${String(err)}`, true);
  }
}
