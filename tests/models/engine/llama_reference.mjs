// Reference next-token distributions and greedy continuations from llama.cpp itself
// (node-llama-cpp's native addon), for the engine parity tests.
//
// Usage: node llama_reference.mjs MODEL.gguf REQUEST.json   (prints the response JSON)
//   REQUEST.json: {"lora": "ADAPTER.gguf" (optional), "requests": [
//       {"tokens": [ids], "logprobs_at": [i, ...]},          // log p(next | tokens[0..i])
//       {"tokens": [ids], "greedy": N, "stop": [ids]}]}       // N argmax steps after tokens
//   Response: {"vocab": V, "results": [
//       {"logprobs": [{"at": i, "top1": id, "margin": m, "data": BASE64}]} |
//       {"greedy": {"tokens": [ids], "margins": [m, ...]}}]}
//   "data" is the full log-probability vector: V little-endian float32 values, base64 (a JSON
//   number list would be ~1.5 MB per position). log(0) (an underflowed probability) is -inf.
//   "margin" is the top-2 margin log p1 - log p2 (= the logit gap) of that step's distribution.
//
// The addon only exposes probabilities (softmax of the raw logits when the sampler is greedy:
// temperature 0, no penalties), so log-probabilities are log(prob). The context is set up for
// tight comparisons: f32 K/V cache, flash attention off, 2 threads (the default 4 oversubscribe
// a 2-core machine badly), one batch for the whole prompt. No BOS is added: the token ids are
// used exactly as given. The package is found through FUCINA_NPM_DIR (tests/reference/llama_cpp.mjs).
import fs from "node:fs";
import {loadLlama} from "../../reference/llama_cpp.mjs";

const [modelPath, requestPath] = process.argv.slice(2);
if (!modelPath || !requestPath) {
  console.error("usage: node llama_reference.mjs MODEL.gguf REQUEST.json");
  process.exit(2);
}

// "lora" (optional): a LoRA adapter GGUF applied at scale 1 on top of the model.
const {requests, lora} = JSON.parse(fs.readFileSync(requestPath, "utf8"));
let longest = 1;
for (const r of requests) longest = Math.max(longest, r.tokens.length + (r.greedy ?? 0));
const contextSize = Math.ceil((longest + 1) / 256) * 256;

const llama = await loadLlama({maxThreads: 2});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const context = await model.createContext({
  ...(lora ? {lora: {adapters: [{filePath: lora, scale: 1}]}} : {}),
  contextSize,
  batchSize: contextSize,
  sequences: 1,
  threads: {ideal: 2, min: 2},
  flashAttention: false,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();
// Full distributions: greedy sampler (temperature 0), so the probabilities are the plain
// softmax of the logits over the whole vocabulary.
const wantAll = {generateNext: {token: true, probabilities: true, options: {temperature: 0}}};
// Greedy steps need only the two best tokens: top-k 2 at temperature 1 (logits unchanged)
// returns them sorted, renormalised over the pair, which keeps log p1 - log p2 exact and avoids
// moving the whole vocabulary into JS every step. The argmax is the first entry (the sampled
// `token` is a draw, not the argmax, so it is not used).
const wantTop2 = {generateNext: {probabilities: true, options: {temperature: 1, topK: 2, seed: 1}}};

// The distribution returned for one position: the argmax, the top-2 margin and, on request,
// every token's log-probability indexed by id.
function Summarize(next, withVector) {
  const it = next.probabilities.entries();  // Sorted by probability, highest first.
  const [, p1] = it.next().value;
  const second = it.next().value;
  const margin = second ? Math.log(p1) - Math.log(second[1]) : Infinity;
  const out = {
    top1: next.probabilities.keys().next().value,
    margin: Number.isFinite(margin) ? margin : 1e30,  // JSON has no Infinity
  };
  if (withVector) {
    const vec = new Float32Array(next.probabilities.size);
    for (const [id, p] of next.probabilities) vec[id] = Math.log(p);
    out.data = Buffer.from(vec.buffer).toString("base64");
  }
  return out;
}

let vocab = 0;
const results = [];
for (const r of requests) {
  await sequence.clearHistory();
  if (r.greedy) {
    const stop = new Set(r.stop ?? []);
    const prompt = r.tokens.slice(0, -1);
    prompt.push([r.tokens[r.tokens.length - 1], wantTop2]);
    let out = await sequence.controlledEvaluate(prompt);
    const tokens = [], margins = [];
    for (let step = 0; step < r.greedy; ++step) {
      const next = out[out.length - 1].next;
      const s = Summarize(next, false);
      tokens.push(s.top1);
      margins.push(s.margin);
      if (stop.has(s.top1) || step + 1 === r.greedy) break;
      out = await sequence.controlledEvaluate([[s.top1, wantTop2]]);
    }
    results.push({greedy: {tokens, margins}});
  } else {
    const at = new Set(r.logprobs_at);
    const input = r.tokens.map((t, i) => (at.has(i) ? [t, wantAll] : t));
    const out = await sequence.controlledEvaluate(input);
    const logprobs = [];
    for (const i of r.logprobs_at) {
      const next = out[i].next;
      vocab = next.probabilities.size;
      logprobs.push({at: i, ...Summarize(next, true)});
    }
    results.push({logprobs});
  }
}
process.stdout.write(JSON.stringify({vocab, results}));
await context.dispose();
await model.dispose();
await llama.dispose();
