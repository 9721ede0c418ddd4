"""Hostile clients, a hostile model file and an operator's shutdown against `fucina serve`'s HTTP
front end, over raw sockets on 127.0.0.1: an HTTP/1.0 request with `Expect: 100-continue` (no
interim response is allowed), error messages that would echo a 60 KB path or field back, a chat
template asking for 100 GB, and streams still running when SIGTERM's drain deadline passes (they
must end with an error the client can read).

Reuses cluster_cli_test's process helpers (same environment: FUCINA_BIN, FUCINA_DEFAULT_MODEL,
FUCINA_QWEN3_TOKENIZER for the random-weight model that carries the hostile template).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

IO_S = 30  # one exchange; generous next to what it needs, small next to a hang


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


class HttpServe(cc.Proc):
    """`fucina serve` with its HTTP front end on an ephemeral port (`self.http`)."""

    def __init__(self, *extra, model=None):
        super().__init__(["serve", model or cc.SMOLLM2, "--threads", "1", "--listen", "127.0.0.1:0",
                          "--metrics", "127.0.0.1:0", "--http", "127.0.0.1:0", *extra], "serve")
        host, port = re.search(r" http=(\S+)", self.line).group(1).rsplit(":", 1)
        self.http = (host, int(port))

    def _read_line(self, timeout):
        self.line = super()._read_line(timeout)
        return self.line


def connect(server):
    s = socket.create_connection(server.http, timeout=IO_S)
    s.settimeout(IO_S)
    return s


def read_until_closed(s, deadline_s=IO_S):
    data = b""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the server did not close within {deadline_s} s; got {data[:500]!r}")


def post_chat(server, request):
    """POSTs the JSON bytes `request` to /v1/chat/completions on a connection that closes after
    the reply; returns the reply's head and body."""
    with connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(request), request))
        reply = read_until_closed(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


def read_until(s, marker, data=b""):
    deadline = time.monotonic() + IO_S
    while marker not in data:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} within {IO_S} s; got {data[:500]!r}")
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before {marker!r}; got {data[:500]!r}")
        data += chunk
    return data


def dechunk(body):
    """The payload of a chunked body (up to where it stops, complete or not)."""
    out = b""
    while body:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


