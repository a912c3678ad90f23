// Types of seam.js: the drop-in seam over the Node-API addon (same exports as ts/model.ts).
import type { CallOptions, LocalInput, Message } from "./index";

export type { CallOptions, LocalInput, Message } from "./index";

/** The engine's configuration document (see `memexec_new` in include/memexec.h). */
export interface Config {
  model_dir: string;
  adapters?: Record<string, string>;
  stages?: Record<string, { adapter?: string; system?: string }>;
  batch_width?: number;
  device?: "default" | "cpu" | "gpu";
  /** Speculative decoding with exact verification (needs batch_width 1). */
  speculate?: { max_drafts: number; ngram?: number };
  limits?: { max_batch?: number; max_tokens_cap?: number; default_max_tokens?: number; max_prompt_tokens?: number | null };
}

/** What `configure` accepts: the config, with `modelDir` as an alias of `model_dir`. */
export interface SeamOptions extends Partial<Config> {
  modelDir?: string;
}

/** The largest `maxTokens` a caller may pass: the "never truncate" backstop. */
export declare const MAX_OUTPUT_TOKENS: 64000;
export declare const DEFAULT_MODEL_REPO: string;
/** `$HOME/.cache/mlx-bun/adapters/memory-<stage>`. */
export declare function adapterDirFor(stage: string): string;
/** The greedy completion of one input; rejects with an Error whose `code` is a `MEMEXEC_STATUS_*`. */
export declare function callLocal(stage: string, input: LocalInput, opts?: CallOptions): Promise<string>;
/** The greedy completions of `inputs`, in order; `[]` for `[]` without loading anything. */
export declare function callLocalBatch(stage: string, inputs: LocalInput[], opts?: CallOptions): Promise<string[]>;
/** Sets model dir, adapters, stages or limits for the next start (closing a running engine). */
export declare function configure(options: SeamOptions): void;
export declare function defaultModelDir(): string;
export declare function engineConfig(): Config;
/** `$MLX_BUN_MEMORY_BATCH` when a positive integer (`1` = serial), else 8 (batched). */
export declare function memoryBatchSize(): number;
/** The messages of a stage call with the configured stage defaults; needs no model. */
export declare function memoryMessages(stage: string, input: LocalInput): Message[];
/** The prompt ids the model is fed for a stage call. */
export declare function memoryPromptIds(stage: string, input: LocalInput): Promise<number[]>;
/** Stops the engine; the next call starts it again. */
export declare function shutdown(): void;
