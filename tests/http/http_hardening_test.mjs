// What a hostile client sends to `fucina serve`'s HTTP front end, over raw sockets: nesting that
// would overflow the stack, request smuggling through Transfer-Encoding / duplicate fields,
// values of the wrong JSON type, bytes that are not UTF-8, slow senders holding every
// connection slot, half-closed sockets, HEAD. Each server binds port 0 and prints its address.
//
//   FUCINA_BIN=build/tools/fucina FUCINA_DEFAULT_MODEL=.../SmolLM2-135M-Instruct.Q4_1.gguf \
//     node --test tests/http/http_hardening_test.mjs
import {after, before, describe, test} from "node:test";
import assert from "node:assert/strict";
import {spawn} from "node:child_process";
import net from "node:net";
import {listeningLine, terminate} from "./serve_process.mjs";

const BIN = process.env.FUCINA_BIN;
const MODEL = process.env.FUCINA_DEFAULT_MODEL;
const SKIP = !MODEL ? "FUCINA_DEFAULT_MODEL is not set" : !BIN ? "FUCINA_BIN is not set" : false;

const live = new Set();
process.on("exit", () => {
  for (const s of live) s.child.kill("SIGKILL");
});

// Starts `fucina serve` on free ports; resolves once /health answers 200.
async function startServer(args) {
  const argv = ["serve", MODEL, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                "--http", "127.0.0.1:0", "--threads", "1", "--temp", "0", ...args];
  const child = spawn(BIN, argv, {stdio: ["ignore", "pipe", "pipe"]});
  const server = {child, stderr: ""};
  live.add(server);
  child.stderr.on("data", (d) => (server.stderr = (server.stderr + d).slice(-4000)));
  const line = await listeningLine(child, server);
  const m = /http=(\S+)$/.exec(line);
  assert.ok(m, line);
  const [host, port] = m[1].split(":");
  Object.assign(server, {host, port: Number(port)});
  const deadline = Date.now() + 60000;
  for (;;) {
    const r = await request(server, "GET", "/health").catch(() => ({status: 0}));
    if (r.status === 200) break;
    assert.ok(Date.now() < deadline, `not healthy within 60 s: ${server.stderr}`);
    await sleep(50);
  }
  return server;
}

async function stopServer(server) {
  if (!server) return;
  live.delete(server);
  if (server.child.exitCode !== null || server.child.signalCode !== null) {
    assert.fail(`the server had died: ${server.stderr}`);
  }
  await terminate(server.child);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Sends `bytes` on a new connection and collects everything until the server closes it (or
// `timeoutMs`). `halfClose`: shut down our sending side after writing (nc -N). Returns the
// bytes, whether the server closed, and the final (non-1xx) responses parsed from them.
function exchange(server, bytes, {halfClose = false, timeoutMs = 30000, keepOpen = false} = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(server.port, server.host);
    const chunks = [];
    let closed = false;
    const finish = () => {
      clearTimeout(timer);
      const data = Buffer.concat(chunks);
      resolve({data, closed, responses: parseResponses(data), socket});
    };
    const timer = setTimeout(() => {
      if (!keepOpen) socket.destroy();
      finish();
    }, timeoutMs);
    socket.on("data", (d) => chunks.push(d));
    socket.on("end", () => {
      closed = true;
      socket.destroy();
      finish();
    });
    socket.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    socket.write(bytes);
    if (halfClose) socket.end();
  });
}

