// A `fucina serve` child process as the HTTP test files handle it.

// The first line a `fucina` server prints on stdout (`listening grpc=... metrics=... http=...`). Rejects when the process exits first or after 60 s; stdout keeps
// draining afterwards so the server never blocks on a full pipe. `server.stderr` (the last 4 KB,
// kept by the caller) goes into the error.
export function listeningLine(child, server) {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error("no `listening` line within 60 s")), 60000);
    const onData = (d) => {
      out += d;
      const nl = out.indexOf("\n");
      if (nl < 0) return;
      clearTimeout(timer);
      child.stdout.off("data", onData);
      child.stdout.resume();
      resolve(out.slice(0, nl));
    };
    child.stdout.on("data", onData);
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`fucina serve exited (${code ?? signal}) before listening: ` +
                       server.stderr));
    });
  });
}

// SIGTERM (the server drains), SIGKILL after 10 s; resolves once the process has exited.
export async function terminate(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10000);
  await exited;
  clearTimeout(timer);
}
