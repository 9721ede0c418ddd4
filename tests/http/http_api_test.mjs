// End-to-end tests of `fucina serve`'s HTTP front end on a real model: the official OpenAI and
// Anthropic SDKs as clients, the server-sent-event grammar checked event by event, logprobs,
// stop strings, every documented error, the request limits, disconnects, load with `hey`, and a
// time-to-first-token report.
//
//   FUCINA_BIN=build/tools/fucina FUCINA_DEFAULT_MODEL=.../SmolLM2-135M-Instruct.Q4_1.gguf \
//   FUCINA_NPM_DIR=~/.cache/fucina/npm/node_modules node --test tests/http/http_api_test.mjs
//
// Every server binds port 0 and prints `listening grpc=... metrics=... http=...`, so tests never
// collide with another server on the machine; readiness is polled on /health, never slept for.
import {after, before, describe, test} from "node:test";
import assert from "node:assert/strict";
import {execFile, spawn} from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import {createRequire} from "node:module";
import path from "node:path";
import {listeningLine, terminate} from "./serve_process.mjs";

const BIN = process.env.FUCINA_BIN;
const MODEL = process.env.FUCINA_DEFAULT_MODEL;
const SKIP = !MODEL ? "FUCINA_DEFAULT_MODEL is not set" : !BIN ? "FUCINA_BIN is not set" : false;

// A served name unlike the model's own, so a handler that echoes general.name instead shows up.
const SERVED = "fucina-http-test";
const SYSTEM = "You are a helpful assistant.";
const FRANCE = "What is the capital of France?";
const FRANCE_MESSAGES = [
  {role: "system", content: SYSTEM},
  {role: "user", content: FRANCE},
];

// ---- npm packages (FUCINA_NPM_DIR: the npm prefix or its node_modules folder) ----

// The SDK's CommonJS entry point: ESM resolution ignores NODE_PATH, so it is resolved from the
// prefix explicitly. Null when FUCINA_NPM_DIR is unset (those tests skip); a set directory
// without the package is a set-up error and fails loudly.
function loadSdk(name) {
  let dir = process.env.FUCINA_NPM_DIR;
  if (!dir) return null;
  if (path.basename(dir) === "node_modules") dir = path.dirname(dir);
  const require = createRequire(path.join(dir, "package.json"));
  try {
    return require(name);
  } catch (e) {
    throw new Error(`npm package ${name} not found under ${dir} (scripts/lib.sh installs ` +
                    `scripts/npm/package.json there): ${e.message}`);
  }
}
const SDK_SKIP = process.env.FUCINA_NPM_DIR ? false : "FUCINA_NPM_DIR is not set";

// ---- servers ----

const live = new Set();
// A crashed test run must not leave servers behind.
process.on("exit", () => {
  for (const s of live) s.child.kill("SIGKILL");
});

// Starts `fucina serve` on free ports and waits until /health answers 200 (asked with
// `healthHost` as the Host header when the server filters hosts). A server that fails to come up
// is killed, so it cannot keep the test process alive.
async function startServer(args = [], {threads = 1, healthHost} = {}) {
  const argv = ["serve", MODEL, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                "--http", "127.0.0.1:0", "--threads", String(threads), "--temp", "0",
                "--served-model-name", SERVED, ...args];
  const child = spawn(BIN, argv, {stdio: ["ignore", "pipe", "pipe"]});
  const server = {child, stderr: "", args};
  live.add(server);
  try {
    await awaitReady(server, healthHost);
  } catch (e) {
    await stopServer(server);
    throw e;
  }
  return server;
}

async function awaitReady(server, healthHost) {
  const {child} = server;
  child.stderr.on("data", (d) => {
    server.stderr = (server.stderr + d).slice(-4000);
  });
  const line = await listeningLine(child, server);
  const m = /^listening grpc=(\S+) metrics=(\S+) http=(\S+)$/.exec(line);
  assert.ok(m, `unexpected first line: ${line}`);
  [, server.grpc, server.metrics, server.http] = m;
  server.base = `http://${server.http}`;
  const deadline = Date.now() + 60000;
  for (;;) {
    const headers = healthHost ? {host: healthHost} : {};
    const r = await call(server, "GET", "/health", {headers})
                  .catch((e) => ({status: 0, text: e.message}));
    if (r.status === 200) break;
    // 503 means "loading"; anything else is a bug, not a reason to keep waiting.
    assert.ok(r.status === 503 || r.status === 0, `/health answered ${r.status}: ${r.text}`);
    assert.ok(Date.now() < deadline, `not healthy within 60 s: ${r.text}\n${server.stderr}`);
    await sleep(50);
  }
}

async function stopServer(server) {
  if (!server) return;
  live.delete(server);
  if (server.child.exitCode !== null || server.child.signalCode !== null) return;
  await terminate(server.child);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- HTTP helpers ----

// One request on its own connection (no keep-alive pool, so Host and body framing are exactly
// what the test says). `body`: an object (sent as JSON) or a string (sent as is).
function call(server, method, urlPath, {body, headers = {}, chunked = false} = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined
                 : typeof body === "string" ? body : JSON.stringify(body);
    const h = {...headers};
    if (data !== undefined) {
      h["content-type"] ??= "application/json";
      if (!chunked) h["content-length"] = Buffer.byteLength(data);
    }
    const [host, port] = server.http.split(":");
    const req = http.request({host, port: Number(port), method, path: urlPath, headers: h,
                              agent: false}, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => {
        let json;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({status: res.statusCode, headers: res.headers, text, json});
      });
      res.on("error", reject);
    });
    req.setTimeout(120000, () => req.destroy(new Error(`${method} ${urlPath} timed out`)));
    req.on("error", reject);
    if (data !== undefined) {
      if (chunked) {
        // Several chunks, as a streaming client would send them.
        for (let i = 0; i < data.length; i += 256) req.write(data.slice(i, i + 256));
      } else {
        req.write(data);
      }
    }
    req.end();
  });
}

const post = (server, urlPath, body, headers) => call(server, "POST", urlPath, {body, headers});

async function postOk(server, urlPath, body) {
  const r = await post(server, urlPath, body);
  assert.equal(r.status, 200, `${urlPath} answered ${r.status}: ${r.text}`);
  return r.json;
}

