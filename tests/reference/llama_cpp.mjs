// The independent reference: llama.cpp through node-llama-cpp's prebuilt CPU addon (npm).
// Shared by the parity tests and the speed benchmark.
//
// The package is found through FUCINA_NPM_DIR (the npm prefix or its node_modules folder):
// ESM resolution ignores NODE_PATH, so the entry point is resolved explicitly.
import path from "node:path";
import {createRequire} from "node:module";
import {pathToFileURL} from "node:url";

// Returns llama.cpp's Llama object (CPU only, never builds from source; `options` add to or
// override getLlama's); exits with a message when FUCINA_NPM_DIR is unset.
export async function loadLlama(options = {}) {
  let npmDir = process.env.FUCINA_NPM_DIR;
  if (!npmDir) {
    console.error("FUCINA_NPM_DIR is not set (npm prefix with node-llama-cpp)");
    process.exit(2);
  }
  if (path.basename(npmDir) === "node_modules") npmDir = path.dirname(npmDir);
  const require = createRequire(path.join(npmDir, "package.json"));
  const {getLlama} = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);
  return getLlama({gpu: false, build: "never", logLevel: "error", ...options});
}