// Final responses (1xx interim ones skipped) in a byte stream: status, headers, body (framed by
// Content-Length or chunked).
function parseResponses(data) {
  const out = [];
  let at = 0;
  while (at < data.length) {
    const end = data.indexOf("\r\n\r\n", at);
    if (end < 0) break;
    const head = data.subarray(at, end).toString("latin1").split("\r\n");
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head[0])?.[1]);
    const headers = {};
    for (const h of head.slice(1)) {
      const i = h.indexOf(":");
      headers[h.slice(0, i).toLowerCase()] = h.slice(i + 1).trim();
    }
    at = end + 4;
    if (status >= 100 && status < 200) continue;
    let body = Buffer.alloc(0);
    let complete = true;  // false: the body has not all arrived yet
    if (headers["transfer-encoding"] === "chunked") {
      const parts = [];
      complete = false;
      for (;;) {
        const nl = data.indexOf("\r\n", at);
        if (nl < 0) break;
        const size = parseInt(data.subarray(at, nl).toString(), 16);
        if (size === 0) {
          complete = data.length >= nl + 4;
          at = nl + 4;
          break;
        }
        if (data.length < nl + 2 + size + 2) break;
        parts.push(data.subarray(nl + 2, nl + 2 + size));
        at = nl + 2 + size + 2;
      }
      body = Buffer.concat(parts);
    } else if (headers["content-length"] !== undefined) {
      const n = Number(headers["content-length"]);
      complete = data.length >= at + n;
      body = data.subarray(at, at + n);
      at += n;
    }
    out.push({status, headers, body: body.toString("utf8"), complete});
    if (!complete) break;
  }
  return out;
}

