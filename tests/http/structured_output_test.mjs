// Constrained decoding through the HTTP API on real SmolLM2: OpenAI's response_format
// (json_schema through the official SDK's structured-output `parse`, json_object) and vLLM's
// guided_regex / guided_grammar (Lark) / guided_choice. Every reply is checked by an
// independent validator (ajv for the schemas, the JavaScript RegExp engine for the regexes):
// finish_reason "stop" within max_tokens, greedy and sampled with several seeds, streamed and
// not. Two pipeline stages and a batch of concurrent requests give the replies of one process.
// Bad schemas, regexes and grammars are 400s that name the problem, and the server stays
// healthy.
//
//   FUCINA_BIN=build/tools/fucina FUCINA_DEFAULT_MODEL=.../SmolLM2-135M-Instruct.Q4_1.gguf \
//     FUCINA_NPM_DIR=... node --test tests/http/structured_output_test.mjs
import {after, before, describe, test} from "node:test";
import assert from "node:assert/strict";
import {spawn} from "node:child_process";
import {createRequire} from "node:module";
import path from "node:path";
import {listeningLine, terminate} from "./serve_process.mjs";

const BIN = process.env.FUCINA_BIN;
const MODEL = process.env.FUCINA_DEFAULT_MODEL;
const NPM = process.env.FUCINA_NPM_DIR;
const SKIP = !MODEL ? "FUCINA_DEFAULT_MODEL is not set" : !BIN ? "FUCINA_BIN is not set"
           : !NPM ? "FUCINA_NPM_DIR is not set" : false;

function npm(name) {
  const dir = path.basename(NPM) === "node_modules" ? path.dirname(NPM) : NPM;
  return createRequire(path.join(dir, "package.json"))(name);
}

const live = new Set();
process.on("exit", () => {
  for (const s of live) s.child.kill("SIGKILL");
});

