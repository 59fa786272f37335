// A prepared context as the body its format names, typed as the official SDKs type their requests:
// add `model` (and Anthropic's `max_tokens`) and send it. The fleet builds each body to its
// provider's shape (services/core/providers); these functions only name the type and refuse a
// context prepared in another format.
import type { MessageParam, TextBlockParam, Tool } from "@anthropic-ai/sdk/resources/messages";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import type { FunctionTool, ResponseInput } from "openai/resources/responses/responses";

import { FleetError } from "./errors.js";
import type { PreparedContext } from "./generated/wire.js";

export type RequestFormat = NonNullable<PreparedContext["format"]>;

/** The three formats a prepare answers in (PrepareRequest.format). */
export const FORMATS: readonly RequestFormat[] = ["openai.chat", "openai.responses", "anthropic.messages"];

/** `openai.chat`: `client.chat.completions.create({ model, ...body })`. */
export interface OpenAIChatBody {
  messages: ChatCompletionMessageParam[];
  tools: ChatCompletionTool[];
}

/** `openai.responses`: `client.responses.create({ model, ...body })`. */
export interface OpenAIResponsesBody {
  instructions?: string;
  input: ResponseInput;
  tools: FunctionTool[];
}

/**
 * `anthropic.messages`: `client.messages.create({ model, max_tokens, ...body })`. `tools` is absent
 * when the prepare named none: send the runtime's own tools with a body that holds tool_use blocks,
 * which the Messages API refuses without them.
 */
export interface AnthropicMessagesBody {
  system?: TextBlockParam[];
  messages: MessageParam[];
  tools?: Tool[];
}

export type ProviderBody =
  | { format: "openai.chat"; body: OpenAIChatBody }
  | { format: "openai.responses"; body: OpenAIResponsesBody }
  | { format: "anthropic.messages"; body: AnthropicMessagesBody };

/** The context's body in its own format, tagged with it (switch on `format`). */
export function providerBody(prepared: PreparedContext): ProviderBody {
  const format = prepared.format ?? "openai.chat";
  switch (format) {
    case "openai.chat":
      return { format, body: chatBody(prepared) };
    case "openai.responses":
      return { format, body: responsesBody(prepared) };
    case "anthropic.messages":
      return { format, body: anthropicBody(prepared) };
    default:
      return unreachable(format);
  }
}

/** The Chat Completions body: the context's canonical `messages` and `tools`. */
export function chatBody(prepared: PreparedContext): OpenAIChatBody {
  expectFormat(prepared, "openai.chat");
  return { messages: prepared.messages as ChatCompletionMessageParam[], tools: prepared.tools as ChatCompletionTool[] };
}

/** The Responses body (`request`). */
export function responsesBody(prepared: PreparedContext): OpenAIResponsesBody {
  expectFormat(prepared, "openai.responses");
  return prepared.request as unknown as OpenAIResponsesBody;
}

/** The Messages body (`request`), with its cache breakpoints. */
export function anthropicBody(prepared: PreparedContext): AnthropicMessagesBody {
  expectFormat(prepared, "anthropic.messages");
  return prepared.request as unknown as AnthropicMessagesBody;
}

function expectFormat(prepared: PreparedContext, format: RequestFormat): void {
  const got = prepared.format ?? "openai.chat";
  if (got !== format || (format !== "openai.chat" && prepared.request === undefined)) {
    throw new FleetError("invalid_request", `the context was prepared as ${got}, not ${format}`, false, { format: got });
  }
}

function unreachable(value: never): never {
  throw new Error(`unhandled format ${String(value)}`);
}