function rawRequest(method, path, {body, headers = {}, host = "localhost"} = {}) {
  const data = body === undefined ? "" : typeof body === "string" ? body : JSON.stringify(body);
  let head = `${method} ${path} HTTP/1.1\r\nHost: ${host}\r\n`;
  if (body !== undefined) {
    head += "Content-Type: application/json\r\n";
    if (!("Transfer-Encoding" in headers) && !("Content-Length" in headers)) {
      head += `Content-Length: ${Buffer.byteLength(data)}\r\n`;
    }
  }
  for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`;
  return Buffer.concat([Buffer.from(head + "\r\n", "latin1"), Buffer.from(data)]);
}

// One request on its own connection, closed by us after the response.
async function request(server, method, path, opts = {}) {
  const r = await exchange(server, rawRequest(method, path,
                                              {...opts, headers: {Connection: "close",
                                                                  ...opts.headers}}));
  assert.equal(r.responses.length, 1, `one response to ${method} ${path}: ${r.data}`);
  const res = r.responses[0];
  try {
    res.json = JSON.parse(res.body);
  } catch {}
  return res;
}

function assertError(res, status, messageMatch) {
  assert.equal(res.status, status, `expected ${status}, got ${res.status}: ${res.body}`);
  assert.ok(res.json, `a JSON error body: ${res.body}`);
  const message = res.json.error?.message;
  assert.equal(typeof message, "string", res.body);
  if (messageMatch) assert.match(message, messageMatch);
  assert.doesNotMatch(message, /\[json\.exception/, "not nlohmann's internal text");
  return message;
}

const nested = (depth) => "[".repeat(depth) + "]".repeat(depth);

describe("HTTP hardening", {skip: SKIP}, () => {
  describe("default limits", () => {
    let server;
    before(async () => (server = await startServer(["--ctx", "256"])));
    after(() => stopServer(server));

    // Item: recursive walks after parsing overflowed the stack (SIGSEGV) on deep nesting.
    test("deep nesting anywhere: 400 naming the limit, and the server lives", async () => {
      const user = '{"role":"user","content":"Hi"}';
      const cases = [
        ["/v1/chat/completions", `{"messages":[${user}],"tools":[{"type":"function",` +
                                 `"function":{"name":"f","parameters":${nested(50000)}}}]}`],
        ["/v1/chat/completions", `{"messages":[{"role":"assistant","tool_calls":` +
                                 `${nested(100000)}},${user}]}`],
        ["/v1/chat/completions", `{"messages":[{"role":"user","content":${nested(1000000)}}]}`],
        ["/v1/messages", `{"max_tokens":2,"messages":[{"role":"user","content":` +
                         `${nested(3000000)}}]}`],
        ["/v1/completions", `{"prompt":"Hi","unknown":${nested(65)}}`],
        ["/v1/responses", `{"input":${nested(100000)}}`],
        ["/tokenize", `{"prompt":"Hi","x":${"{\"a\":".repeat(100)}1${"}".repeat(100)}}`],
      ];
      for (const [path, body] of cases) {
        const res = await request(server, "POST", path, {body});
        assertError(res, 400, /deeper than 64 levels/);
      }
      // 64 levels in all (58 in a tool schema) still render and run.
      const ok = await request(server, "POST", "/v1/chat/completions", {body:
          `{"max_tokens":2,"messages":[${user}],"tools":[{"type":"function",` +
          `"function":{"name":"f","parameters":{"x":${nested(58)}}}}]}`});
      assert.equal(ok.status, 200, ok.body);
    });

    // Item: values of the wrong JSON type reached nlohmann's throwing accessors (500).
    test("wrong JSON types in parts, tools and thinking: 400 naming the field", async () => {
      const user = (content) => ({messages: [{role: "user", content}], max_tokens: 2});
      assertError(await request(server, "POST", "/v1/chat/completions",
                                {body: user([{type: 5}])}),
                  400, /messages\[0\]\.content\[0\]\.type must be a string/);
      assertError(await request(server, "POST", "/v1/chat/completions",
                                {body: {...user("Hi"), tools: [{type: 5}]}}),
                  400, /tools\[0\]/);
      assertError(await request(server, "POST", "/v1/chat/completions",
                                {body: {...user("Hi"), chat_template_kwargs: {enable_thinking: 1}}}),
                  400, /enable_thinking/);
      assertError(await request(server, "POST", "/v1/messages",
                                {body: {...user([{type: 5}])}}),
                  400, /messages\[0\]\.content\[0\]\.type must be a string/);
      assertError(await request(server, "POST", "/v1/messages",
                                {body: {...user("Hi"), thinking: {type: 7}}}),
                  400, /thinking\.type must be a string/);
      assertError(await request(server, "POST", "/v1/responses",
                                {body: {input: [{role: "user", content: [{type: 5}]}]}}),
                  400, /input\[0\]\.content\[0\]\.type must be a string/);
      assertError(await request(server, "POST", "/v1/chat/completions",
                                {body: {messages: [{role: "assistant", tool_calls: [5]},
                                                   {role: "user", content: "Hi"}]}}),
                  400, /tool_calls\[0\] must be an object/);
    });

    test("bytes that are not UTF-8 in the path: 404 with a JSON body", async () => {
      const r = await exchange(server, Buffer.concat([
          Buffer.from("GET /v1/"), Buffer.from([0xff, 0xfe]),
          Buffer.from(" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")]));
      assert.equal(r.responses.length, 1, r.data.toString("latin1"));
      const res = r.responses[0];
      assert.equal(res.status, 404, res.body);
      assert.match(JSON.parse(res.body).error.message, /\/v1\/\ufffd\ufffd/);
    });

    // Item: TE not exactly chunked was ignored and the body framed by Content-Length, so a
    // pipelined request rode along. One 400/501, then the connection is closed.
    test("ambiguous framing: refused, the connection closed, nothing smuggled", async () => {
      const smuggled = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n";
      const post = (headers, body) => `POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n` +
                                      `Content-Type: application/json\r\n${headers}\r\n${body}`;
      const cases = [
        [post("Transfer-Encoding: chunked, identity\r\nContent-Length: 2\r\n", "{}"), 400],
        [post("Transfer-Encoding: gzip\r\nContent-Length: 2\r\n", "{}"), 400],
        [post("Transfer-Encoding: gzip, chunked\r\n", "2\r\n{}\r\n0\r\n\r\n"), 501],
        [post("Content-Length: 2\r\nContent-Length: 3\r\n", "{}"), 400],
        [post("Transfer-Encoding: chunked\r\nContent-Length: 2\r\n", "0\r\n\r\n"), 400],
        ["GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n", 400],
        ["GET /v1/models HTTP/1.1\r\n\r\n", 400],
      ];
      for (const [bytes, status] of cases) {
        const r = await exchange(server, bytes + smuggled, {timeoutMs: 10000});
        assert.ok(r.closed, `the server closed the connection after ${JSON.stringify(bytes)}`);
        assert.equal(r.responses.length, 1,
                     `exactly one response to ${JSON.stringify(bytes)}: ${r.data}`);
        assertError({...r.responses[0], json: JSON.parse(r.responses[0].body)}, status);
      }
      // Plain chunked with a pipelined request after it still works: two responses.
      const body = JSON.stringify({prompt: [1, 2], max_tokens: 1});
      const chunked = `POST /tokenize HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n` +
                      `\r\n${Buffer.byteLength('{"prompt":"Hi"}').toString(16)}\r\n{"prompt":"Hi"}` +
                      `\r\n0\r\n\r\n`;
      const r = await exchange(server, chunked + smuggled.replace("\r\n\r\n",
                                                                  "\r\nConnection: close\r\n\r\n"));
      assert.deepEqual(r.responses.map((x) => x.status), [200, 200], r.data.toString());
      assert.ok(body);
    });

    // Item: a half-closed client (nc -N) was taken for gone and got 499.
    test("a half-closed client still gets its response, plain and streamed", async () => {
      const body = {prompt: "Once upon a time", max_tokens: 8, ignore_eos: true};
      const r = await exchange(server, rawRequest("POST", "/v1/completions", {body}),
                               {halfClose: true});
      assert.equal(r.responses.length, 1, r.data.toString());
      assert.equal(r.responses[0].status, 200, r.responses[0].body);
      assert.equal(JSON.parse(r.responses[0].body).usage.completion_tokens, 8);
      const s = await exchange(server, rawRequest("POST", "/v1/completions",
                                                  {body: {...body, stream: true}}),
                               {halfClose: true});
      assert.equal(s.responses[0].status, 200);
      assert.match(s.responses[0].body, /data: \[DONE\]\n\n$/);
      const chat = await exchange(server, rawRequest("POST", "/v1/chat/completions", {body:
          {messages: [{role: "user", content: "Hi"}], max_tokens: 4}}), {halfClose: true});
      assert.equal(chat.responses[0].status, 200, chat.data.toString());
    });

    test("HEAD wherever GET works: the headers, no body; other methods 405 with Allow",
         async () => {
      for (const path of ["/health", "/metrics", "/v1/models", "/openapi.json"]) {
        const get = await request(server, "GET", path);
        assert.equal(get.status, 200);
        const r = await exchange(server, rawRequest("HEAD", path,
                                                    {headers: {Connection: "close"}}));
        const head = r.data.toString("latin1");
        assert.match(head, /^HTTP\/1\.1 200 /, head);
        assert.ok(head.endsWith("\r\n\r\n"), `no body after HEAD ${path}: ${head}`);
        const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1]);
        if (path !== "/metrics") assert.equal(length, Buffer.byteLength(get.body), path);
      }
      const r = await request(server, "DELETE", "/health");
      assert.equal(r.status, 405);
      assert.equal(r.headers.allow, "GET, HEAD");
      const p = await request(server, "GET", "/v1/completions");
      assert.equal(p.status, 405);
      assert.equal(p.headers.allow, "POST");
    });
  });

  describe("--max-connections 4 --http-request-timeout 1 --allow-host localhost --batch 1", () => {
    let server;
    before(async () => (server = await startServer(
        ["--max-connections", "4", "--http-request-timeout", "1", "--http-min-rate", "1000",
         "--allow-host", "localhost", "--ctx", "512", "--batch", "1"])));
    after(() => stopServer(server));

    test("a Host that is not UTF-8: 403 with a JSON body", async () => {
      const r = await exchange(server, Buffer.concat([
          Buffer.from("GET /v1/models HTTP/1.1\r\nHost: h"), Buffer.from([0xff]),
          Buffer.from("\r\nConnection: close\r\n\r\n")]));
      assert.equal(r.responses[0]?.status, 403, r.data.toString("latin1"));
      assert.match(JSON.parse(r.responses[0].body).error.message, /h\ufffd/);
    });

    // Item: sockets that each sent one byte held every slot, /health included, indefinitely.
    test("slow senders: health and metrics stay answerable, the senders get 408 and go",
         async () => {
      // A slow body: a complete header, then a byte now and then (connected first, so it has
      // a slot).
      const body = JSON.stringify({prompt: "Hi", max_tokens: 1});
      const dribble = net.connect(server.port, server.host);
      await new Promise((resolve) => dribble.once("connect", resolve));
      dribble.write(`POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n` +
                    `Content-Length: ${body.length}\r\n\r\n`);
      // Then more one-byte senders than there are slots.
      const slow = [];
      for (let i = 0; i < 8; i++) {
        slow.push(exchange(server, "P", {timeoutMs: 15000}));
      }
      const dribbled = new Promise((resolve) => {
        const chunks = [];
        let i = 0;
        const timer = setInterval(() => !dribble.destroyed && dribble.write(body[i++ % 2]), 200);
        dribble.on("data", (d) => chunks.push(d));
        dribble.on("close", () => {
          clearInterval(timer);
          resolve(Buffer.concat(chunks).toString());
        });
      });
      const t0 = performance.now();
      // Every slot is taken (or about to be): probes are answered at once regardless.
      for (let i = 0; i < 3; i++) {
        const h = await request(server, "GET", "/health");
        assert.equal(h.status, 200, h.body);
        const m = await request(server, "GET", "/metrics");
        assert.equal(m.status, 200);
        assert.match(m.body, /fucina_num_requests_running/);
      }
      const probes = performance.now() - t0;
      assert.ok(probes < 3000, `6 probes took ${Math.round(probes)} ms`);
      // An API call while full: 503 with Retry-After (or served, if a slot freed meanwhile).
      const api = await request(server, "GET", "/v1/models");
      assert.ok(api.status === 503 || api.status === 200, api.body);
      if (api.status === 503) assert.match(api.headers["retry-after"] ?? "", /^\d+$/);
      // The slow senders in slots are answered 408 and closed after the 1 s deadline.
      const results = await Promise.all(slow);
      const timedOut = results.filter((r) => r.responses[0]?.status === 408);
      assert.ok(timedOut.length >= 3, `408s: ${results.map((r) => r.responses[0]?.status)}`);
      assert.ok(results.every((r) => r.closed), "every slow sender was closed");
      const elapsed = performance.now() - t0;
      assert.ok(elapsed < 6000, `slow senders held on for ${Math.round(elapsed)} ms`);
      assert.match(await dribbled, /^HTTP\/1\.1 408 /);

      console.log(`# slow senders: 6 probes in ${Math.round(probes)} ms while full; ` +
                  `${timedOut.length} x 408, all closed after ${Math.round(elapsed)} ms`);
      // The slots are free again.
      const ok = await request(server, "POST", "/v1/completions",
                               {body: {prompt: "Hi", max_tokens: 2}});
      assert.equal(ok.status, 200, ok.body);
      // A connection that never sends a byte gives its slot back after the request deadline,
      // not the 60 s keep-alive idle limit.
      const t1 = performance.now();
      const silent = await exchange(server, "", {timeoutMs: 15000});
      const silentMs = performance.now() - t1;
      assert.ok(silent.closed && silent.data.length === 0, `silent: ${silent.data}`);
      assert.ok(silentMs < 5000, `a silent connection held its slot ${Math.round(silentMs)} ms`);
    });

    test("the read deadline counts per request, never a response being streamed", async () => {
      // Keep-alive: a second request well after the first one's deadline is served.
      const socket = net.connect(server.port, server.host);
      const received = [];
      socket.on("data", (d) => received.push(d));
      const waitFor = async (n) => {
        const deadline = Date.now() + 20000;
        while (parseResponses(Buffer.concat(received)).filter((r) => r.complete).length < n) {
          assert.ok(Date.now() < deadline, `no response ${n}: ${Buffer.concat(received)}`);
          await sleep(20);
        }
      };
      socket.write(rawRequest("GET", "/v1/models"));
      await waitFor(1);
      await sleep(1500);  // longer than --http-request-timeout: the connection idles, allowed
      // A stream that outlasts the read deadline (with --threads 1, 400 tokens take seconds).
      const t0 = performance.now();
      socket.write(rawRequest("POST", "/v1/completions", {body:
          {prompt: "Once upon a time", max_tokens: 400, ignore_eos: true, stream: true}}));
      await waitFor(2);
      const ms = performance.now() - t0;
      socket.destroy();
      const stream = parseResponses(Buffer.concat(received))[1];
      assert.equal(stream.status, 200);
      assert.match(stream.body, /"finish_reason":"length"/);
      assert.match(stream.body, /data: \[DONE\]\n\n$/);
      console.log(`# a 400-token stream took ${Math.round(ms)} ms (request deadline 1000 ms)`);
    });

    // A client that closes while its streamed request still waits in the queue (no event
    // written yet) gives up its place as fast as a non-streamed one.
    test("a streamed request whose client leaves while queued is cancelled", async () => {
      const metric = async (name) => {
        const m = await request(server, "GET", "/metrics");
        return Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(m.body)[1]);
      };
      const waitMetric = async (name, want, limitMs) => {
        const t0 = performance.now();
        for (;;) {
          const v = await metric(name);
          const ms = performance.now() - t0;
          if (v === want) return ms;
          assert.ok(ms < limitMs, `${name} is ${v}, not ${want}, after ${Math.round(ms)} ms`);
          await sleep(20);
        }
      };
      const long = exchange(server, rawRequest("POST", "/v1/completions", {body:
          {prompt: "Once upon a time", max_tokens: 400, ignore_eos: true}}));
      await waitMetric("fucina_num_requests_running", 1, 10000);
      const queued = net.connect(server.port, server.host);
      queued.on("error", () => {});
      queued.write(rawRequest("POST", "/v1/completions", {body:
          {prompt: "Hi", max_tokens: 8, stream: true}}));
      await waitMetric("fucina_num_requests_waiting", 1, 5000);
      queued.destroy();
      const ms = await waitMetric("fucina_num_requests_waiting", 0, 3000);
      assert.ok(ms < 1000, `waiting went back to 0 after ${Math.round(ms)} ms`);
      console.log(`# streamed request, client gone while queued: cancelled after ` +
                  `${Math.round(ms)} ms`);
      const done = await long;
      assert.equal(done.responses[0]?.status, 200);
    });
  });

  // SIGTERM (a pod being stopped): the request in flight finishes whole, a connection idle
  // between requests does not hold the exit, new connections are refused, and the exit is clean.
  describe("SIGTERM drains", () => {
    test("a streamed request in flight finishes; idle keep-alive connections close", async () => {
      const server = await startServer(["--drain-timeout", "120", "--http-idle-timeout", "600"]);
      live.delete(server);
      const exited = new Promise((resolve) => server.child.once("exit", (code, sig) =>
        resolve({code, sig})));
      // An idle keep-alive connection: one answered request, then it stays open.
      const idle = await exchange(server, rawRequest("GET", "/health"),
                                  {timeoutMs: 300, keepOpen: true});
      assert.equal(idle.responses[0]?.status, 200);
      assert.equal(idle.closed, false);
      const stream = exchange(server, rawRequest("POST", "/v1/completions", {body:
          {prompt: "Once upon a time", max_tokens: 64, ignore_eos: true, stream: true,
           temperature: 0}}), {timeoutMs: 120000});
      // SIGTERM once the stream is under way (its headers and first events are out).
      const t0 = performance.now();
      for (;;) {
        const m = await request(server, "GET", "/metrics");
        if (/^fucina_num_requests_running(?:\{[^}]*\})? 1$/m.test(m.body)) break;
        assert.ok(performance.now() - t0 < 10000, "the stream never started");
        await sleep(10);
      }
      server.child.kill("SIGTERM");
      const done = await stream;
      const res = done.responses[0];
      assert.equal(res?.status, 200, done.data.toString());
      assert.ok(res.complete, "the stream was cut");
      assert.match(res.body, /"finish_reason":"length"/);
      assert.match(res.body, /data: \[DONE\]\n\n$/);
      const {code, sig} = await exited;
      assert.equal(sig, null);
      assert.equal(code, 0, server.stderr);
      idle.socket.destroy();
      await assert.rejects(request(server, "GET", "/health"), /ECONNREFUSED/);
    });
  });
});
