"""Hostile grammars against `fucina serve`'s HTTP front end on 127.0.0.1: grammars deep enough to
overflow the compiler's stack (the process died), a burst of grammars slow to compile (each
refused compile used to leave its thread running: threads and memory piled up), forced tool
calls whose parameters use `$defs`/`$ref` as Pydantic writes them, and JSON replies that could
run on in whitespace until max_tokens.

Reuses cluster_cli_test's and hostile_http_test's process and socket helpers (same environment:
FUCINA_BIN, FUCINA_DEFAULT_MODEL).
"""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402
import hostile_http_test as hh  # noqa: E402

# More than the most compiles a server lets run or wait at once on any machine (4 a thread, at
# most 8 threads).
BURST = 48
# Choices of a guided_choice grammar within the limits, slow to compile (tens of milliseconds at
# least, the literals' cost being quadratic).
SLOW_CHOICES = 9000


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


def request_bytes(path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data


def parse_response(raw):
    """(status, headers with lower-case names, body) of a whole response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = hh.dechunk(body)
    return status, headers, body


def post(server, path, body):
    with hh.connect(server) as s:
        s.sendall(request_bytes(path, body))
        status, headers, raw = parse_response(hh.read_until_closed(s))
    return status, headers, json.loads(raw) if raw else None


def chat(content, **extra):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 1,
            "temperature": 0, **extra}


def lark_chain(rules):
    g = "start: r0\n" + "".join(f"r{i}: r{i + 1} | \"x\"\n" for i in range(rules))
    return g + f"r{rules}: \"y\"\n"


def ref_chain(links):
    defs = {f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


# Pydantic's schema of `class Paint(BaseModel): color: Color; coats: int` with `Color` an enum.
PYDANTIC_PARAMS = {
    "$defs": {"Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"}},
    "properties": {"color": {"$ref": "#/$defs/Color"},
                   "coats": {"title": "Coats", "type": "integer"}},
    "required": ["color", "coats"],
    "title": "Paint",
    "type": "object",
}


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class HostileGrammarTest(hh.HttpServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = None

    def shared(self):
        if HostileGrammarTest.server is None or HostileGrammarTest.server.p.poll() is not None:
            server = hh.HttpServe()
            HostileGrammarTest.server = server
            self.__class__.addClassCleanup(server.kill)
        return self.wait_healthy(HostileGrammarTest.server)

    def test_grammars_deep_enough_to_overflow_the_stack_are_refused_naming_the_limit(self):
        server = self.shared()
        for field, value, says in [
                ("guided_grammar", lark_chain(5000), "at most 2000 are allowed"),
                ("response_format", {"type": "json_schema",
                                     "json_schema": {"name": "deep", "schema": ref_chain(1000)}},
                 "at most 2000 are allowed"),
                ("guided_choice", [f"c{i}" for i in range(20000)], "at most 10000 are allowed")]:
            try:
                status, _, body = post(server, "/v1/chat/completions", chat("Hi", **{field: value}))
            except OSError as e:
                self.fail(f"{field}: the server died ({e})\n{server.stderr()}")
            self.assertEqual(status, 400, f"{field}: {body}")
            self.assertIn(says, body["error"]["message"], field)
        self.assertIsNone(server.p.poll(), server.stderr())
        self.wait_healthy(server)

    def test_a_burst_of_slow_compiles_is_refused_with_503_not_queued_without_bound(self):
        server = self.shared()
        choices = [f"choice number {i}" for i in range(SLOW_CHOICES)]
        # Every request is sent but its last byte, then the last bytes go together: the
        # compiles start within milliseconds of each other.
        sockets = []
        try:
            for i in range(BURST):
                s = hh.connect(server)
                sockets.append(s)
                s.sendall(request_bytes("/v1/chat/completions",
                                        chat(f"Pick {i}", guided_choice=choices))[:-1])
            for s in sockets:
                s.sendall(b"}")
            replies = [parse_response(hh.read_until_closed(s, 120)) for s in sockets]
        finally:
            for s in sockets:
                s.close()
        statuses = [status for status, _, _ in replies]
        busy = [r for r in replies if r[0] == 503]
        self.assertTrue(busy, f"no compile was refused as busy: {statuses}")
        for status, headers, body in replies:
            self.assertIn(status, (200, 400, 503), body[:300])
            if status == 503:
                self.assertEqual(headers.get("retry-after"), "1")
                self.assertIn("try again", json.loads(body)["error"]["message"])
            if status == 400:  # past --grammar-timeout on a slow machine
                self.assertIn("--grammar-timeout", json.loads(body)["error"]["message"])
        self.assertIsNone(server.p.poll(), server.stderr())
        # Once the burst is over, grammars compile again.
        deadline = time.monotonic() + 60
        while True:
            status, _, body = post(server, "/v1/chat/completions",
                                   chat("Yes or no?", guided_choice=["yes", "no"]))
            if status != 503 or time.monotonic() > deadline:
                break
            time.sleep(cc.POLL_S)
        self.assertEqual(status, 200, body)
        self.assertIn(body["choices"][0]["message"]["content"], ("y", "n", "yes", "no"))

    def test_forced_tool_calls_take_pydantic_schemas_with_defs(self):
        server = self.shared()
        tool = {"type": "function",
                "function": {"name": "paint", "description": "Paint the wall",
                             "parameters": PYDANTIC_PARAMS}}
        status, _, body = post(server, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Paint the wall red, two coats."}],
            "tools": [tool], "tool_choice": "required", "max_tokens": 60, "temperature": 0})
        self.assertEqual(status, 200, body)
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        self.assertEqual(call["name"], "paint")
        args = json.loads(call["arguments"])
        self.assertIn(args["color"], ("red", "green", "blue"))
        self.assertIsInstance(args["coats"], int)
        # Two tools, each with $defs of its own under the same name: each sees its own (what
        # the small model writes into them is its business).
        other = {"type": "function",
                 "function": {"name": "wait", "parameters": {
                     "type": "object", "properties": {"color": {"$ref": "#/$defs/Color"}},
                     "$defs": {"Color": {"type": "integer"}}}}}
        status, _, body = post(server, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Paint the wall red, two coats."}],
            "tools": [tool, other], "tool_choice": "required", "max_tokens": 1, "temperature": 0})
        self.assertEqual(status, 200, body)
        status, _, body = post(server, "/v1/messages", {
            "max_tokens": 60, "temperature": 0,
            "messages": [{"role": "user", "content": "Paint the wall red, two coats."}],
            "tools": [{"name": "paint", "input_schema": PYDANTIC_PARAMS}],
            "tool_choice": {"type": "any"}})
        self.assertEqual(status, 200, body)
        use = [b for b in body["content"] if b["type"] == "tool_use"][0]
        self.assertIn(use["input"]["color"], ("red", "green", "blue"))

    def test_json_replies_have_no_free_whitespace_unless_asked(self):
        server = self.shared()
        schema = {"type": "object", "properties": {
            "done": {"type": "boolean"}, "steps": {"type": "array", "items": {"type": "string"}}},
            "required": ["done", "steps"]}
        for seed in range(3):
            status, _, body = post(server, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "List the steps to make tea as JSON."}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "tea", "schema": schema}},
                "max_tokens": 60, "temperature": 1.0, "seed": seed})
            self.assertEqual(status, 200, body)
            content = body["choices"][0]["message"]["content"]
            for ws in ("\n", "\t", "\r", "  "):
                self.assertNotIn(ws, content, f"seed {seed}: {content!r}")
        # vLLM's guided_whitespace_pattern sets the whitespace allowed: only JSON takes it.
        status, _, body = post(server, "/v1/chat/completions", chat(
            "Tea?", response_format={"type": "json_object"},
            guided_whitespace_pattern="[ \\n]{0,2}"))
        self.assertEqual(status, 200, body)
        status, _, body = post(server, "/v1/chat/completions", chat(
            "Tea?", guided_regex="(yes|no)", guided_whitespace_pattern=" ?"))
        self.assertEqual(status, 400, body)
        self.assertIn("guided_whitespace_pattern", body["error"]["message"])


if __name__ == "__main__":
    unittest.main()
