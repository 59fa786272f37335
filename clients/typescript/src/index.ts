// ctxfleet-client: a runtime's side of the fleet's wire contract (docs/wire.md).
export * from "./generated/wire.js";
export { DEADLINE_HEADER, DEFAULT_TENANT, FleetClient, fromEnv, optionsFromEnv, STATUS_HEADER } from "./client.js";
export type { AppendAck, FleetOptions, RequestOptions, StepReply } from "./client.js";
export {
  CONTEXT_READ,
  CONTEXT_SEARCH,
  CONTEXT_TOOL_NAMES,
  ContextTools,
  DEFAULT_LENGTH,
  DEFAULT_LINES,
  readText,
  SEARCH_LIMIT,
  searchText,
  toolCallsOf,
} from "./contextTools.js";
export type { Answered, ContextToolAnswer, ModelResponse, ModelToolCall, ReadsContext, ThreadIds } from "./contextTools.js";
export { FleetError } from "./errors.js";
export { anthropicBody, chatBody, FORMATS, providerBody, responsesBody } from "./providers.js";
export type { AnthropicMessagesBody, OpenAIChatBody, OpenAIResponsesBody, ProviderBody, RequestFormat } from "./providers.js";