class HttpServerTestCase(unittest.TestCase):
    def wait_healthy(self, server):
        deadline = time.monotonic() + cc.READY_S
        while True:
            try:
                with connect(server) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if read_until_closed(s).startswith(b"HTTP/1.1 200"):
                        return server
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.fail(f"not healthy within {cc.READY_S} s\n{server.stderr()}")
            time.sleep(cc.POLL_S)

    def serve(self, *extra):
        server = HttpServe(*extra)
        self.addCleanup(server.kill)
        return self.wait_healthy(server)


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class HostileHttpTest(HttpServerTestCase):
    """One server for the cases that leave it as it was."""

    @classmethod
    def setUpClass(cls):
        cls.server = HttpServe()
        cls.addClassCleanup(cls.server.kill)

    def shared(self):
        self.assertIsNone(self.server.p.poll(), f"the server died\n{self.server.stderr()}")
        return self.wait_healthy(self.server)

    def test_http10_expect_continue_gets_no_interim_response(self):
        # RFC 9110 15.2: no 1xx to an HTTP/1.0 client, which cannot know what one is; its
        # expectation is ignored (10.1.1) and it gets the one final response.
        server = self.shared()
        body = b'{"prompt":"Hi"}'
        with connect(server) as s:
            s.sendall(b"POST /tokenize HTTP/1.0\r\nExpect: 100-continue\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            reply = read_until_closed(s)
        self.assertTrue(reply.startswith(b"HTTP/1.0 200 "), reply[:200])
        self.assertNotIn(b" 100 ", reply.split(b"\r\n", 1)[0])
        self.assertNotIn(b"Continue", reply)
        # An HTTP/1.1 client still gets its go-ahead before sending the body.
        with connect(server) as s:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Connection: close\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            interim = read_until(s, b"\r\n\r\n")
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim)
            s.sendall(body)
            reply = read_until_closed(s, IO_S)
        self.assertIn(b"HTTP/1.1 200 ", interim + reply)

    def test_errors_do_not_echo_a_huge_request_back(self):
        server = self.shared()
        path = "/" + "a" * 60000
        with connect(server) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = read_until_closed(s)
        head, _, body = reply.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 404 "), head)
        self.assertLess(len(body), 500, body[:600])
        message = json.loads(body)["error"]["message"]
        self.assertIn("no route for GET /aaaa", message)
        self.assertIn("(60001 bytes, cut)", message)
        # A Transfer-Encoding field is quoted the same way.
        coding = "x" * 30000
        with connect(server) as s:
            s.sendall(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {coding}, "
                      f"chunked\r\n\r\n0\r\n\r\n".encode())
            reply = read_until_closed(s)
        head, _, body = reply.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 501 "), head)
        self.assertLess(len(body), 500, body[:600])
        self.assertIn("(30000 bytes, cut)", json.loads(body)["error"]["message"])
        # So is a model name that is not served.
        request = json.dumps({"model": "m" * 60000, "max_tokens": 1,
                              "messages": [{"role": "user", "content": "Hi"}]}).encode()
        head, body = post_chat(server, request)
        self.assertTrue(head.startswith(b"HTTP/1.1 404 "), head)
        self.assertLess(len(body), 500, body[:600])
        self.assertIn("(60000 bytes, cut)", json.loads(body)["error"]["message"])


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class HostileTemplateTest(HttpServerTestCase):
    def test_a_template_asking_for_100_gb_fails_the_request_not_the_process(self):
        # A model file whose chat template asks the engine for 100 GB of indent: the failed
        # allocation used to abort the server. The request is refused naming the limit; the
        # server answers on.
        tokenizer = os.path.join(cc.TMP.name, "hostile-template-tokenizer")
        os.makedirs(tokenizer, exist_ok=True)
        shutil.copyfile(os.path.join(cc.TOKENIZER, "tokenizer.json"),
                        os.path.join(tokenizer, "tokenizer.json"))
        with open(os.path.join(cc.TOKENIZER, "tokenizer_config.json")) as f:
            config = json.load(f)
        config["chat_template"] = "{{ messages | tojson(indent=100000000000) }}"
        with open(os.path.join(tokenizer, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        model = os.path.join(cc.TMP.name, "hostile-template.gguf")
        p = subprocess.run([cc.BIN, "gguf", "make-fixture", model, *cc.FIXTURES["dense"],
                            "--tokenizer", tokenizer, "--threads", "1"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        server = HttpServe(model=model)
        self.addCleanup(server.kill)
        self.wait_healthy(server)
        request = json.dumps({"max_tokens": 2,
                              "messages": [{"role": "user", "content": "Hi"}]}).encode()
        head, body = post_chat(server, request)
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), head + body[:500])
        self.assertIn("tojson: indent 100000000000 exceeds the limit of 4096",
                      json.loads(body)["error"]["message"])
        self.assertIsNone(server.p.poll(), f"the server died\n{server.stderr()}")
        self.wait_healthy(server)


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class DrainDeadlineTest(HttpServerTestCase):
    def start_stream(self, server, path, request):
        s = connect(server)
        self.addCleanup(s.close)
        body = json.dumps(request).encode()
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        # Under way: the headers and a first event are in.
        return s, read_until(s, b"data: ")

    def test_streams_cut_at_the_drain_deadline_end_with_an_error(self):
        # Two streams far longer than the 1 s drain deadline; SIGTERM; each must end with an
        # error its client can parse (OpenAI: an error data line then [DONE]; Anthropic: an
        # `error` event) and a proper end of the chunked body, not a silent cut.
        server = self.serve("--drain-timeout", "1")
        long = {"max_tokens": 4000, "ignore_eos": True, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Count from one to a thousand."}]}
        openai, openai_data = self.start_stream(server, "/v1/chat/completions", long)
        model = os.path.splitext(os.path.basename(cc.SMOLLM2))[0]
        anthropic, anthropic_data = self.start_stream(server, "/v1/messages",
                                                      {"model": model, **long})
        sent = time.monotonic()
        server.p.send_signal(signal.SIGTERM)
        openai_data += read_until_closed(openai)
        anthropic_data += read_until_closed(anthropic)
        self.assertLess(time.monotonic() - sent, 10, "the cut came long after the deadline")
        self.assertEqual(server.p.wait(timeout=IO_S), 0, server.stderr())

        for name, data in (("openai", openai_data), ("anthropic", anthropic_data)):
            self.assertTrue(data.endswith(b"\r\n0\r\n\r\n"),
                            f"{name}: the chunked body was not ended: {data[-300:]!r}")
        events = dechunk(openai_data.partition(b"\r\n\r\n")[2]).decode()
        lines = [line for line in events.split("\n") if line.startswith("data: ")]
        self.assertEqual(lines[-1], "data: [DONE]", events[-500:])
        error = json.loads(lines[-2][len("data: "):])["error"]
        self.assertEqual(error["code"], 503, error)
        self.assertIn("--drain-timeout", error["message"])

        events = dechunk(anthropic_data.partition(b"\r\n\r\n")[2]).decode()
        blocks = [b for b in events.split("\n\n") if b.strip()]
        self.assertTrue(blocks[-1].startswith("event: error\n"), events[-500:])
        error = json.loads(blocks[-1].split("data: ", 1)[1])["error"]
        self.assertIn("--drain-timeout", error["message"])


if __name__ == "__main__":
    unittest.main()
