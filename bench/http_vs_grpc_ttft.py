#!/usr/bin/python3
"""Time to first token through the HTTP front end vs the gRPC API of the same `fucina serve`.

    bench/http_vs_grpc_ttft.py MODEL [--requests 40] [--fucina build/tools/fucina]

Alternates streamed chat requests (one user message, greedy, 8 new tokens) over HTTP
(/v1/chat/completions, to the first content delta) and gRPC (GenerateStream, to the first
message with text) on one server, each request a different message so no turn is served from
another's KV; prints p50/p99 of each and of the difference. Needs the system python3 (Debian's
python3-grpcio), protoc and grpc_python_plugin.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stubs(tmp):
    subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), f"--python_out={tmp}",
                    f"--grpc_out={tmp}",
                    f"--plugin=protoc-gen-grpc={shutil.which('grpc_python_plugin')}",
                    os.path.join(ROOT, "proto/fucina/v1/generate.proto")], check=True)
    sys.path.insert(0, tmp)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--fucina", default=os.path.join(ROOT, "build/tools/fucina"))
    args = ap.parse_args()
    import grpc
    tmp = tempfile.mkdtemp()
    stubs(tmp)
    import fucina.v1.generate_pb2 as pb
    import fucina.v1.generate_pb2_grpc as pb_grpc

    server = subprocess.Popen([args.fucina, "serve", args.model, "--listen", "127.0.0.1:0",
                               "--metrics", "127.0.0.1:0", "--http", "127.0.0.1:0",
                               "--temp", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        line = server.stdout.readline()
        m = re.search(r"grpc=(\S+) metrics=\S+ http=(\S+)", line)
        grpc_addr, http_addr = m.group(1), m.group(2)
        host, port = http_addr.rsplit(":", 1)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection(host, int(port), timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(grpc_addr))

        def over_http(text):
            c = http.client.HTTPConnection(host, int(port), timeout=60)
            body = json.dumps({"messages": [{"role": "user", "content": text}], "stream": True,
                               "max_tokens": 8, "temperature": 0})
            t0 = time.perf_counter()
            c.request("POST", "/v1/chat/completions", body,
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            first = None
            for raw in r:
                line = raw.decode().strip()
                if first is None and line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    if delta.get("content"):
                        first = time.perf_counter() - t0
            c.close()
            return first

        def over_grpc(text):
            req = pb.GenerateRequest(max_tokens=8)
            req.messages.messages.add(role="user", content=text)
            req.sampling.temperature = 0
            t0 = time.perf_counter()
            first = None
            for chunk in stub.GenerateStream(req, timeout=60):
                if first is None and chunk.text:
                    first = time.perf_counter() - t0
            return first

        over_http("warm up")
        over_grpc("warm up again")
        h, g = [], []
        for i in range(args.requests):
            # Distinct messages of the same length; the chat template's prefix is shared.
            h.append(over_http(f"Question number {i:04d}: name a colour."))
            g.append(over_grpc(f"Question number {i + 5000:04d}: name a colour."))
        h = [x * 1000 for x in h if x is not None]
        g = [x * 1000 for x in g if x is not None]
        print(f"time to first token, {len(h)} + {len(g)} requests (ms):")
        print(f"  HTTP  p50 {statistics.median(h):7.2f}  p99 {percentile(h, 99):7.2f}")
        print(f"  gRPC  p50 {statistics.median(g):7.2f}  p99 {percentile(g, 99):7.2f}")
        print(f"  HTTP overhead  p50 {statistics.median(h) - statistics.median(g):+7.2f}  "
              f"p99 {percentile(h, 99) - percentile(g, 99):+7.2f}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
