// The drop-in seam over the Node-API addon: the same exports as ts/model.ts (and the old
// src/memory/model.ts), for Node and for Bun loading the addon. Work runs on the libuv pool;
// the returned Promises never block the event loop.
"use strict";
const { existsSync, readdirSync, readFileSync } = require("node:fs");
const { homedir } = require("node:os");
const { join } = require("node:path");
const addon = require("./index.js");

const MAX_OUTPUT_TOKENS = 64000;
const DEFAULT_MODEL_REPO = "mlx-community/gemma-4-e4b-it-OptiQ-4bit";
const ADAPTER_STAGES = ["chunk"];

/** Errors carry the C API status name (`MEMEXEC_STATUS_*`) as `code`. */
function withCode(e) {
  const m = /^(MEMEXEC_STATUS_[A-Z0-9_]+):/.exec(e && e.message);
  if (m) e.code = m[1];
  return e;
}

// Batched is the default: exact (checked at start-up) and faster; MLX_BUN_MEMORY_BATCH=1 = serial.
const DEFAULT_BATCH_WIDTH = 8;

// The last MLX_BUN_MEMORY_BATCH value warned about, so a bad value warns once, not per call.
let warnedBatchValue;

// Parsed as memexec's Rust side parses it (digits, optional "+", surrounding space): parseInt
// would read "4x" as 4 where `memexec run` reads 8. Any other set value warns once.
function memoryBatchSize() {
  const value = process.env.MLX_BUN_MEMORY_BATCH;
  if (value === undefined) return DEFAULT_BATCH_WIDTH;
  const digits = /^\+?(\d+)$/.exec(value.trim());
  const n = digits ? Number(digits[1]) : NaN;
  if (Number.isSafeInteger(n) && n >= 1) return n;
  if (warnedBatchValue !== value) {
    warnedBatchValue = value;
    console.warn(`memexec: $MLX_BUN_MEMORY_BATCH=${JSON.stringify(value)} is not a positive integer: batch width ${DEFAULT_BATCH_WIDTH}`);
  }
  return DEFAULT_BATCH_WIDTH;
}

function adapterDirFor(stage) {
  return join(process.env.HOME ?? homedir(), ".cache", "mlx-bun", "adapters", `memory-${stage}`);
}

function defaultModelDir() {
  const hub =
    process.env.HF_HUB_CACHE ?? join(process.env.HF_HOME ?? join(homedir(), ".cache", "huggingface"), "hub");
  const repo = join(hub, `models--${DEFAULT_MODEL_REPO.replace("/", "--")}`);
  const ref = join(repo, "refs", "main");
  if (existsSync(ref)) return join(repo, "snapshots", readFileSync(ref, "utf8").trim());
  const snapshots = join(repo, "snapshots");
  const found = existsSync(snapshots) ? readdirSync(snapshots) : [];
  return join(snapshots, found[0] ?? "<missing>");
}

let options = {};
let engine; // Promise<Engine> | undefined

function configure(next) {
  options = { ...next };
  shutdown();
}

function engineConfig() {
  const { modelDir, ...rest } = options;
  const config = { ...rest, model_dir: modelDir ?? rest.model_dir ?? defaultModelDir() };
  config.batch_width ??= memoryBatchSize();
  if (config.adapters === undefined) {
    const adapters = {};
    const stages = { ...config.stages };
    for (const stage of ADAPTER_STAGES) {
      const dir = adapterDirFor(stage);
      if (existsSync(dir)) {
        adapters[`memory-${stage}`] = dir;
        stages[stage] = { ...stages[stage], adapter: `memory-${stage}` };
      }
    }
    config.adapters = adapters;
    config.stages = stages;
  }
  return config;
}

/** The running engine; a failed start is forgotten so the next call retries. */
function ensureEngine() {
  if (!engine) {
    let opened;
    try {
      opened = addon.open(JSON.stringify(engineConfig()));
    } catch (e) {
      return Promise.reject(withCode(e));
    }
    engine = opened.catch((e) => {
      engine = undefined;
      throw withCode(e);
    });
  }
  return engine;
}

async function callLocal(stage, input, opts) {
  const e = await ensureEngine();
  return e.call(stage, input, opts).catch((err) => Promise.reject(withCode(err)));
}

async function callLocalBatch(stage, inputs, opts) {
  if (inputs.length === 0) return [];
  const e = await ensureEngine();
  return e.batch(stage, inputs, opts).catch((err) => Promise.reject(withCode(err)));
}

function memoryMessages(stage, input) {
  return addon.messages(options.stages === undefined ? null : JSON.stringify(options.stages), stage, input);
}

async function memoryPromptIds(stage, input) {
  return (await ensureEngine()).prompt(stage, input).ids;
}

function shutdown() {
  const e = engine;
  engine = undefined;
  if (e) e.then((x) => x.close(), () => {});
}

module.exports = {
  MAX_OUTPUT_TOKENS,
  DEFAULT_MODEL_REPO,
  adapterDirFor,
  callLocal,
  callLocalBatch,
  configure,
  defaultModelDir,
  engineConfig,
  memoryBatchSize,
  memoryMessages,
  memoryPromptIds,
  shutdown,
};
