// One error type for everything the fleet or the connection answers: the fleet's ErrorReply code,
// or the code the Python client would raise for the same condition (fleet_unavailable,
// permission_denied, invalid_request), so a runtime branches on `code` and `retryable` alone.
import type { ErrorCode, ErrorReply } from "./generated/wire.js";

export class FleetError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly details: Readonly<Record<string, unknown>>;

  constructor(code: ErrorCode, message: string, retryable: boolean, details: Record<string, unknown> = {}) {
    super(`${code}: ${message}`);
    this.name = "FleetError";
    this.code = code;
    this.retryable = retryable;
    this.details = details;
  }

  /** The error an ErrorReply body stands for. */
  static of(reply: ErrorReply): FleetError {
    return new FleetError(reply.code, reply.message, reply.retryable ?? false, reply.details ?? {});
  }
}
