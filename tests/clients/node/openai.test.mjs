// The official openai SDK for Node against a live Switchboard stack, run by
// tests/clients/test_openai_node.py with `node --test`. The stack and the answers every client must
// agree with come in SWITCHBOARD_CLIENT_CASE (JSON): baseURL, model, prompts, maxTokens, and the
// stack's greedy chat and completion answers asked without any SDK.
import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";

const testCase = JSON.parse(process.env.SWITCHBOARD_CLIENT_CASE);
const client = new OpenAI({ baseURL: testCase.baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });
const model = testCase.model;
const greedy = { temperature: 0, max_tokens: testCase.maxTokens };
const messages = [{ role: "user", content: testCase.chatPrompt }];

async function caught(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("the request was expected to fail");
}

test("models: the list holds the model, and it can be retrieved", async () => {
  const ids = [];
  for await (const entry of client.models.list()) ids.push(entry.id);
  assert.ok(ids.includes(model), `${model} in ${ids}`);
  assert.equal((await client.models.retrieve(model)).id, model);
});

test("chat: the greedy answer, its usage, and the request id", async () => {
  const completion = await client.chat.completions.create({ model, messages, ...greedy });
  const reference = testCase.chat;
  assert.equal(completion.choices[0].message.content, reference.text);
  assert.equal(completion.choices[0].finish_reason, reference.finish_reason);
  assert.equal(completion.usage.completion_tokens, reference.completion_tokens);
  assert.equal(completion.usage.prompt_tokens, reference.prompt_tokens);
  assert.ok(completion._request_id, "x-request-id on the response");
  assert.equal(completion.id, `chatcmpl-${completion._request_id}`);
});

test("completions: the greedy answer, its usage, and the request id", async () => {
  const completion = await client.completions.create({ model, prompt: testCase.completionPrompt, ...greedy });
  const reference = testCase.completion;
  assert.equal(completion.choices[0].text, reference.text);
  assert.equal(completion.usage.completion_tokens, reference.completion_tokens);
  assert.ok(completion._request_id);
  assert.equal(completion.id, `cmpl-${completion._request_id}`);
});

test("chat stream: the same text, usage in a last chunk of its own, and the request id", async () => {
  const { data: stream, request_id } = await client.chat.completions
    .create({ model, messages, ...greedy, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
  assert.equal(text, testCase.chat.text);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, testCase.chat.completion_tokens);
  assert.ok(request_id, "x-request-id on a streamed response");
  assert.deepEqual([...new Set(chunks.map((c) => c.id))], [`chatcmpl-${request_id}`]);
});

test("completions stream: the same text and its usage", async () => {
  const stream = await client.completions.create({
    model,
    prompt: testCase.completionPrompt,
    ...greedy,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks.map((c) => c.choices[0]?.text ?? "").join(""), testCase.completion.text);
  assert.equal(chunks.at(-1).usage.completion_tokens, testCase.completion.completion_tokens);
});

test("errors: an unknown model is the SDK's NotFoundError, with OpenAI's code and a request id", async () => {
  const error = await caught(client.chat.completions.create({ model: "no-such-model", messages }));
  assert.ok(error instanceof OpenAI.NotFoundError, String(error));
  assert.equal(error.status, 404);
  assert.equal(error.code, "model_not_found");
  assert.ok(error.requestID, "x-request-id on an error response");
});

test("errors: a value out of bounds is the SDK's BadRequestError naming the parameter", async () => {
  const error = await caught(client.chat.completions.create({ model, messages, ...greedy, temperature: 5 }));
  assert.ok(error instanceof OpenAI.BadRequestError, String(error));
  assert.equal(error.status, 400);
  assert.equal(error.param, "temperature");
  assert.ok(error.requestID);
});

test("abort: an AbortController ends a stream mid-way; the next request is answered", async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model, messages, temperature: 0, max_tokens: 200, stream: true },
    { signal: controller.signal },
  );
  // The SDK ends the iteration quietly when its own signal aborts it.
  const received = [];
  for await (const chunk of stream) {
    received.push(chunk);
    controller.abort();
  }
  assert.equal(received.length, 1, "nothing is delivered after the abort");
  assert.equal(received[0].choices[0].finish_reason, null, "aborted mid-way, not at the end");
  assert.ok(controller.signal.aborted);
  const after = await client.chat.completions.create({ model, messages, ...greedy });
  assert.equal(after.choices[0].message.content, testCase.chat.text);
});

test("responses: the chat's greedy answer and usage, and the stream helper's final response", async () => {
  const request = { model, input: testCase.chatPrompt, temperature: 0, max_output_tokens: testCase.maxTokens };
  const response = await client.responses.create(request);
  const reference = testCase.chat;
  assert.equal(response.output_text, reference.text);
  assert.equal(response.usage.output_tokens, reference.completion_tokens);
  assert.equal(response.usage.input_tokens, reference.prompt_tokens);
  assert.equal(response.id, `resp_${response._request_id}`);
  assert.equal(response.status, reference.finish_reason === "length" ? "incomplete" : "completed");
  const stream = client.responses.stream(request);
  let text = "";
  let last;
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
    last = event;
  }
  const final = await stream.finalResponse();
  assert.equal(text, reference.text);
  // The SDK's final response of a stream has its items, not the `output_text` shortcut.
  assert.equal(final.output[0].content[0].text, reference.text);
  assert.equal(last.type, `response.${response.status}`);
  assert.equal(last.response.usage.output_tokens, reference.completion_tokens);
});
