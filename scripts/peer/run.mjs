#!/usr/bin/env node
// The llama.cpp peer: loads a GGUF with llama.cpp's prebuilt CPU library
// (node-llama-cpp 3.22.1, installed here by scripts/setup.sh) and prints ONE
// JSON object on stdout, so parity tests and benchmarks compare mcv with
// llama.cpp on the same file.
//
//   node run.mjs --model M.gguf (--tokens 1,2,3 | --prompt TEXT) [-n 64]
//                [--threads 2] [--ctx 512] [--batch 512] [--logits]
//                [--stop-eog] [--flash-attn] [--shim] [--verbose]
//     -> {"prompt_tokens":[..], "tokens":[..], "text":"..", "first_logits":[..],
//         "first_logprobs":[..], "load_ms", "prompt_ms", "decode_ms", ...}
//   node run.mjs --model M.gguf --tokenize TEXT     (TEXT "-" = stdin)
//     -> {"tokens":[..]}   special tokens parsed, no BOS added
//   node run.mjs --model M.gguf --detokenize 1,2,3
//     -> {"text":".."}
//
// --shim (for benchmarks) re-runs this script with shim.c preloaded
// (compiled on first use into the temp folder): no weight repacking and a
// persistent thread pool, as llama-cli --no-repack runs.  Note that with
// repacking on (the default, no --shim) llama.cpp computes Q4_0/Q4_K/IQ4
// weights in a different order, so its greedy tokens can differ slightly.
//
// Greedy is pure argmax: temperature 0, no repeat penalty, no token bias.
// Generation runs for exactly n tokens unless --stop-eog is given (then it
// stops after the first end-of-generation token, which is included).
// prompt_ms covers evaluating the prompt and picking the first token;
// decode_ms covers the remaining n-1 single-token steps.
// Errors: one line on stderr, exit 1 (2 for a bad command line).
import { readFileSync, existsSync, renameSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const usage = "usage: run.mjs --model M.gguf (--tokens 1,2,3 | --prompt TEXT | --tokenize TEXT | --detokenize IDS) [-n 64] [--threads 2] [--ctx 512] [--batch N] [--logits] [--stop-eog] [--flash-attn] [--shim] [--verbose]";

function fail(msg, code = 1) {
	process.stderr.write(`peer: ${String(msg).split("\n")[0]}\n`);
	process.exit(code);
}

function parseArgs(argv) {
	const o = { n: 64, threads: 2, ctx: 512, batch: 0, logits: false, stopEog: false,
		flashAttn: false, verbose: false };
	const intArg = (name, v) => {
		if (v === undefined || !/^[0-9]+$/.test(v)) fail(`${name} needs a non-negative integer\n`, 2);
		return Number(v);
	};
	const idsArg = (name, v) => {
		if (v === undefined || !/^\s*[0-9]+(\s*,\s*[0-9]+)*\s*$/.test(v)) fail(`${name} needs a list like 1,2,3`, 2);
		return v.split(",").map((x) => Number(x.trim()));
	};
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i];
		const next = () => argv[++i];
		switch (a) {
		case "--model": case "-m": o.model = next(); break;
		case "--tokens": o.tokens = idsArg(a, next()); break;
		case "--prompt": case "-p": o.prompt = next(); if (o.prompt === undefined) fail(`${a} needs TEXT`, 2); break;
		case "--tokenize": o.tokenize = next(); if (o.tokenize === undefined) fail(`${a} needs TEXT`, 2); break;
		case "--detokenize": o.detokenize = idsArg(a, next()); break;
		case "-n": case "--n-predict": o.n = intArg(a, next()); break;
		case "--threads": case "-t": o.threads = intArg(a, next()); break;
		case "--ctx": case "-c": o.ctx = intArg(a, next()); break;
		case "--batch": case "-b": o.batch = intArg(a, next()); break;
		case "--logits": o.logits = true; break;
		case "--stop-eog": o.stopEog = true; break;
		case "--flash-attn": o.flashAttn = true; break;
		case "--verbose": case "-v": o.verbose = true; break;
		case "--shim": o.shim = true; break;
		case "--help": case "-h": process.stdout.write(usage + "\n"); process.exit(0); break;
		default: fail(`unknown option '${a}'`, 2);
		}
	}
	if (!o.model) fail("no --model given", 2);
	const modes = [o.tokens, o.prompt, o.tokenize, o.detokenize].filter((x) => x !== undefined).length;
	if (modes !== 1) fail("give exactly one of --tokens, --prompt, --tokenize, --detokenize", 2);
	if (o.threads < 1) fail("--threads must be at least 1", 2);
	if (o.ctx < 1) fail("--ctx must be at least 1", 2);
	return o;
}

const o = parseArgs(process.argv.slice(2));
const { getLlama, LlamaLogLevel } = await import("node-llama-cpp").catch(() =>
	fail("node-llama-cpp is not installed (run scripts/setup.sh)"));
const shimActive = /mcv-peer-shim/.test(process.env.LD_PRELOAD ?? "");
if (o.shim && !shimActive) reexecWithShim();