async function startServer(args) {
  const argv = ["serve", MODEL, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                "--http", "127.0.0.1:0", "--threads", "1", "--temp", "0",
                "--served-model-name", "smollm2", ...args];
  const child = spawn(BIN, argv, {stdio: ["ignore", "pipe", "pipe"]});
  const server = {child, stderr: ""};
  live.add(server);
  child.stderr.on("data", (d) => (server.stderr = (server.stderr + d).slice(-4000)));
  const line = await listeningLine(child, server);
  server.base = `http://${/http=(\S+)$/.exec(line)[1]}`;
  const deadline = Date.now() + 60000;
  while ((await fetch(`${server.base}/health`).catch(() => ({status: 0}))).status !== 200) {
    assert.ok(Date.now() < deadline, `not healthy within 60 s: ${server.stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return server;
}

async function stopServer(server) {
  if (!server) return;
  live.delete(server);
  await terminate(server.child);
}

async function post(server, route, body) {
  const res = await fetch(`${server.base}${route}`, {
    method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)});
  return {status: res.status, json: await res.json()};
}

// Schemas whose every valid instance is short (maxLength, enums, bounded arrays), so a reply
// terminates within max_tokens.
const SCHEMAS = {
  nested: {
    type: "object",
    properties: {
      city: {type: "string", maxLength: 24},
      country: {type: "object", properties: {name: {type: "string", maxLength: 24},
                                              eu: {type: "boolean"}},
                required: ["name", "eu"], additionalProperties: false},
    },
    required: ["city", "country"], additionalProperties: false,
  },
  enums_and_bounds: {
    type: "object",
    properties: {
      size: {enum: ["small", "medium", "large"]},
      rank: {type: "integer", minimum: 1, maximum: 10},
      score: {type: "integer", minimum: -5, maximum: 5},
    },
    required: ["size", "rank", "score"], additionalProperties: false,
  },
  array: {
    type: "object",
    properties: {
      colours: {type: "array", items: {type: "string", maxLength: 10}, minItems: 2, maxItems: 3},
    },
    required: ["colours"], additionalProperties: false,
  },
  pattern: {
    type: "object",
    properties: {
      code: {type: "string", pattern: "^[A-Z]{3}-[0-9]{2}$"},
      note: {type: "string", maxLength: 16},
    },
    required: ["code", "note"], additionalProperties: false,
  },
};
const PROMPT = "Describe a city you like, as JSON.";
const MAX_TOKENS = 120;

describe("structured outputs", {skip: SKIP}, () => {
  let server, twoStages, oa, ajv;
  before(async () => {
    const {OpenAI} = npm("openai");
    const Ajv = npm("ajv");
    ajv = new (Ajv.default ?? Ajv)({strict: false});
    server = await startServer(["--batch", "4"]);
    twoStages = await startServer(["--workers", "2", "--batch", "4"]);
    oa = new OpenAI({baseURL: `${server.base}/v1`, apiKey: "unused", maxRetries: 0});
  });
  after(async () => {
    await stopServer(server);
    await stopServer(twoStages);
  });

  const chat = (schema, extra = {}) => ({
    model: "smollm2", max_tokens: MAX_TOKENS, temperature: 0,
    messages: [{role: "user", content: PROMPT}],
    response_format: {type: "json_schema", json_schema: {name: "reply", strict: true, schema}},
    ...extra,
  });

  test("json_schema replies validate (SDK parse; greedy and three seeds)", async () => {
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const validate = ajv.compile(schema);
      for (const sampling of [{temperature: 0}, {temperature: 0.9, seed: 1},
                              {temperature: 0.9, seed: 2}, {temperature: 0.9, seed: 3}]) {
        const r = await oa.chat.completions.parse(chat(schema, sampling));
        const c = r.choices[0];
        assert.equal(c.finish_reason, "stop", `${name} ${JSON.stringify(sampling)}: ${c.message.content}`);
        assert.ok(r.usage.completion_tokens <= MAX_TOKENS);
        assert.ok(validate(c.message.parsed),
                  `${name}: ${c.message.content}: ${ajv.errorsText(validate.errors)}`);
      }
    }
  });

  test("a streamed json_schema reply validates too", async () => {
    const stream = await oa.chat.completions.create({...chat(SCHEMAS.nested), stream: true});
    let text = "", finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, "stop");
    assert.ok(ajv.validate(SCHEMAS.nested, JSON.parse(text)), text);
  });

  test("json_object replies are a JSON object", async () => {
    const r = await post(server, "/v1/chat/completions", {
      max_tokens: MAX_TOKENS, temperature: 0,
      messages: [{role: "user", content: "Reply with an empty JSON object."}],
      response_format: {type: "json_object"}});
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const text = r.json.choices[0].message.content;
    if (r.json.choices[0].finish_reason === "stop") {
      const v = JSON.parse(text);
      assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), text);
    } else {
      // A free-form object may run past the budget: what is there is still a JSON prefix.
      assert.equal(r.json.choices[0].finish_reason, "length");
      assert.ok(text.trimStart().startsWith("{"), text);
    }
  });

  test("guided_regex, guided_grammar (Lark) and guided_choice", async () => {
    const cases = [
      {body: {prompt: "Is the sky blue? Answer:", guided_regex: " (yes|no)\\."},
       check: (t) => /^ (yes|no)\.$/.test(t)},
      {body: {prompt: "A date: ", guided_regex: "20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"},
       check: (t) => /^20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]$/.test(t)},
      {body: {prompt: "Three fruits:", guided_grammar:
              "start: fruit (\", \" fruit)~2\nfruit: /[a-z]{1,12}/"},
       check: (t) => /^[a-z]{1,12}(, [a-z]{1,12}){2}$/.test(t)},
      {body: {prompt: "The best colour is", guided_choice: [" red", " green", " blue"]},
       check: (t) => [" red", " green", " blue"].includes(t)},
    ];
    for (const {body, check} of cases) {
      for (const sampling of [{temperature: 0}, {temperature: 1, seed: 7}, {temperature: 1, seed: 8}]) {
        const r = await post(server, "/v1/completions", {max_tokens: 40, ...body, ...sampling});
        assert.equal(r.status, 200, JSON.stringify(r.json));
        const c = r.json.choices[0];
        assert.equal(c.finish_reason, "stop", JSON.stringify(c));
        assert.ok(check(c.text), `${JSON.stringify(body)}: '${c.text}'`);
      }
    }
  });

  test("two pipeline stages and a concurrent batch give the one-process replies", async () => {
    const bodies = Object.values(SCHEMAS).map((schema) => chat(schema));
    const one = [];
    for (const b of bodies) one.push((await post(server, "/v1/chat/completions", b)).json);
    const batched = await Promise.all(bodies.map((b) => post(server, "/v1/chat/completions", b)));
    const staged = await Promise.all(bodies.map((b) => post(twoStages, "/v1/chat/completions", b)));
    for (let i = 0; i < bodies.length; ++i) {
      const want = one[i].choices[0].message.content;
      assert.equal(batched[i].json.choices[0].message.content, want, "batched");
      assert.equal(staged[i].json.choices[0].message.content, want, "two stages");
      assert.equal(staged[i].json.choices[0].finish_reason, "stop");
    }
  });

  test("a grammar whose lexer explodes mid-reply fails that request only, with a 400", async () => {
    const bomb = post(server, "/v1/completions", {prompt: "ab", max_tokens: 100,
                                                  guided_regex: "(a{1,1000}){1,1000}(b{1,1000}){1,1000}"});
    const beside = post(server, "/v1/completions", {prompt: "Is the sky blue? Answer:",
                                                    max_tokens: 8, guided_regex: " (yes|no)\\."});
    const [b, ok] = await Promise.all([bomb, beside]);
    if (b.status !== 200) {
      assert.equal(b.status, 400, JSON.stringify(b.json));
      assert.match(b.json.error.message, /grammar|lexer|regex/);
      assert.ok(b.json.error.message.length < 3000, "the engine's state dump is left out");
      // In plain words: not the engine's own prefixes or the matcher's internal ones.
      assert.doesNotMatch(b.json.error.message, /grammar mask|lexer error:|parser error:|<state>/);
    }
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    assert.match(ok.json.choices[0].text, /^ (yes|no)\.$/);
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
  });

  const TOOLS = [
    {type: "function", function: {name: "get_weather", description: "The weather in a city",
      parameters: {type: "object", properties: {city: {type: "string", maxLength: 20},
                                                unit: {enum: ["c", "f"]}},
                   required: ["city", "unit"], additionalProperties: false}}},
    {type: "function", function: {name: "get_time", description: "The time in a time zone",
      parameters: {type: "object", properties: {zone: {type: "string", maxLength: 20}},
                   required: ["zone"], additionalProperties: false}}},
  ];
  const toolChat = (tool_choice, extra = {}) => ({
    model: "smollm2", max_tokens: MAX_TOKENS, temperature: 0, tools: TOOLS, tool_choice,
    messages: [{role: "user", content: "What is the weather like in Paris?"}], ...extra});
  const checkCall = (call, names) => {
    assert.ok(names.includes(call.function.name), call.function.name);
    const params = TOOLS.find((t) => t.function.name === call.function.name).function.parameters;
    const args = JSON.parse(call.function.arguments);
    assert.ok(ajv.validate(params, args), `${call.function.arguments}: ${ajv.errorsText()}`);
    assert.match(call.id, /^call_/);
  };

  test("tool_choice named and required force a valid call (SDK, streamed and not)", async () => {
    for (const [choice, names] of [[{type: "function", function: {name: "get_time"}}, ["get_time"]],
                                   ["required", ["get_weather", "get_time"]]]) {
      for (const sampling of [{temperature: 0}, {temperature: 0.9, seed: 5}]) {
        const r = await oa.chat.completions.create(toolChat(choice, sampling));
        const c = r.choices[0];
        assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
        assert.equal(c.message.tool_calls.length, 1);
        checkCall(c.message.tool_calls[0], names);
      }
      // Streamed: the deltas assemble into the same call.
      const stream = await oa.chat.completions.create({...toolChat(choice), stream: true});
      const call = {id: "", function: {name: "", arguments: ""}};
      let finish = null;
      for await (const chunk of stream) {
        const d = chunk.choices[0]?.delta;
        for (const t of d?.tool_calls ?? []) {
          call.id += t.id ?? "";
          call.function.name += t.function?.name ?? "";
          call.function.arguments += t.function?.arguments ?? "";
        }
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, "tool_calls");
      checkCall(call, names);
    }
  });

  test("Anthropic tool_choice tool and any force a valid tool_use (SDK, streamed and not)", async () => {
    const {Anthropic} = npm("@anthropic-ai/sdk");
    const an = new Anthropic({baseURL: server.base, apiKey: "unused", maxRetries: 0});
    const tools = TOOLS.map((t) => ({name: t.function.name, description: t.function.description,
                                     input_schema: t.function.parameters}));
    for (const [choice, names] of [[{type: "tool", name: "get_weather"}, ["get_weather"]],
                                   [{type: "any"}, ["get_weather", "get_time"]]]) {
      const body = {model: "smollm2", max_tokens: MAX_TOKENS, temperature: 0, tools,
                    tool_choice: choice,
                    messages: [{role: "user", content: "What is the weather like in Paris?"}]};
      const plain = await an.messages.create(body);
      const streamed = await an.messages.stream(body).finalMessage();
      for (const m of [plain, streamed]) {
        assert.equal(m.stop_reason, "tool_use", JSON.stringify(m));
        const uses = m.content.filter((b) => b.type === "tool_use");
        assert.equal(uses.length, 1, JSON.stringify(m.content));
        assert.ok(names.includes(uses[0].name), uses[0].name);
        assert.match(uses[0].id, /^toolu_/);
        const schema = tools.find((t) => t.name === uses[0].name).input_schema;
        assert.ok(ajv.validate(schema, uses[0].input), `${JSON.stringify(uses[0].input)}: ${ajv.errorsText()}`);
      }
      assert.deepEqual(streamed.content.find((b) => b.type === "tool_use").input,
                       plain.content.find((b) => b.type === "tool_use").input);
    }
    const bad = await post(server, "/v1/messages", {max_tokens: 8, tools,
      tool_choice: {type: "tool", name: "launch"}, messages: [{role: "user", content: "hi"}]});
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.message, /'launch', which is not in 'tools'/);
  });

  test("tool_choice naming an undeclared tool, or with no tools: 400", async () => {
    let r = await post(server, "/v1/chat/completions",
                       toolChat({type: "function", function: {name: "launch"}}));
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /'launch', which is not in 'tools'/);
    r = await post(server, "/v1/chat/completions",
                   {messages: [{role: "user", content: "hi"}], tool_choice: "required"});
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /needs 'tools'/);
  });

  test("bad schemas, regexes and grammars are 400s naming the problem", async () => {
    const cases = [
      [{response_format: {type: "json_schema", json_schema: {name: "x", schema: {type: "nonsense"}}}},
       /json_schema.*nonsense/],
      [{response_format: {type: "json_schema", json_schema: {name: "x"}}}, /'schema'/],
      [{guided_regex: "(unclosed"}, /regex/],
      [{guided_grammar: "start: missing_rule"}, /missing_rule/],
      [{guided_choice: []}, /guided_choice/],
      [{guided_regex: "a", response_format: {type: "json_object"}}, /both constrain/],
    ];
    for (const [extra, message] of cases) {
      const t0 = performance.now();
      const r = await post(server, "/v1/chat/completions",
                           {messages: [{role: "user", content: "hi"}], ...extra});
      assert.equal(r.status, 400, JSON.stringify(r.json));
      assert.match(r.json.error.message, message);
      assert.ok(performance.now() - t0 < 10000, "a refusal took over 10 s");
    }
    const health = await fetch(`${server.base}/health`);
    assert.equal(health.status, 200);
    const ok = await post(server, "/v1/completions",
                          {prompt: "Is the sky blue? Answer:", max_tokens: 8, guided_regex: " (yes|no)\\."});
    assert.equal(ok.status, 200);
  });
});