// Reads a server-sent-event stream with fetch and checks the grammar of every event as it
// arrives: `data: <json>\n\n` (or `data: [DONE]\n\n`) when `typed` is false, and
// `event: <name>\ndata: <json>\n\n` with json.type == name when it is true. Returns the events
// ({event, data, json, at}) and the response headers. `onEvent` may return "abort" to
// disconnect.
async function readSse(server, urlPath, body, {typed = false, headers = {}, onEvent} = {}) {
  const controller = new AbortController();
  const started = performance.now();
  const res = await fetch(`${server.base}${urlPath}`, {
    method: "POST",
    headers: {"content-type": "application/json", ...headers},
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  if (res.status !== 200) assert.fail(`${urlPath} stream answered ${res.status}: ${await res.text()}`);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
  const events = [];
  const decoder = new TextDecoder();
  let buffer = "";
  let aborted = false;
  try {
    for await (const chunk of res.body) {
      buffer += decoder.decode(chunk, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const e = parseEvent(block, typed);
        e.at = performance.now() - started;
        events.push(e);
        if (onEvent && (await onEvent(e, events)) === "abort") {
          aborted = true;
          controller.abort();
          break;
        }
      }
      if (aborted) break;
    }
  } catch (e) {
    if (!aborted) throw e;
  }
  if (!aborted) {
    buffer += decoder.decode();
    assert.equal(buffer, "", "the stream ended inside an event");
  }
  return {events, headers: res.headers, aborted};
}

function parseEvent(block, typed) {
  const lines = block.split("\n");
  if (!typed) {
    assert.equal(lines.length, 1, `one data line per event, got ${JSON.stringify(block)}`);
    assert.ok(lines[0].startsWith("data: "), `not a data line: ${JSON.stringify(block)}`);
    const data = lines[0].slice(6);
    if (data === "[DONE]") return {event: null, data, json: null};
    return {event: null, data, json: JSON.parse(data)};
  }
  assert.equal(lines.length, 2, `event + data lines expected, got ${JSON.stringify(block)}`);
  const m = /^event: ([a-z_.]+)$/.exec(lines[0]);
  assert.ok(m, `not an event line: ${JSON.stringify(lines[0])}`);
  assert.ok(lines[1].startsWith("data: "), `not a data line: ${JSON.stringify(lines[1])}`);
  const json = JSON.parse(lines[1].slice(6));
  assert.equal(json.type, m[1], "the data's type names its event");
  return {event: m[1], data: lines[1].slice(6), json};
}

// Checks a chat.completion.chunk stream (see test 2) and returns what it carried.
function checkChatStream(events, {includeUsage}) {
  assert.ok(events.length >= 3, "at least role, finish and [DONE] chunks");
  assert.equal(events.at(-1).data, "[DONE]", "the stream ends with data: [DONE]");
  const chunks = events.slice(0, -1).map((e) => e.json);
  assert.ok(chunks.every((c) => c !== null), "[DONE] only at the end");
  const {id, created} = chunks[0];
  assert.match(id, /^chatcmpl-/);
  let text = "";
  let finishes = 0;
  let finish = null;
  let usage = null;
  const logprobs = [];
  chunks.forEach((c, i) => {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, id, "every chunk shares the id");
    assert.equal(c.created, created, "every chunk shares created");
    assert.equal(c.model, SERVED);
    if (c.choices.length === 0) {
      assert.ok(includeUsage, "an empty-choices chunk only with include_usage");
      assert.equal(i, chunks.length - 1, "the usage chunk is the last before [DONE]");
      usage = c.usage;
      return;
    }
    assert.equal(c.usage ?? null, null, "usage only on the final chunk");
    assert.equal(c.choices.length, 1);
    const ch = c.choices[0];
    assert.equal(ch.index, 0);
    if (i === 0) assert.equal(ch.delta.role, "assistant", "the first delta has the role");
    else assert.equal(ch.delta.role, undefined, "only the first delta has the role");
    if (ch.finish_reason !== null) {
      finishes++;
      finish = ch.finish_reason;
    } else {
      assert.equal(finishes, 0, "nothing after the finish_reason chunk but usage");
    }
    if (typeof ch.delta.content === "string") text += ch.delta.content;
    if (ch.logprobs) logprobs.push(...ch.logprobs.content);
  });
  assert.equal(finishes, 1, "exactly one finish_reason");
  if (includeUsage) {
    assert.ok(usage, "include_usage adds a final usage chunk");
    assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
    assert.ok(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    assert.equal(typeof usage.prompt_tokens_details.cached_tokens, "number");
  }
  return {text, finish, usage, logprobs};
}

function assertOpenAiError(r, status, {messageMatch, param, code, type} = {}) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.match(r.headers["content-type"] ?? "", /application\/json/);
  assert.ok(r.json && typeof r.json.error === "object", `OpenAI error shape: ${r.text}`);
  const e = r.json.error;
  assert.deepEqual(Object.keys(e).sort(), ["code", "message", "param", "type"]);
  assert.equal(typeof e.message, "string");
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, "string");
  if (messageMatch) assert.match(e.message, messageMatch);
  if (param !== undefined) assert.equal(e.param, param);
  if (code !== undefined) assert.equal(e.code, code);
  if (type !== undefined) assert.equal(e.type, type);
  return e;
}

function assertAnthropicError(r, status, {type, messageMatch} = {}) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.ok(r.json, `JSON body: ${r.text}`);
  assert.equal(r.json.type, "error", `Anthropic error shape: ${r.text}`);
  assert.equal(typeof r.json.error?.type, "string");
  assert.equal(typeof r.json.error?.message, "string");
  if (type) assert.equal(r.json.error.type, type);
  if (messageMatch) assert.match(r.json.error.message, messageMatch);
  return r.json.error;
}

async function metric(server, name) {
  const r = await call(server, "GET", "/metrics");
  assert.equal(r.status, 200);
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(r.text);
  assert.ok(m, `${name} missing from /metrics`);
  return Number(m[1]);
}

// Polls until `name` equals `want`; returns the milliseconds it took (bounded by `limitMs`).
async function waitMetric(server, name, want, limitMs) {
  const t0 = performance.now();
  for (;;) {
    const v = await metric(server, name);
    const ms = performance.now() - t0;
    if (v === want) return ms;
    assert.ok(ms < limitMs, `${name} is ${v}, not ${want}, after ${Math.round(ms)} ms`);
    await sleep(50);
  }
}

// A stop string from the middle of `text`, starting wherever the middle falls (usually inside a
// token, which exercises the hold-back of a partial match); its first occurrence is there.
function middleStop(text) {
  for (let at = Math.floor(text.length / 2); at + 6 <= text.length; at++) {
    const s = text.slice(at, at + 6);
    if (s.trim().length >= 3 && text.indexOf(s) === at) return {stop: s, at};
  }
  assert.fail(`no usable stop string in ${JSON.stringify(text)}`);
}

function percentile(values, q) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)];
}

function findHey() {
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    const p = path.join(dir, "hey");
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch {}
  }
  return null;
}
const HEY = findHey();

// Runs hey and parses its "Status code distribution" and "Error distribution" sections.
function runHey(args) {
  return new Promise((resolve, reject) => {
    execFile(HEY, args, {timeout: 120000}, (err, stdout, stderr) => {
      if (err) return reject(new Error(`hey failed: ${err.message}\n${stderr}`));
      const codes = {};
      const status = /Status code distribution:\n((?:\s+\[\d+\]\s+\d+ responses?\n?)*)/.exec(stdout);
      for (const m of (status?.[1] ?? "").matchAll(/\[(\d+)\]\s+(\d+) responses?/g)) {
        codes[m[1]] = Number(m[2]);
      }
      let errors = 0;
      const errorSection = /Error distribution:\n([\s\S]*)$/.exec(stdout);
      for (const m of (errorSection?.[1] ?? "").matchAll(/^\s+\[(\d+)\]\s/gm)) errors += Number(m[1]);
      resolve({codes, errors, stdout});
    });
  });
}