// Compile shim.c once per content (atomic rename: parallel runs are safe),
// then run this script again with it preloaded and pass on its exit code.
function reexecWithShim() {
	const src = join(dirname(fileURLToPath(import.meta.url)), "shim.c");
	let text;
	try { text = readFileSync(src); } catch (e) { fail(`--shim: ${e.message}`); }
	const hash = createHash("sha256").update(text).digest("hex").slice(0, 16);
	const so = join(tmpdir(), `mcv-peer-shim-${hash}.so`);
	if (!existsSync(so)) {
		const tmp = `${so}.${process.pid}`;
		const cc = spawnSync(process.env.CC || "cc", ["-O2", "-shared", "-fPIC", "-o", tmp, src, "-ldl", "-lpthread"],
			{ stdio: ["ignore", "ignore", "pipe"] });
		if (cc.status !== 0) fail(`--shim: cannot compile ${src}: ${String(cc.stderr ?? cc.error).trim()}`);
		renameSync(tmp, so);
	}
	const env = { ...process.env, LD_PRELOAD: [so, process.env.LD_PRELOAD].filter(Boolean).join(":") };
	const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), ...process.argv.slice(2)],
		{ env, stdio: "inherit" });
	process.exit(r.status ?? 1);
}

// llama.cpp logs go to stderr only with --verbose; the last error line is
// kept so a failed load reports llama.cpp's reason, not just "failed".
let lastError = "";
const llama = await getLlama({
	gpu: false,
	build: "never",          // prebuilt CPU binaries only: never compile or download
	skipDownload: true,
	usePrebuiltBinaries: true,
	progressLogs: false,
	maxThreads: o.threads,
	logLevel: o.verbose ? LlamaLogLevel.debug : LlamaLogLevel.warn,
	logger(level, message) {
		const m = String(message).trim();
		if (level === LlamaLogLevel.error && m) lastError = m;
		if (o.verbose) process.stderr.write(`llama.cpp: ${m}\n`);
	},
}).catch((e) => fail(`cannot load llama.cpp: ${e.message}`));

const t0 = performance.now();
let model;
try {
	model = await llama.loadModel({
		modelPath: o.model,
		gpuLayers: 0,
		vocabOnly: o.tokenize !== undefined || o.detokenize !== undefined,
		defaultContextFlashAttention: o.flashAttn,
	});
} catch (e) {
	fail(`cannot load '${o.model}': ${lastError || e.message}`);
}
const loadMs = performance.now() - t0;

// Resolves once the bytes are handed to the OS: process.exit() right after
// a plain write can cut a large JSON object short when stdout is a pipe.
function out(obj) {
	return new Promise((resolve) => process.stdout.write(JSON.stringify(obj) + "\n", resolve));
}

try {
	if (o.tokenize !== undefined) {
		const text = o.tokenize === "-" ? readFileSync(0, "utf8") : o.tokenize;
		await out({ tokens: Array.from(model.tokenize(text, true)) });
	} else if (o.detokenize !== undefined) {
		await out({ text: model.detokenize(o.detokenize, true) });
	} else {
		await generate();
	}
} catch (e) {
	fail(lastError || e.message);
}
await model.dispose();
await llama.dispose();
process.exit(0);

async function generate() {
	const prompt = o.tokens ?? Array.from(model.tokenize(o.prompt, true));
	if (prompt.length === 0) fail("empty prompt");
	const ctx = await model.createContext({
		contextSize: o.ctx,
		batchSize: o.batch || Math.min(o.ctx, 512),
		threads: { ideal: o.threads, min: o.threads },
		flashAttention: o.flashAttn,
		sequences: 1,
	});
	if (prompt.length + o.n > ctx.contextSize)
		fail(`prompt (${prompt.length}) + n (${o.n}) exceeds the context (${ctx.contextSize})`);
	// no checkpoints: they copy the recurrent state (time) and abort on
	// models without attention layers
	const seq = ctx.getSequence({ checkpoints: { interval: false, max: 0 } });
	const greedy = { temperature: 0 };
	const tokens = [];
	let firstLogits = null;

	// Prompt: all tokens in one call, the next token picked on the last.
	const tp = performance.now();
	let next = null;
	if (o.n > 0) {
		const items = prompt.map((t, i) => i < prompt.length - 1 ? t :
			[t, { generateNext: { token: true, logits: o.logits, options: greedy } }]);
		const res = await seq.controlledEvaluate(items);
		const last = res[prompt.length - 1];
		next = last?.next?.token;
		if (o.logits) firstLogits = last?.next?.logits;
	} else {
		await seq.evaluateWithoutGeneratingNewTokens(prompt);
	}
	const promptMs = performance.now() - tp;

	const td = performance.now();
	while (next != null && tokens.length < o.n) {
		tokens.push(next);
		if (tokens.length === o.n) break;
		if (o.stopEog && model.isEogToken(next)) break;
		const res = await seq.controlledEvaluate([[next, { generateNext: { token: true, options: greedy } }]]);
		next = res[0]?.next?.token;
	}
	const decodeMs = performance.now() - td;
	if (o.n > 0 && tokens.length === 0) fail("llama.cpp returned no token");

	const result = {
		prompt_tokens: prompt,
		tokens,
		text: model.detokenize(tokens, true),
		load_ms: round(loadMs),
		prompt_ms: round(promptMs),
		decode_ms: round(decodeMs),
		decode_steps: Math.max(0, tokens.length - 1),
		threads: o.threads,
		shim: shimActive,
	};
	if (o.logits && firstLogits) {
		// The map is sorted by logit; rebuild the id-ordered vector.
		let n = 0;
		for (const id of firstLogits.keys()) n = Math.max(n, id + 1);
		const v = new Float64Array(n);
		for (const [id, x] of firstLogits) v[id] = x;
		let mx = -Infinity;
		for (const x of v) mx = Math.max(mx, x);
		let s = 0;
		for (const x of v) s += Math.exp(x - mx);
		const lse = mx + Math.log(s);
		result.first_logits = Array.from(v);
		result.first_logprobs = Array.from(v, (x) => x - lse);
	}
	await out(result);
	await ctx.dispose();
}

function round(x) {
	return Math.round(x * 1000) / 1000;
}
