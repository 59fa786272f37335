// The official TypeScript SDKs pointed at `ctxfleet proxy`: one tool-using conversation per API and mode,
// each to its end. Driven by tests/integration/test_proxy_node.py, which scripts the upstream's
// answers and checks what it received and what the fleet recorded. Prints each conversation as it stands.
// Run: node .proxy-test/proxy-conversations.js <proxy URL> <plan.json>
import { readFileSync } from "node:fs";

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

type Api = "chat" | "responses" | "messages";

interface Conversation {
  api: Api;
  stream: boolean;
  thread: string;
  topic: string;
}

interface Plan {
  key: string;
  system: string;
  model: { openai: string; anthropic: string };
  files: Record<string, string>;
  conversations: Conversation[];
}

const [proxyUrl, planPath] = process.argv.slice(2);
if (proxyUrl === undefined || planPath === undefined) {
  throw new Error("usage: proxy-conversations.js <proxy URL> <plan.json>");
}
const plan = JSON.parse(readFileSync(planPath, "utf8")) as Plan;

function readFile(args: string): string {
  const { path } = JSON.parse(args) as { path: string };
  const content = plan.files[path];
  if (content === undefined) throw new Error(`the model read a file the plan does not hold: ${path}`);
  return content;
}

const pathParameter = { type: "object", properties: { path: { type: "string" } } } as const;
const chatTools: OpenAI.Chat.ChatCompletionTool[] = [
  {
    type: "function",
    function: { name: "read_file", description: "Read a file", parameters: pathParameter },
  },
];
const responsesTools: OpenAI.Responses.Tool[] = [
  {
    type: "function",
    name: "read_file",
    description: "Read a file",
    parameters: pathParameter,
    strict: false,
  },
];
const anthropicTools: Anthropic.Tool[] = [
  { name: "read_file", description: "Read a file", input_schema: pathParameter },
];

function openai(thread: string): OpenAI {
  return new OpenAI({
    apiKey: plan.key,
    baseURL: `${proxyUrl}/v1`,
    defaultHeaders: { "ctx-thread": thread },
    maxRetries: 0,
  });
}

async function chat(c: Conversation): Promise<OpenAI.Chat.ChatCompletionMessageParam[]> {
  const sdk = openai(c.thread);
  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
    { role: "system", content: plan.system },
    { role: "user", content: c.topic },
  ];
  for (;;) {
    const body = { model: plan.model.openai, messages, tools: chatTools };
    const completion = c.stream
      ? await sdk.chat.completions.stream(body).finalChatCompletion()
      : await sdk.chat.completions.create(body);
    const message = completion.choices[0]?.message;
    if (message === undefined) throw new Error("a completion without a choice");
    const calls = (message.tool_calls ?? []).flatMap((call) => (call.type === "function" ? [call] : []));
    messages.push({
      role: "assistant",
      content: message.content,
      ...(calls.length > 0
        ? {
            tool_calls: calls.map(({ id, type, function: f }) => ({
              id,
              type,
              function: { name: f.name, arguments: f.arguments },
            })),
          }
        : {}),
    });
    if (calls.length === 0) return messages;
    for (const call of calls) {
      messages.push({ role: "tool", tool_call_id: call.id, content: readFile(call.function.arguments) });
    }
  }
}

async function responses(c: Conversation): Promise<OpenAI.Responses.ResponseInputItem[]> {
  const sdk = openai(c.thread);
  const input: OpenAI.Responses.ResponseInputItem[] = [{ role: "user", content: c.topic }];
  for (;;) {
    const body = { model: plan.model.openai, instructions: plan.system, input, tools: responsesTools };
    const response = c.stream
      ? await sdk.responses.stream(body).finalResponse()
      : await sdk.responses.create(body);
    const calls: OpenAI.Responses.ResponseFunctionToolCall[] = [];
    for (const item of response.output) {
      if (item.type === "message") {
        input.push(item);
      } else if (item.type === "function_call") {
        input.push(item);
        calls.push(item);
      }
    }
    if (calls.length === 0) return input;
    for (const call of calls) {
      input.push({ type: "function_call_output", call_id: call.call_id, output: readFile(call.arguments) });
    }
  }
}

async function messages(c: Conversation): Promise<Anthropic.MessageParam[]> {
  const sdk = new Anthropic({
    apiKey: plan.key,
    baseURL: proxyUrl,
    defaultHeaders: { "ctx-thread": c.thread },
    maxRetries: 0,
  });
  const said: Anthropic.MessageParam[] = [{ role: "user", content: c.topic }];
  for (;;) {
    const body = {
      model: plan.model.anthropic,
      max_tokens: 1024,
      system: plan.system,
      messages: said,
      tools: anthropicTools,
    };
    const reply = c.stream ? await sdk.messages.stream(body).finalMessage() : await sdk.messages.create(body);
    const content: Anthropic.ContentBlockParam[] = reply.content.flatMap(
      (b): Anthropic.ContentBlockParam[] => {
        switch (b.type) {
          case "text":
            return [{ type: "text", text: b.text }];
          case "tool_use":
            return [{ type: "tool_use", id: b.id, name: b.name, input: b.input }];
          default:
            throw new Error(`a block the scripted upstream does not send: ${b.type}`);
        }
      },
    );
    said.push({ role: "assistant", content });
    const results: Anthropic.ToolResultBlockParam[] = reply.content.flatMap((b) =>
      b.type === "tool_use"
        ? [{ type: "tool_result" as const, tool_use_id: b.id, content: readFile(JSON.stringify(b.input)) }]
        : [],
    );
    if (results.length === 0) return said;
    said.push({ role: "user", content: results });
  }
}

const run: Record<Api, (c: Conversation) => Promise<unknown[]>> = { chat, responses, messages };
// One after the other: the upstream answers in the order the plan's conversations ask.
const done = [];
for (const c of plan.conversations) done.push({ ...c, said: await run[c.api](c) });
process.stdout.write(`${JSON.stringify(done)}\n`);
