// Reference tokenizations from llama.cpp itself (node-llama-cpp's native addon, which reads the
// vocabulary from the GGUF with its own loader), for parity tests of our tokenizer.
//
// Usage: node llama_tokenize.mjs MODEL.gguf IN.json OUT.json
//   IN.json:  {"strings": [...], "vocab_size": N}
//   OUT.json: {"bos": id|null, "eos": id|null, "add_bos": bool, "add_eos": bool,
//              "eog": [ids], "attrs": [[id, attr] for ids with attributes other than NORMAL],
//              "results": [{"plain": [ids], "special": [ids], "detok": "..."}]}
// "plain" tokenizes with parse_special = false, "special" with true; both without BOS/EOS (the
// addon never adds them: add_special is applied by the caller from add_bos / add_eos). "detok"
// is llama_detokenize(special ids, remove_special = false, unparse_special = true).
// The package is found through FUCINA_NPM_DIR (the npm prefix or its node_modules folder): ESM
// resolution ignores NODE_PATH, so the entry point is resolved explicitly.
import fs from "node:fs";
import path from "node:path";
import {createRequire} from "node:module";
import {pathToFileURL} from "node:url";

const [modelPath, inPath, outPath] = process.argv.slice(2);
if (!modelPath || !inPath || !outPath) {
  console.error("usage: node llama_tokenize.mjs MODEL.gguf IN.json OUT.json");
  process.exit(2);
}
let npmDir = process.env.FUCINA_NPM_DIR;
if (!npmDir) {
  console.error("FUCINA_NPM_DIR is not set");
  process.exit(2);
}
if (path.basename(npmDir) === "node_modules") npmDir = path.dirname(npmDir);
const require = createRequire(path.join(npmDir, "package.json"));
const {getLlama} = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);

const input = JSON.parse(fs.readFileSync(inPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, vocabOnly: true});
const native = model._model;  // The addon object: no JS-level workarounds in between.

const optionalId = (t) => (t == null || t < 0 ? null : Number(t));
const out = {
  bos: optionalId(native.tokenBos()),
  eos: optionalId(native.tokenEos()),
  add_bos: Boolean(native.shouldPrependBosToken()),
  add_eos: Boolean(native.shouldAppendEosToken()),
  eog: [],
  attrs: [],
  results: [],
};
for (let id = 0; id < input.vocab_size; ++id) {
  if (native.isEogToken(id)) out.eog.push(id);
  const attr = native.getTokenAttributes(id);
  if (attr !== 2) out.attrs.push([id, attr]);  // 2 = LLAMA_TOKEN_ATTR_NORMAL.
}
for (const text of input.strings) {
  const plain = Array.from(native.tokenize(text, false));
  const special = Array.from(native.tokenize(text, true));
  const detok = native.detokenize(Uint32Array.from(special), true);
  out.results.push({plain, special, detok});
}
fs.writeFileSync(outPath, JSON.stringify(out));
await model.dispose();
await llama.dispose();
