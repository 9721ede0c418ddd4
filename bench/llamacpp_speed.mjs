// Speed reference: llama.cpp (node-llama-cpp's prebuilt CPU build) on the same GGUF and thread
// count as `fucina run --bench`. Plain evaluate loop, no probabilities (asking for the full
// distribution every token costs ~30% and is not what a user measures).
//
// Usage: node llamacpp_speed.mjs MODEL.gguf THREADS PROMPT_TOKENS GEN REPEATS
// Prints "prefill: X t/s" and "decode: Y t/s" (medians), like `fucina run --bench`, each the
// better of flash attention off and on.
// The package is found through FUCINA_NPM_DIR (the npm prefix or its node_modules folder).
import {loadLlama} from "../tests/reference/llama_cpp.mjs";

const [modelPath, threadsArg, promptArg, genArg, repeatsArg] = process.argv.slice(2);
if (!modelPath) {
  console.error("usage: FUCINA_NPM_DIR=... node llamacpp_speed.mjs MODEL THREADS PROMPT GEN REPEATS");
  process.exit(2);
}

const threads = Number(threadsArg), promptLen = Number(promptArg), gen = Number(genArg);
const repeats = Number(repeatsArg);
const llama = await loadLlama();
const model = await llama.loadModel({modelPath});
const median = (v) => v.slice().sort((a, b) => a - b)[Math.floor(v.length / 2)];
// A fixed prompt of ordinary token ids (the same ids `fucina run --bench` gets).
const prompt = Array.from({length: promptLen}, (_, i) => 1000 + ((i * 7919) % 5000));

// Flash attention on and off: on wins prefill on some CPUs, off wins decode on others, so each
// figure is the better of the two (llama.cpp at its best), with the setting that gave it.
const best = {prefill: {rate: 0, flash: false}, decode: {rate: 0, flash: false}};
for (const flashAttention of [false, true]) {
  const prefill = [], decode = [];
  for (let r = 0; r < repeats; ++r) {
    const context = await model.createContext({
      contextSize: promptLen + gen + 8, batchSize: Math.max(promptLen, 1), threads,
      flashAttention,
    });
    const sequence = context.getSequence();
    const t0 = performance.now();
    // yieldEogToken: an end-of-generation token does not end the loop (by default it does, and
    // a model that emits one early would be timed for fewer tokens than `gen`); `fucina run
    // --bench` also decodes exactly `gen` tokens.
    let t1 = 0, n = 0;
    for await (const token of sequence.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
      if (n === 0) t1 = performance.now();
      if (++n > gen) break;
    }
    const t2 = performance.now();
    if (n <= gen) throw new Error(`generation stopped after ${n} of ${gen + 1} tokens`);
    prefill.push(promptLen / ((t1 - t0) / 1000));
    decode.push(gen / ((t2 - t1) / 1000));
    await context.dispose();
  }
  for (const [name, rates] of [["prefill", prefill], ["decode", decode]]) {
    if (median(rates) > best[name].rate) best[name] = {rate: median(rates), flash: flashAttention};
  }
}
for (const name of ["prefill", "decode"]) {
  console.log(`${name}: ${best[name].rate.toFixed(2)} t/s (flash attention ` +
              `${best[name].flash ? "on" : "off"})`);
}