const heyBody = (maxTokens, extra = {}) =>
  JSON.stringify({prompt: "Hi", max_tokens: maxTokens, temperature: 0, ...extra});

// ---- the tests ----

describe("fucina HTTP API", {skip: SKIP}, () => {
  describe("on the default server (--temp 0)", () => {
    let server;
    before(async () => {
      server = await startServer([], {threads: 2});
    });
    after(async () => {
      await stopServer(server);
    });

    // 1. Real clients.
    describe("official SDKs", {skip: SDK_SKIP}, () => {
      let oa, an;
      before(() => {
        const {OpenAI} = loadSdk("openai");
        const Anthropic = loadSdk("@anthropic-ai/sdk").Anthropic;
        // No retries: a 5xx must fail the test, not be papered over by the SDK.
        oa = new OpenAI({baseURL: `${server.base}/v1`, apiKey: "unused", maxRetries: 0,
                         timeout: 60000});
        an = new Anthropic({baseURL: server.base, apiKey: "unused", maxRetries: 0,
                            timeout: 60000});
      });

      test("openai chat: non-stream names Paris, stream gives the same text", async () => {
        const r = await oa.chat.completions.create({model: SERVED, messages: FRANCE_MESSAGES,
                                                    max_tokens: 40});
        const text = r.choices[0].message.content;
        assert.match(text, /Paris/);
        assert.equal(r.model, SERVED);
        assert.equal(r.choices[0].finish_reason, "stop");
        assert.equal(r.choices[0].message.role, "assistant");
        const stream = await oa.chat.completions.create({model: SERVED, messages: FRANCE_MESSAGES,
                                                         max_tokens: 40, stream: true});
        let streamed = "";
        for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
        assert.equal(streamed, text);
      });

      test("openai chat at temperature 0.8 with a seed: same text streamed and not", async () => {
        const ask = async (seed, stream) => {
          const body = {model: SERVED, max_tokens: 24, temperature: 0.8, seed,
                        messages: [{role: "user", content: "Write a short poem about the sea."}]};
          if (!stream) return (await oa.chat.completions.create(body)).choices[0].message.content;
          let text = "";
          for await (const c of await oa.chat.completions.create({...body, stream: true})) {
            text += c.choices[0]?.delta?.content ?? "";
          }
          return text;
        };
        const seven = await ask(7, false);
        assert.ok(seven.length > 0);
        assert.equal(await ask(7, true), seven);
        // Sampling really happens (else the equality above would hold trivially): other seeds
        // give other poems.
        const others = [await ask(8, false), await ask(9, false)];
        assert.ok(others.some((t) => t !== seven), `seeds 7, 8, 9 all gave ${JSON.stringify(seven)}`);
      });

      test("openai completions: a string prompt and its token ids give the same text", async () => {
        const prompt = "Once upon a time";
        const tok = await postOk(server, "/tokenize", {prompt});
        assert.ok(Array.isArray(tok.tokens) && tok.tokens.length > 0);
        assert.equal(tok.count, tok.tokens.length);
        assert.ok(tok.tokens.every(Number.isInteger));
        const detok = await postOk(server, "/detokenize", {tokens: tok.tokens});
        assert.equal(detok.prompt, prompt);
        assert.equal(detok.content, prompt);
        const byContent = await postOk(server, "/tokenize", {content: prompt});
        assert.deepEqual(byContent.tokens, tok.tokens);

        const fromText = await oa.completions.create({model: SERVED, prompt, max_tokens: 16});
        const fromIds = await oa.completions.create({model: SERVED, prompt: tok.tokens,
                                                     max_tokens: 16});
        assert.ok(fromText.choices[0].text.length > 0);
        assert.equal(fromIds.choices[0].text, fromText.choices[0].text);
        assert.equal(fromText.usage.prompt_tokens, tok.count);
        assert.equal(fromIds.usage.prompt_tokens, tok.count);
        assert.equal(fromText.choices[0].finish_reason, "length");
        assert.equal(fromText.usage.completion_tokens, 16);
      });

      test("openai responses: non-stream and the SDK's stream give the same text", async () => {
        const body = {model: SERVED, instructions: SYSTEM, input: FRANCE, max_output_tokens: 40};
        const r = await oa.responses.create(body);
        assert.equal(r.status, "completed");
        assert.match(r.output_text, /Paris/);
        const stream = oa.responses.stream(body);
        let deltas = "";
        stream.on("response.output_text.delta", (e) => (deltas += e.delta));
        const final = await stream.finalResponse();
        assert.equal(final.status, "completed");
        assert.equal(final.output_text, r.output_text);
        assert.equal(deltas, r.output_text);
        assert.equal(final.usage.output_tokens, r.usage.output_tokens);
      });

      test("openai models.list: the served name", async () => {
        const ids = [];
        for await (const m of oa.models.list()) ids.push(m.id);
        assert.deepEqual(ids, [SERVED]);
        const model = await call(server, "GET", "/v1/models");
        assert.equal(model.json.object, "list");
        assert.equal(model.json.data[0].object, "model");
      });

      test("anthropic messages: non-stream names Paris, stream gives the same text", async () => {
        const body = {model: SERVED, max_tokens: 40, system: SYSTEM,
                      messages: [{role: "user", content: FRANCE}]};
        const m = await an.messages.create(body);
        assert.equal(m.type, "message");
        assert.equal(m.role, "assistant");
        assert.equal(m.model, SERVED);
        assert.equal(m.content.length, 1);
        assert.equal(m.content[0].type, "text");
        const text = m.content[0].text;
        assert.match(text, /Paris/);
        assert.equal(m.stop_reason, "end_turn");
        assert.equal(m.stop_sequence, null);
        assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);

        const stream = an.messages.stream(body);
        let deltas = "";
        stream.on("text", (t) => (deltas += t));
        const final = await stream.finalMessage();
        assert.equal(final.content[0].text, text);
        assert.equal(deltas, text);
        assert.equal(final.stop_reason, "end_turn");
        assert.equal(final.usage.output_tokens, m.usage.output_tokens);
        // The SDK takes input_tokens from message_start: streamed usage must match.
        assert.equal(final.usage.input_tokens, m.usage.input_tokens);
      });
    });

    // 2. The event-stream grammar, event by event.
    describe("server-sent events", () => {
      test("chat: one id and created, role first, one finish_reason, usage, [DONE]", async () => {
        const body = {model: SERVED, messages: FRANCE_MESSAGES, max_tokens: 40};
        const whole = await postOk(server, "/v1/chat/completions", body);
        const {events} = await readSse(server, "/v1/chat/completions",
                                       {...body, stream: true,
                                        stream_options: {include_usage: true}});
        const s = checkChatStream(events, {includeUsage: true});
        assert.equal(s.text, whole.choices[0].message.content);
        assert.equal(s.finish, whole.choices[0].finish_reason);
        assert.equal(s.usage.prompt_tokens, whole.usage.prompt_tokens);
        assert.equal(s.usage.completion_tokens, whole.usage.completion_tokens);
        // The same prompt again: everything but its last token comes from the KV cache.
        assert.equal(s.usage.prompt_tokens_details.cached_tokens, s.usage.prompt_tokens - 1);

        const plain = await readSse(server, "/v1/chat/completions", {...body, stream: true});
        assert.equal(checkChatStream(plain.events, {includeUsage: false}).text, s.text);
      });

      test("completions: text chunks, one finish_reason, usage, [DONE]", async () => {
        const body = {model: SERVED, prompt: "Once upon a time", max_tokens: 12};
        const whole = await postOk(server, "/v1/completions", body);
        const {events} = await readSse(server, "/v1/completions",
                                       {...body, stream: true,
                                        stream_options: {include_usage: true}});
        assert.equal(events.at(-1).data, "[DONE]");
        const chunks = events.slice(0, -1).map((e) => e.json);
        const {id, created} = chunks[0];
        let text = "";
        const finishes = [];
        for (const c of chunks) {
          assert.equal(c.object, "text_completion");
          assert.equal(c.id, id);
          assert.equal(c.created, created);
          if (c.choices.length === 0) continue;
          text += c.choices[0].text;
          if (c.choices[0].finish_reason !== null) finishes.push(c.choices[0].finish_reason);
        }
        assert.deepEqual(finishes, ["length"]);
        assert.equal(text, whole.choices[0].text);
        const last = chunks.at(-1);
        assert.deepEqual(last.choices, []);
        assert.equal(last.usage.completion_tokens, 12);
        assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + 12);
      });

      test("messages: message_start, content_block_start/delta*/stop, message_delta, " +
           "message_stop", async () => {
        const body = {model: SERVED, max_tokens: 40, system: SYSTEM,
                      messages: [{role: "user", content: FRANCE}]};
        const whole = await postOk(server, "/v1/messages", body);
        const {events} = await readSse(server, "/v1/messages", {...body, stream: true},
                                       {typed: true});
        const names = events.map((e) => e.event);
        const order = names.join(" ").replace(/(content_block_delta ?)+/, "content_block_delta* ");
        assert.equal(order.trim(), "message_start content_block_start content_block_delta* " +
                                   "content_block_stop message_delta message_stop");
        const start = events[0].json.message;
        assert.match(start.id, /^msg_/);
        assert.equal(start.role, "assistant");
        assert.equal(start.model, SERVED);
        assert.deepEqual(start.content, []);
        assert.deepEqual(events[1].json.content_block, {type: "text", text: ""});
        let text = "";
        for (const e of events.filter((e) => e.event === "content_block_delta")) {
          assert.equal(e.json.index, 0);
          assert.equal(e.json.delta.type, "text_delta");
          text += e.json.delta.text;
        }
        assert.equal(text, whole.content[0].text);
        const delta = events.at(-2).json;
        assert.equal(delta.delta.stop_reason, whole.stop_reason);
        assert.equal(delta.usage.output_tokens, whole.usage.output_tokens);
        // Anthropic reports the prompt's size up front, in message_start (the prompt is
        // tokenized before the stream starts, so it is known).
        assert.equal(start.usage.input_tokens, whole.usage.input_tokens,
                     "message_start.message.usage.input_tokens");
      });

      test("responses: typed events ending with response.completed holding the deltas",
           async () => {
        const body = {model: SERVED, instructions: SYSTEM, input: FRANCE, max_output_tokens: 40};
        const whole = await postOk(server, "/v1/responses", body);
        const {events} = await readSse(server, "/v1/responses", {...body, stream: true},
                                       {typed: true});
        events.forEach((e, i) => assert.equal(e.json.sequence_number, i, "sequence numbers"));
        assert.equal(events[0].event, "response.created");
        assert.equal(events.at(-1).event, "response.completed");
        assert.equal(events.filter((e) => e.event === "response.completed").length, 1);
        const deltas = events.filter((e) => e.event === "response.output_text.delta")
                             .map((e) => e.json.delta).join("");
        const done = events.find((e) => e.event === "response.output_text.done");
        assert.equal(done.json.text, deltas);
        const completed = events.at(-1).json.response;
        assert.equal(completed.status, "completed");
        assert.equal(completed.id, events[0].json.response.id);
        assert.equal(completed.output[0].content[0].text, deltas);
        const wholeText = whole.output[0].content[0].text;
        assert.equal(deltas, wholeText);
        assert.match(wholeText, /Paris/);
      });
    });

    // 3. Logprobs.
    test("chat logprobs with top_logprobs=3", async () => {
      const body = {model: SERVED, messages: FRANCE_MESSAGES, max_tokens: 40, logprobs: true,
                    top_logprobs: 3};
      const r = await postOk(server, "/v1/chat/completions", body);
      const entries = r.choices[0].logprobs.content;
      assert.ok(entries.length >= 1 && entries.length <= r.usage.completion_tokens);
      for (const e of entries) {
        assert.equal(typeof e.token, "string");
        assert.ok(e.logprob <= 0, `logprob ${e.logprob} > 0`);
        assert.ok(e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
        // A token that is whole UTF-8 carries exactly its bytes.
        if (!e.token.includes("\ufffd")) assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
        assert.equal(e.top_logprobs.length, 3);
        for (let i = 0; i < 3; i++) {
          assert.ok(e.top_logprobs[i].logprob <= 0);
          if (i > 0) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob,
                               "top_logprobs are sorted, most likely first");
          assert.ok(e.logprob >= e.top_logprobs[i].logprob - 1e-6,
                    "greedy: the chosen token is at least as likely as every alternative");
        }
        // Greedy decoding picks the top-1 token.
        assert.equal(e.token, e.top_logprobs[0].token);
        assert.equal(e.logprob, e.top_logprobs[0].logprob);
      }
      // Streamed, the same tokens with (numerically) the same logprobs.
      const {events} = await readSse(server, "/v1/chat/completions", {...body, stream: true});
      const s = checkChatStream(events, {includeUsage: false});
      assert.deepEqual(s.logprobs.map((e) => e.token), entries.map((e) => e.token));
      s.logprobs.forEach((e, i) => assert.ok(Math.abs(e.logprob - entries[i].logprob) < 1e-3));

      // The entries spell the reply: OpenAI's logprobs cover the content tokens only, never the
      // end-of-turn token that stopped generation (which is not part of the content).
      assert.equal(r.choices[0].finish_reason, "stop");
      assert.equal(entries.map((e) => e.token).join(""), r.choices[0].message.content);
      assert.equal(s.logprobs.map((e) => e.token).join(""), s.text);
    });

    test("completions logprobs=3: tokens, token_logprobs and top_logprobs line up", async () => {
      const r = await postOk(server, "/v1/completions",
                             {model: SERVED, prompt: "Once upon a time", max_tokens: 8,
                              logprobs: 3});
      const lp = r.choices[0].logprobs;
      assert.equal(lp.tokens.length, 8);
      assert.equal(lp.token_logprobs.length, 8);
      assert.equal(lp.top_logprobs.length, 8);
      assert.equal(lp.tokens.join(""), r.choices[0].text);
      lp.tokens.forEach((t, i) => {
        assert.ok(lp.token_logprobs[i] <= 0);
        const top = lp.top_logprobs[i];
        assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
        assert.equal(top[t], lp.token_logprobs[i], "greedy: the chosen token is in the top");
        assert.ok(Object.values(top).every((v) => v <= lp.token_logprobs[i]));
      });
    });

    // 4. Stop strings.
    describe("stop strings never leak", () => {
      const story = [{role: "user", content: "Write a short story about a robot."}];

      test("chat, non-stream and stream", async () => {
        const full = await postOk(server, "/v1/chat/completions",
                                  {model: SERVED, messages: story, max_tokens: 48});
        const text = full.choices[0].message.content;
        const {stop, at} = middleStop(text);
        const body = {model: SERVED, messages: story, max_tokens: 48,
                      stop: ["never appears in it \u0001", stop]};
        const r = await postOk(server, "/v1/chat/completions", body);
        assert.equal(r.choices[0].message.content, text.slice(0, at));
        assert.equal(r.choices[0].finish_reason, "stop");
        assert.ok(r.usage.completion_tokens < full.usage.completion_tokens);

        const {events} = await readSse(server, "/v1/chat/completions", {...body, stream: true});
        const s = checkChatStream(events, {includeUsage: false});
        assert.equal(s.text, text.slice(0, at));
        assert.equal(s.finish, "stop");
      });

      test("completions, non-stream and stream", async () => {
        const body = {model: SERVED, prompt: "Once upon a time", max_tokens: 40};
        const full = await postOk(server, "/v1/completions", body);
        const text = full.choices[0].text;
        const {stop, at} = middleStop(text);
        const r = await postOk(server, "/v1/completions", {...body, stop});
        assert.equal(r.choices[0].text, text.slice(0, at));
        assert.equal(r.choices[0].finish_reason, "stop");
        const {events} = await readSse(server, "/v1/completions", {...body, stop, stream: true});
        const chunks = events.slice(0, -1).map((e) => e.json);
        assert.equal(chunks.map((c) => c.choices[0].text).join(""), text.slice(0, at));
        assert.equal(chunks.at(-1).choices[0].finish_reason, "stop");
      });

      test("anthropic stop_sequences: stop_reason stop_sequence, non-stream and stream",
           async () => {
        const body = {model: SERVED, max_tokens: 48, messages: story};
        const full = await postOk(server, "/v1/messages", body);
        const text = full.content[0].text;
        const {stop, at} = middleStop(text);
        const r = await postOk(server, "/v1/messages", {...body, stop_sequences: [stop]});
        assert.equal(r.content[0].text, text.slice(0, at));
        assert.equal(r.stop_reason, "stop_sequence");
        assert.equal(r.stop_sequence, stop);

        const {events} = await readSse(server, "/v1/messages",
                                       {...body, stop_sequences: [stop], stream: true},
                                       {typed: true});
        const deltas = events.filter((e) => e.event === "content_block_delta")
                             .map((e) => e.json.delta.text).join("");
        assert.equal(deltas, text.slice(0, at));
        const delta = events.find((e) => e.event === "message_delta").json.delta;
        assert.equal(delta.stop_reason, "stop_sequence");
        assert.equal(delta.stop_sequence, stop);
      });
    });

    // curl sends `Expect: 100-continue` with bodies over 1 KiB and waits up to 1 s for the
    // interim response before sending the body anyway; unanswered, every such request is 1 s
    // slower.
    test("Expect: 100-continue is answered before the body is sent", async () => {
      const body = JSON.stringify({model: SERVED, prompt: "Hi ".repeat(400), max_tokens: 2});
      const [host, port] = server.http.split(":");
      const r = await new Promise((resolve, reject) => {
        const req = http.request({host, port: Number(port), method: "POST",
                                  path: "/v1/completions", agent: false,
                                  headers: {"content-type": "application/json",
                                            "content-length": Buffer.byteLength(body),
                                            "expect": "100-continue"}});
        const t0 = performance.now();
        let continued = null;
        const send = (how) => {
          if (continued !== null) return;
          continued = how;
          req.end(body);
        };
        const timer = setTimeout(() => send(-1), 1000);  // then send anyway, as curl does
        req.on("continue", () => {
          clearTimeout(timer);
          send(performance.now() - t0);
        });
        req.on("response", (res) => {
          clearTimeout(timer);
          let text = "";
          res.on("data", (d) => (text += d));
          res.on("end", () => resolve({status: res.statusCode, text, continued}));
        });
        req.on("error", reject);
        req.flushHeaders();
      });
      assert.equal(r.status, 200, r.text);
      assert.ok(r.continued >= 0, "no 100 Continue within 1 s");
    });

    // 5. Errors this server can produce with its default flags.
    describe("errors", () => {
      const chat = (extra) => ({model: SERVED, messages: FRANCE_MESSAGES, max_tokens: 4, ...extra});

      test("malformed JSON: 400", async () => {
        for (const p of ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize"]) {
          assertOpenAiError(await post(server, p, "{\"messages\": ["), 400,
                            {messageMatch: /JSON/, type: "invalid_request_error"});
        }
        assertOpenAiError(await post(server, "/v1/chat/completions", "[1, 2]"), 400,
                          {messageMatch: /object/});
        assertAnthropicError(await post(server, "/v1/messages", "{nope"), 400,
                             {type: "invalid_request_error", messageMatch: /JSON/});
      });

      test("wrong field types: 400 naming the field", async () => {
        assertOpenAiError(await post(server, "/v1/chat/completions", chat({messages: "hi"})), 400,
                          {param: "messages", messageMatch: /messages/});
        assertOpenAiError(await post(server, "/v1/chat/completions",
                                     chat({messages: [{role: "user", content: 42}]})), 400,
                          {param: "messages", messageMatch: /messages\[0\]\.content/});
        for (const [field, value] of [["temperature", "hot"], ["max_tokens", "many"],
                                      ["stream", "yes"], ["stop", 5], ["seed", 1.5]]) {
          assertOpenAiError(await post(server, "/v1/chat/completions", chat({[field]: value})),
                            400, {messageMatch: new RegExp(`'${field}'`)});
        }
        assertOpenAiError(await post(server, "/v1/completions", {prompt: {text: "hi"}}), 400,
                          {param: "prompt", messageMatch: /prompt/});
        assertOpenAiError(await post(server, "/detokenize", {tokens: "1 2"}), 400,
                          {param: "tokens", messageMatch: /tokens/});
      });

      test("n=2: 400", async () => {
        assertOpenAiError(await post(server, "/v1/chat/completions", chat({n: 2})), 400,
                          {messageMatch: /n=1/});
      });

      // Constrained replies themselves: structured_output_test.mjs. Here, the shapes.
      test("response_format: its shape is checked; text is the default", async () => {
        assertOpenAiError(await post(server, "/v1/chat/completions",
                                     chat({response_format: {type: "json_schema"}})), 400,
                          {messageMatch: /'schema'/});
        assertOpenAiError(await post(server, "/v1/chat/completions",
                                     chat({response_format: {type: "yaml"}})), 400,
                          {messageMatch: /not one of text, json_object, json_schema/});
        assertOpenAiError(await post(server, "/v1/chat/completions",
                                     chat({response_format: "json"})), 400,
                          {messageMatch: /must be an object/});
        // `text` is the default format and must keep working.
        await postOk(server, "/v1/chat/completions", chat({response_format: {type: "text"}}));
      });

      test("unknown model: 404 in both dialects", async () => {
        for (const p of ["/v1/chat/completions", "/v1/completions", "/v1/responses"]) {
          const body = {model: "gpt-nonexistent", messages: FRANCE_MESSAGES, prompt: "Hi",
                        input: "Hi", max_tokens: 4};
          assertOpenAiError(await post(server, p, body), 404,
                            {code: "model_not_found", messageMatch: /gpt-nonexistent/});
        }
        assertAnthropicError(await post(server, "/v1/messages",
                                        {model: "claude-nonexistent", max_tokens: 4,
                                         messages: [{role: "user", content: "Hi"}]}),
                             404, {type: "not_found_error", messageMatch: /claude-nonexistent/});
      });

      test("missing max_tokens on /v1/messages: 400 in the Anthropic shape", async () => {
        assertAnthropicError(await post(server, "/v1/messages",
                                        {model: SERVED, messages: [{role: "user", content: "Hi"}]}),
                             400, {type: "invalid_request_error", messageMatch: /max_tokens/});
      });

      test("unknown route: 404; a known route with the wrong method: 405", async () => {
        assertOpenAiError(await call(server, "GET", "/v1/nothing-here"), 404,
                          {messageMatch: /\/v1\/nothing-here/});
        assertOpenAiError(await call(server, "DELETE", "/v1/models"), 405);
        assertOpenAiError(await call(server, "GET", "/v1/chat/completions"), 405);
      });

      test("prompt token ids outside the vocabulary: 400", async () => {
        const {tokens} = await postOk(server, "/tokenize", {prompt: "Hi"});
        for (const bad of [-1, 49152 * 100, 2 ** 32 + tokens[0]]) {
          assertOpenAiError(await post(server, "/v1/completions",
                                       {model: SERVED, prompt: [bad], max_tokens: 2}),
                            400, {messageMatch: /vocabulary|token/});
        }
      });
    });

    // 6. A client that goes away frees its slot.
    test("disconnect mid-stream cancels the request within 1 s", async () => {
      const body = {model: SERVED, prompt: "Once upon a time", max_tokens: 1000,
                    ignore_eos: true, stream: true};
      let runningBefore = -1, kvBefore = -1;
      const {aborted, events} = await readSse(server, "/v1/completions", body, {
        onEvent: async (e) => {
          if (!e.json?.choices?.[0]?.text) return undefined;
          runningBefore = await metric(server, "fucina_num_requests_running");
          kvBefore = await metric(server, "fucina_kv_cache_usage_perc");
          return "abort";
        },
      });
      assert.ok(aborted, "the stream ended before the test disconnected");
      assert.ok(events.length >= 1);
      assert.equal(runningBefore, 1, "the stream was running when the client left");
      const ms = await waitMetric(server, "fucina_num_requests_running", 0, 2000);
      assert.ok(ms <= 1000, `running went back to 0 after ${Math.round(ms)} ms`);
      console.log(`# disconnect (stream): running back to 0 after ${Math.round(ms)} ms`);
      // A cancelled request's KV rows are dropped, not kept for reuse like a finished one's.
      const kvAfter = await metric(server, "fucina_kv_cache_usage_perc");
      assert.ok(kvAfter < kvBefore, `KV usage ${kvBefore} -> ${kvAfter}`);
      const next = await postOk(server, "/v1/completions",
                                {model: SERVED, prompt: "Hi", max_tokens: 2});
      assert.equal(next.usage.completion_tokens, 2);
    });

    test("disconnect while waiting for a non-streamed reply cancels it within 1 s", async () => {
      const [host, port] = server.http.split(":");
      const body = JSON.stringify({model: SERVED, prompt: "Once upon a time", max_tokens: 1000,
                                   ignore_eos: true});
      const req = http.request({host, port: Number(port), method: "POST", path: "/v1/completions",
                                agent: false, headers: {"content-type": "application/json",
                                                        "content-length": Buffer.byteLength(body)}});
      req.on("error", () => {});
      req.end(body);
      await waitMetric(server, "fucina_num_requests_running", 1, 5000);
      await sleep(100);  // decoding has begun
      req.destroy();
      const ms = await waitMetric(server, "fucina_num_requests_running", 0, 2000);
      assert.ok(ms <= 1000, `running went back to 0 after ${Math.round(ms)} ms`);
      console.log(`# disconnect (non-stream): running back to 0 after ${Math.round(ms)} ms`);
      await postOk(server, "/v1/completions", {model: SERVED, prompt: "Hi", max_tokens: 2});
    });

    // 7a. Load within capacity.
    test("hey within capacity: 20 requests, 2 at a time, all 200", {skip: !HEY && "hey not found"},
         async () => {
      const {codes, errors, stdout} = await runHey(
          ["-n", "20", "-c", "2", "-m", "POST", "-T", "application/json", "-d", heyBody(4),
           `${server.base}/v1/completions`]);
      assert.equal(errors, 0, stdout);
      assert.deepEqual(codes, {200: 20}, stdout);
    });

    // 8. Time to first token, reported, not asserted (timings depend on the machine).
    test("time to first token: HTTP stream vs gRPC client", async () => {
      const n = 20;
      const viaHttp = [];
      for (let i = 0; i < n; i++) {
        let first = null;
        await readSse(server, "/v1/chat/completions",
                      {model: SERVED, messages: [{role: "user", content: FRANCE}], max_tokens: 1,
                       stream: true},
                      {onEvent: (e) => {
                        if (first === null && e.json?.choices?.[0]?.delta?.content) first = e.at;
                      }});
        assert.ok(first !== null, "a content delta arrived");
        viaHttp.push(first);
      }
      // The gRPC side goes through `fucina client`, so each sample includes starting that
      // process; its start-up alone (`--help`) is measured to put the figure in context.
      const spawnTime = (args, firstByte) => new Promise((resolve, reject) => {
        const t0 = performance.now();
        const child = spawn(BIN, args, {stdio: ["ignore", "pipe", "pipe"]});
        let at = null, err = "";
        child.stdout.on("data", () => {
          if (at === null) at = performance.now() - t0;
        });
        child.stderr.on("data", (d) => (err += d));
        child.on("exit", (code) => {
          if (code !== 0) return reject(new Error(`fucina ${args[0]} exited ${code}: ${err}`));
          resolve(firstByte ? at : performance.now() - t0);
        });
      });
      const grpc = [], startup = [];
      for (let i = 0; i < n; i++) {
        const t = await spawnTime(["client", "generate", "--addr", server.grpc, "--chat", FRANCE,
                                   "--stream", "--gen", "1", "--temp", "0"], true);
        assert.ok(t !== null, "the gRPC client printed the first token");
        grpc.push(t);
        startup.push(await spawnTime(["client", "generate", "--help"], false));
      }
      const f = (v) => `${v.toFixed(1)} ms`;
      console.log(`# TTFT over ${n} sequential requests (SmolLM2, 2 threads, warm prefix cache):`);
      console.log(`#   HTTP  /v1/chat/completions stream (fetch, to first content delta): ` +
                  `p50 ${f(percentile(viaHttp, 0.5))}  p99 ${f(percentile(viaHttp, 0.99))}`);
      console.log(`#   gRPC  fucina client generate --stream (spawn to first stdout byte): ` +
                  `p50 ${f(percentile(grpc, 0.5))}  p99 ${f(percentile(grpc, 0.99))}`);
      console.log(`#         of which client process start-up (--help): ` +
                  `p50 ${f(percentile(startup, 0.5))}`);
    });
  });

  // 5. Errors that need their own flags: one small server each, stopped before the next.
  describe("--ctx 64", () => {
    let server;
    before(async () => (server = await startServer(["--ctx", "64"])));
    after(() => stopServer(server));

    test("a prompt longer than the context: 400; a fitting one stops at the context", async () => {
      const long = "Tell me everything about the history of the city of Paris. ".repeat(8);
      assertOpenAiError(await post(server, "/v1/chat/completions",
                                   {model: SERVED, messages: [{role: "user", content: long}],
                                    max_tokens: 4}),
                        400, {messageMatch: /context/});
      assertOpenAiError(await post(server, "/v1/completions",
                                   {model: SERVED, prompt: long, max_tokens: 4}),
                        400, {messageMatch: /context/});
      assertAnthropicError(await post(server, "/v1/messages",
                                      {model: SERVED, messages: [{role: "user", content: long}],
                                       max_tokens: 4}),
                           400, {type: "invalid_request_error", messageMatch: /context/});
      // 40 prompt tokens and a budget past the context: generation ends at the context.
      const {tokens} = await postOk(server, "/tokenize", {prompt: "word ".repeat(40)});
      const r = await postOk(server, "/v1/completions",
                             {model: SERVED, prompt: tokens, max_tokens: 100, ignore_eos: true});
      assert.equal(r.choices[0].finish_reason, "length");
      assert.ok(r.usage.completion_tokens >= 1);
      assert.ok(r.usage.prompt_tokens + r.usage.completion_tokens <= 64,
                `prompt ${r.usage.prompt_tokens} + completion ${r.usage.completion_tokens} > 64`);
    });
  });

  describe("--spec", () => {
    let server;
    before(async () => (server = await startServer(["--spec"])));
    after(() => stopServer(server));

    test("speculative replies equal plain ones; a request opts out with speculative: false",
         async () => {
      const doc = "The lighthouse keeper climbed the spiral stairs every evening at dusk. He " +
                  "trimmed the wick, polished the great lens until it shone.";
      const body = {model: SERVED, max_tokens: 32, temperature: 0,
                    messages: [{role: "user", content: `Repeat exactly: ${doc}`}]};
      const spec = await postOk(server, "/v1/chat/completions", body);
      const plain = await postOk(server, "/v1/chat/completions", {...body, speculative: false});
      assert.equal(spec.choices[0].message.content, plain.choices[0].message.content);
      assert.match(spec.choices[0].message.content, /lighthouse keeper/);
      const seeded = {model: SERVED, prompt: "Once upon a time", max_tokens: 24,
                      temperature: 1.0, seed: 5};
      assert.equal((await postOk(server, "/v1/completions", seeded)).choices[0].text,
                   (await postOk(server, "/v1/completions", {...seeded, speculative: false}))
                       .choices[0].text);
      assertOpenAiError(await post(server, "/v1/chat/completions",
                                   {...body, speculative: "yes"}),
                        400, {messageMatch: /speculative/});
      assert.ok(await metric(server, "fucina_spec_decode_num_accepted_tokens_total") > 10);
    });
  });

  describe("--max-body 1000", () => {
    let server;
    before(async () => (server = await startServer(["--max-body", "1000"])));
    after(() => stopServer(server));

    test("a body over the limit: 413; under it: 200", async () => {
      const big = {model: SERVED, prompt: "x".repeat(2000), max_tokens: 2};
      for (let i = 0; i < 3; i++) {
        assertOpenAiError(await post(server, "/v1/completions", big), 413,
                          {messageMatch: /1000 bytes/});
      }
      // Without a Content-Length the limit must hold too.
      assertOpenAiError(await call(server, "POST", "/v1/completions", {body: big, chunked: true}),
                        413);
      await postOk(server, "/v1/completions", {model: SERVED, prompt: "Hi", max_tokens: 2});
      const small = await call(server, "POST", "/v1/completions",
                               {body: {model: SERVED, prompt: "Hi", max_tokens: 2}, chunked: true});
      assert.equal(small.status, 200, small.text);
    });
  });

  describe("--api-key k", () => {
    let server;
    before(async () => (server = await startServer(["--api-key", "k"])));
    after(() => stopServer(server));
    const body = {model: SERVED, prompt: "Hi", max_tokens: 2};

    test("no or wrong key: 401 in the endpoint's dialect", async () => {
      assertOpenAiError(await post(server, "/v1/completions", body), 401,
                        {code: "invalid_api_key"});
      assertOpenAiError(await post(server, "/v1/completions", body,
                                   {authorization: "Bearer wrong"}), 401);
      assertOpenAiError(await post(server, "/v1/completions", body, {authorization: "k"}), 401);
      assertOpenAiError(await call(server, "GET", "/v1/models"), 401);
      assertAnthropicError(await post(server, "/v1/messages",
                                      {model: SERVED, max_tokens: 2,
                                       messages: [{role: "user", content: "Hi"}]}),
                           401, {type: "authentication_error"});
    });

    test("Bearer (any case) and x-api-key both work; /health and /metrics stay open", async () => {
      const bearer = await post(server, "/v1/completions", body, {authorization: "Bearer k"});
      assert.equal(bearer.status, 200, bearer.text);
      // The scheme is case-insensitive (RFC 9110), as on the gRPC API.
      const lower = await post(server, "/v1/completions", body, {authorization: "bearer k"});
      assert.equal(lower.status, 200, lower.text);
      const xkey = await post(server, "/v1/completions", body, {"x-api-key": "k"});
      assert.equal(xkey.status, 200, xkey.text);
      assert.equal((await call(server, "GET", "/health")).status, 200);
      const metrics = await call(server, "GET", "/metrics");
      assert.equal(metrics.status, 200);
      assert.match(metrics.text, /fucina_num_requests_running/);
    });

    test("the SDKs authenticate with the key", {skip: SDK_SKIP}, async () => {
      const {OpenAI} = loadSdk("openai");
      const {Anthropic} = loadSdk("@anthropic-ai/sdk");
      const oa = new OpenAI({baseURL: `${server.base}/v1`, apiKey: "k", maxRetries: 0});
      const page = await oa.models.list();
      assert.equal(page.data[0].id, SERVED);
      const an = new Anthropic({baseURL: server.base, apiKey: "k", maxRetries: 0});
      const m = await an.messages.create({model: SERVED, max_tokens: 2,
                                          messages: [{role: "user", content: "Hi"}]});
      assert.equal(m.type, "message");
      const wrong = new Anthropic({baseURL: server.base, apiKey: "nope", maxRetries: 0});
      await assert.rejects(wrong.messages.create({model: SERVED, max_tokens: 2,
                                                  messages: [{role: "user", content: "Hi"}]}),
                           (e) => e.status === 401);
    });
  });

  describe("--allow-host localhost", () => {
    let server;
    before(async () => (server = await startServer(["--allow-host", "localhost"],
                                                   {healthHost: "localhost"})));
    after(() => stopServer(server));

    test("another Host header: 403; localhost: served", async () => {
      const port = server.http.split(":")[1];
      assertOpenAiError(await call(server, "GET", "/v1/models", {headers: {host: "evil.example"}}),
                        403, {messageMatch: /evil\.example/});
      assertOpenAiError(await call(server, "GET", "/v1/models",
                                   {headers: {host: `evil.example:${port}`}}), 403);
      assertAnthropicError(await post(server, "/v1/messages",
                                      {model: SERVED, max_tokens: 2,
                                       messages: [{role: "user", content: "Hi"}]},
                                      {host: "evil.example"}), 403);
      const ok = await call(server, "GET", "/v1/models", {headers: {host: `localhost:${port}`}});
      assert.equal(ok.status, 200, ok.text);
      const bare = await call(server, "GET", "/v1/models", {headers: {host: "localhost"}});
      assert.equal(bare.status, 200, bare.text);
    });
  });

  describe("--max-queue 1 --batch 1", () => {
    let server;
    before(async () => (server = await startServer(["--max-queue", "1", "--batch", "1"])));
    after(() => stopServer(server));
    const long = {model: SERVED, messages: FRANCE_MESSAGES, max_tokens: 200, ignore_eos: true};

    function assertQueueFull(r) {
      assertOpenAiError(r, 503, {messageMatch: /queue/});
      assert.match(r.headers["retry-after"] ?? "", /^\d+$/, "503 carries Retry-After");
    }

    test("concurrent long requests: the overflow gets 503 + Retry-After, the rest 200",
         async () => {
      const results = await Promise.all(Array.from({length: 6}, () =>
        post(server, "/v1/chat/completions", long)));
      const statuses = results.map((r) => r.status);
      assert.ok(statuses.every((s) => s === 200 || s === 503), `statuses ${statuses}`);
      assert.ok(statuses.includes(503), `no 503 among ${statuses}`);
      assert.ok(statuses.includes(200), `no 200 among ${statuses}`);
      for (const r of results) {
        if (r.status === 503) {
          assertQueueFull(r);
        } else {
          assert.equal(r.json.usage.completion_tokens, 200);
          assert.equal(r.json.choices[0].finish_reason, "length");
        }
      }
    });

    test("while one runs and one waits, every further request is refused at once", async () => {
      const running = post(server, "/v1/chat/completions", long);
      await waitMetric(server, "fucina_num_requests_running", 1, 10000);
      const waiting = post(server, "/v1/chat/completions", long);
      await waitMetric(server, "fucina_num_requests_waiting", 1, 10000);
      const refused = await Promise.all([
        post(server, "/v1/chat/completions", long),
        post(server, "/v1/completions", {model: SERVED, prompt: "Hi", max_tokens: 2}),
        post(server, "/v1/responses", {model: SERVED, input: "Hi", max_output_tokens: 2}),
      ]);
      refused.forEach(assertQueueFull);
      const anthropic = await post(server, "/v1/messages",
                                   {model: SERVED, max_tokens: 2,
                                    messages: [{role: "user", content: "Hi"}]});
      assertAnthropicError(anthropic, 503, {type: "overloaded_error"});
      assert.match(anthropic.headers["retry-after"] ?? "", /^\d+$/);
      for (const r of await Promise.all([running, waiting])) {
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.usage.completion_tokens, 200);
      }
      assert.equal(await metric(server, "fucina_num_requests_waiting"), 0);
    });

    test("a queued request whose client leaves gives up its place within 1 s", async () => {
      const running = post(server, "/v1/chat/completions", long);
      running.catch(() => {});  // awaited below; a failing assertion must not leave it unhandled
      await waitMetric(server, "fucina_num_requests_running", 1, 10000);
      const [host, port] = server.http.split(":");
      const data = JSON.stringify(long);
      const queued = http.request({host, port: Number(port), method: "POST",
                                   path: "/v1/chat/completions", agent: false,
                                   headers: {"content-type": "application/json",
                                             "content-length": Buffer.byteLength(data)}});
      queued.on("error", () => {});
      queued.end(data);
      await waitMetric(server, "fucina_num_requests_waiting", 1, 5000);
      queued.destroy();
      const ms = await waitMetric(server, "fucina_num_requests_waiting", 0, 2000);
      assert.ok(ms <= 1000, `waiting went back to 0 after ${Math.round(ms)} ms`);
      // The freed place takes the next request while the first still runs.
      const next = await post(server, "/v1/completions", {model: SERVED, prompt: "Hi",
                                                          max_tokens: 2});
      assert.equal(next.status, 200, next.text);
      assert.equal((await running).status, 200);
    });
  });

  // 7b. Load beyond capacity.
  describe("--max-queue 2 --batch 1 under hey", {skip: !HEY && "hey not found"}, () => {
    let server;
    before(async () => (server = await startServer(["--max-queue", "2", "--batch", "1"])));
    after(() => stopServer(server));

    // 48, not 40: hey sends n / c requests per worker, rounded down.
    test("48 requests, 16 at a time: only 200 and 503, and the server recovers", async () => {
      const {codes, errors, stdout} = await runHey(
          ["-n", "48", "-c", "16", "-m", "POST", "-T", "application/json",
           "-d", heyBody(16, {ignore_eos: true}), `${server.base}/v1/completions`]);
      assert.equal(errors, 0, stdout);
      const total = Object.values(codes).reduce((a, b) => a + b, 0);
      assert.equal(total, 48, stdout);
      assert.deepEqual(Object.keys(codes).filter((c) => c !== "200" && c !== "503"), [], stdout);
      assert.ok(codes[503] > 0, `no 503 under 16-way load:\n${stdout}`);
      assert.ok(codes[200] > 0, `no 200 under load:\n${stdout}`);
      console.log(`# hey beyond capacity: ${codes[200]} x 200, ${codes[503]} x 503`);
      assert.equal((await call(server, "GET", "/health")).status, 200);
      const r = await postOk(server, "/v1/completions", {model: SERVED, prompt: "Hi",
                                                         max_tokens: 4, ignore_eos: true});
      assert.equal(r.usage.completion_tokens, 4);
    });
  });
});
