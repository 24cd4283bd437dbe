// Drives a running ringserve coordinator through the official `openai` npm client:
// completions and chat, streaming and not, usage, logprobs, n choices, min_tokens, errors, and
// cancellation on disconnect.
// Usage: node tests/ops/openai_client.mjs <base_url> [api_key]
//   base_url: e.g. http://127.0.0.1:8000/v1. With api_key, the server must require it.
// Exits 0 when every check passes; prints one line per check.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
if (!baseURL) {
  console.error("usage: openai_client.mjs <base_url> [api_key]");
  process.exit(2);
}
const client = new OpenAI({baseURL, apiKey: apiKey || "unused", maxRetries: 0, timeout: 60_000});
const metricsURL = new URL("/metrics", baseURL).toString();

let failures = 0;
async function check(name, fn) {
  const started = Date.now();
  try {
    await fn();
    console.log(`ok - ${name} (${Date.now() - started} ms)`);
  } catch (e) {
    failures++;
    console.log(`not ok - ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

async function metric(pattern) {
  const text = await (await fetch(metricsURL)).text();
  const line = text.split("\n").find((l) => l.startsWith(pattern));
  return line ? Number(line.slice(line.lastIndexOf(" ") + 1)) : NaN;
}

async function waitFor(what, predicate, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function expectApiError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status, `status: ${e.message}`);
    assert.equal(typeof e.error?.message, "string");
    if (param !== undefined) assert.equal(e.param, param);
    return e;
  }
  assert.fail(`expected HTTP ${status}, the request succeeded`);
}

const models = await client.models.list();
const model = models.data[0]?.id;

await check("models.list names the served model", async () => {
  assert.equal(models.data.length, 1);
  assert.equal(typeof model, "string");
  assert.equal(models.data[0].object, "model");
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

const prompt = "The ring of stages";
let greedyText;

await check("completions, not streaming: text, finish_reason and usage", async () => {
  const r = await client.completions.create({model, prompt, max_tokens: 12, temperature: 0});
  assert.equal(r.object, "text_completion");
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, "string");
  assert.ok(["length", "stop"].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (r.choices[0].finish_reason === "length") assert.equal(r.usage.completion_tokens, 12);
  greedyText = r.choices[0].text;
});

await check("completions, streaming: same greedy text, [DONE], usage chunk", async () => {
  const stream = await client.completions.create({
    model, prompt, max_tokens: 12, temperature: 0, stream: true,
    stream_options: {include_usage: true}});
  let text = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 2, `only ${chunks} chunks`);
  assert.equal(text, greedyText);
  assert.ok(["length", "stop"].includes(finish));
  assert.ok(usage && usage.completion_tokens > 0, "no usage chunk");
});

await check("completions with a token-id prompt", async () => {
  const r = await client.completions.create({model, prompt: [1, 2, 3, 4], max_tokens: 3,
                                             temperature: 0});
  assert.equal(r.usage.prompt_tokens, 4);
  assert.ok(r.usage.completion_tokens >= 1);
});

await check("seeded sampling repeats itself", async () => {
  const args = {model, prompt, max_tokens: 8, temperature: 0.9, top_p: 0.95, seed: 1234};
  const a = await client.completions.create(args);
  const b = await client.completions.create(args);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

const messages = [{role: "system", content: "You are terse."},
                  {role: "user", content: "Name a prime number."}];
let chatText;

await check("chat, not streaming", async () => {
  const r = await client.chat.completions.create({model, messages, max_tokens: 10,
                                                  temperature: 0});
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(r.usage.prompt_tokens > 5, "the chat template adds tokens around the messages");
  chatText = r.choices[0].message.content;
});

await check("chat, streaming: role first, same text", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 10, temperature: 0, stream: true,
    stream_options: {include_usage: true}});
  let text = "";
  let role = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, chatText);
  assert.ok(usage.completion_tokens > 0);
});

await check("concurrent streams all finish", async () => {
  const runs = Array.from({length: 6}, (_, i) => (async () => {
    const stream = await client.completions.create({
      model, prompt: `request ${i}: ${prompt}`, max_tokens: 6 + i, temperature: 0,
      stream: true, stream_options: {include_usage: true}});
    let usage = null;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    return usage;
  })());
  const usages = await Promise.all(runs);
  usages.forEach((u, i) => assert.ok(u && u.completion_tokens >= 1 && u.completion_tokens <= 6 + i));
});

await check("completions logprobs: tokens, token_logprobs, top_logprobs, text_offset", async () => {
  const r = await client.completions.create({
    model, prompt, max_tokens: 5, temperature: 0, logprobs: 3, ignore_eos: true});
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  assert.equal(lp.top_logprobs.length, 5);
  assert.equal(lp.text_offset.length, 5);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 0; i < 5; i++) {
    assert.equal(typeof lp.tokens[i], "string");
    assert.ok(lp.token_logprobs[i] <= 0, `logprob ${lp.token_logprobs[i]}`);
    const alts = Object.values(lp.top_logprobs[i]);
    assert.ok(alts.length >= 1 && alts.length <= 3, JSON.stringify(lp.top_logprobs[i]));
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(Math.max(...alts) - lp.token_logprobs[i]) < 1e-6);
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
  // logprobs: 0 gives the sampled tokens' logprobs only.
  const bare = await client.completions.create({model, prompt, max_tokens: 2, logprobs: 0});
  assert.equal(bare.choices[0].logprobs.token_logprobs.length, bare.usage.completion_tokens);
  assert.equal(bare.choices[0].logprobs.top_logprobs[0], null);
});

await check("chat logprobs with top_logprobs, streaming and not", async () => {
  const args = {model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
                ignore_eos: true};
  const r = await client.chat.completions.create(args);
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const entry of content) {
    assert.equal(typeof entry.token, "string");
    assert.ok(Array.isArray(entry.bytes));
    assert.equal(entry.top_logprobs.length, 2);
    assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob);
    assert.equal(entry.top_logprobs[0].token, entry.token);
    assert.ok(Math.abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-6);
  }
  const stream = await client.chat.completions.create({...args, stream: true,
                                                       stream_options: {include_usage: true}});
  const streamed = [];
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.logprobs) streamed.push(...choice.logprobs.content);
    }
  }
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token));
  assert.deepEqual(streamed.map((e) => e.logprob), content.map((e) => e.logprob));
});

await check("n choices: indexes, seed + index per choice, usage summed", async () => {
  const args = {model, prompt, max_tokens: 6, temperature: 1.0, seed: 1234, ignore_eos: true};
  const r = await client.completions.create({...args, n: 3});
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2]);
  const byIndex = [];
  for (const c of r.choices) byIndex[c.index] = c.text;
  for (let i = 0; i < 3; i++) {
    const one = await client.completions.create({...args, seed: 1234 + i});
    assert.equal(byIndex[i], one.choices[0].text, `choice ${i} is seed + ${i}`);
  }
  assert.equal(r.usage.completion_tokens, 18);
  assert.ok(r.usage.prompt_tokens > 0);
  // Streaming chat with n: every choice gets its role, text and finish_reason.
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 3, n: 2, stream: true, ignore_eos: true,
    stream_options: {include_usage: true}});
  const finished = new Set();
  const roles = new Set();
  let usage;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.delta.role) roles.add(choice.index);
      if (choice.finish_reason) finished.add(choice.index);
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.deepEqual([...roles].sort(), [0, 1]);
  assert.deepEqual([...finished].sort(), [0, 1]);
  assert.equal(usage.completion_tokens, 6);
});

await check("min_tokens is accepted up to max_tokens", async () => {
  const r = await client.completions.create({model, prompt, max_tokens: 4, min_tokens: 4});
  assert.equal(r.usage.completion_tokens, 4);
  await expectApiError(client.completions.create({model, prompt, max_tokens: 2, min_tokens: 3}),
                       400, "min_tokens");
});

await check("errors: n, logprobs, top_logprobs, bad values, unknown model", async () => {
  await expectApiError(client.completions.create({model, prompt, n: 17}), 400, "n");
  await expectApiError(client.completions.create({model, prompt, logprobs: 21}), 400, "logprobs");
  await expectApiError(client.chat.completions.create({model, messages, top_logprobs: 2}), 400,
                       "top_logprobs");
  await expectApiError(
      client.chat.completions.create({model, messages, logprobs: true, top_logprobs: 21}), 400,
      "top_logprobs");
  await expectApiError(client.completions.create({model, prompt, temperature: 7}), 400,
                       "temperature");
  await expectApiError(client.chat.completions.create({model, messages: []}), 400, "messages");
  const e = await expectApiError(client.completions.create({model: "no-such-model", prompt}), 404,
                                 "model");
  assert.equal(e.code, "model_not_found");
  assert.ok(e instanceof OpenAI.NotFoundError);
});

if (apiKey) {
  await check("a wrong API key is refused with 401", async () => {
    const wrong = new OpenAI({baseURL, apiKey: apiKey + "-wrong", maxRetries: 0});
    const e = await expectApiError(wrong.models.list(), 401);
    assert.ok(e instanceof OpenAI.AuthenticationError);
    await expectApiError(wrong.completions.create({model, prompt, max_tokens: 1}), 401);
  });
}

await check("a client that disconnects mid-stream cancels its request", async () => {
  const before = await metric('ringserve_requests_total{api="http",outcome="cancelled"}');
  const stream = await client.completions.create({
    model, prompt, max_tokens: 200, temperature: 0, stream: true, ignore_eos: true});
  let chunks = 0;
  for await (const chunk of stream) {
    void chunk;
    if (++chunks === 2) break;  // leaving the loop aborts the HTTP request
  }
  await waitFor("the cancelled counter to move", async () =>
    (await metric('ringserve_requests_total{api="http",outcome="cancelled"}')) > before);
});

console.log(failures ? `${failures} check(s) failed` : "all checks passed");
process.exit(failures ? 1 : 0);
