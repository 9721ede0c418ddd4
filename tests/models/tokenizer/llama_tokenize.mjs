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
// llama.cpp is loaded through tests/reference/llama_cpp.mjs (FUCINA_NPM_DIR).
import fs from "node:fs";
import {loadLlama} from "../../reference/llama_cpp.mjs";

const [modelPath, inPath, outPath] = process.argv.slice(2);
if (!modelPath || !inPath || !outPath) {
  console.error("usage: node llama_tokenize.mjs MODEL.gguf IN.json OUT.json");
  process.exit(2);
}

const input = JSON.parse(fs.readFileSync(inPath, "utf8"));
const llama = await loadLlama();
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
  if (attr !== 4) out.attrs.push([id, attr]);  // 4 = LLAMA_TOKEN_ATTR_NORMAL (1 << 2).
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
