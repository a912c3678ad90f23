// The drop-in seam: the same exports as the pipeline's old `src/memory/model.ts`, served by
// memexec's single model. Stages keep calling `callLocal` / `callLocalBatch`; the returned
// Promises settle from a timer-driven poll, so the event loop keeps running meanwhile.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { Memexec, stageMessages, type CallOptions, type Config, type LocalInput, type Message } from "./memexec";

export type { LocalInput, CallOptions, Config, Message, Prompt } from "./memexec";
export { MemexecError, Status } from "./ffi";

/** The largest `maxTokens` a caller may pass: the "never truncate" backstop. */
export const MAX_OUTPUT_TOKENS = 64000;

/** The Hugging Face repository of the default model. */
export const DEFAULT_MODEL_REPO = "mlx-community/gemma-4-e4b-it-OptiQ-4bit";

/** Stages that have a trained adapter, by stage name. */
const ADAPTER_STAGES = ["chunk"];

/** The batch width when `$MLX_BUN_MEMORY_BATCH` does not set one: batched (exact and faster). */
export const DEFAULT_BATCH_WIDTH = 8;

/** The last `$MLX_BUN_MEMORY_BATCH` value warned about, so a bad value warns once, not per call. */
let warnedBatchValue: string | undefined;

/**
 * The batch width: `$MLX_BUN_MEMORY_BATCH` when a positive integer (`1` = serial), else 8.
 * Parsed as memexec's Rust side parses it (digits, optional `+`, surrounding space): `parseInt`
 * would read "4x" as 4 where `memexec run` reads 8. Any other set value warns once.
 */
export function memoryBatchSize(): number {
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

/** Where the fine-tuned adapter of `stage` lives: `$HOME/.cache/mlx-bun/adapters/memory-<stage>`. */
export function adapterDirFor(stage: string): string {
  return join(process.env.HOME ?? homedir(), ".cache", "mlx-bun", "adapters", `memory-${stage}`);
}

/** The default model directory: the Hugging Face cache snapshot of DEFAULT_MODEL_REPO. */
export function defaultModelDir(): string {
  const hub = process.env.HF_HUB_CACHE ?? join(process.env.HF_HOME ?? join(homedir(), ".cache", "huggingface"), "hub");
  const repo = join(hub, `models--${DEFAULT_MODEL_REPO.replace("/", "--")}`);
  const ref = join(repo, "refs", "main");
  if (existsSync(ref)) return join(repo, "snapshots", readFileSync(ref, "utf8").trim());
  const snapshots = join(repo, "snapshots");
  const found = existsSync(snapshots) ? readdirSync(snapshots) : [];
  if (found.length > 0) return join(snapshots, found[0]!);
  return join(snapshots, "<missing>");
}

/** What `configure` accepts: the model directory, adapters and anything else of the config. */
export interface SeamOptions extends Partial<Config> {
  /** Alias of `model_dir`. */
  modelDir?: string;
}

let options: SeamOptions = {};
let engine: Memexec | undefined;

/**
 * Sets the model directory, adapters, stage settings or limits used when the engine starts
 * (closing a running engine so the next call starts with the new settings).
 */
export function configure(next: SeamOptions): void {
  options = { ...next };
  engine?.close();
  engine = undefined;
}

/** The configuration document the engine starts with. */
export function engineConfig(): Config {
  const { modelDir, ...rest } = options;
  const config: Config = { ...rest, model_dir: modelDir ?? rest.model_dir ?? defaultModelDir() };
  config.batch_width ??= memoryBatchSize();
  if (config.adapters === undefined) {
    // Mount the adapters that exist; a stage without one runs on the base model.
    const adapters: Record<string, string> = {};
    const stages: Record<string, { adapter?: string; system?: string }> = { ...config.stages };
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

/** The running engine, started on first use. A failed start is not remembered: the next call retries. */
function ensureEngine(): Memexec {
  engine ??= Memexec.open(engineConfig());
  return engine;
}

/** The greedy completion of one input for `stage`. */
export async function callLocal(stage: string, input: LocalInput, opts?: CallOptions): Promise<string> {
  return ensureEngine().call(stage, input, opts);
}

/** The greedy completions of `inputs` for `stage`, in order; `[]` for `[]` (nothing is loaded). */
export async function callLocalBatch(stage: string, inputs: LocalInput[], opts?: CallOptions): Promise<string[]> {
  if (inputs.length === 0) return [];
  return ensureEngine().batch(stage, inputs, opts);
}

/** The messages of a stage call (SPEC 1), with the configured stage defaults; needs no model. */
export function memoryMessages(stage: string, input: LocalInput): Message[] {
  return stageMessages(stage, input, options.stages);
}

/** The prompt ids the model is fed for a stage call (rendered with the model's own template). */
export async function memoryPromptIds(stage: string, input: LocalInput): Promise<number[]> {
  return ensureEngine().prompt(stage, input).ids;
}

/** Stops the engine (e.g. at exit); the next call starts it again. */
export function shutdown(): void {
  engine?.close();
  engine = undefined;
}
