// llama.cpp's tokenizer as an oracle for tests: loads MODEL with vocabOnly
// and, for each input line (a JSON string), prints one line with the JSON
// array of token ids (special tokens parsed).
//   node scripts/peer-tokenize.mjs MODEL < lines.jsonl
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const { getLlama, LlamaLogLevel } = await import(
	path.join(here, "peer/node_modules/node-llama-cpp/dist/index.js"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: process.argv[2], vocabOnly: true });
const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
	if (!line) continue;
	const ids = model.tokenize(JSON.parse(line), true);
	process.stdout.write(JSON.stringify(Array.from(ids)) + "\n");
}
await model.dispose();
await llama.dispose();
