// An engine handle for Bun: every generation is submitted and then polled on a timer, so the
// JavaScript event loop never waits on the model (no blocking FFI call during generation, and
// Rust never calls back into JS).
import type { Pointer } from "bun:ffi";
import { check, cstr, MemexecError, native, OutSlot, Status } from "./ffi";

/** One model input: `system` overrides the stage's default (`""` = no system message). */
export interface LocalInput {
  system?: string;
  user: string;
}

/** Per-call options. */
export interface CallOptions {
  /** The most tokens to generate (1..64000; default 256). */
  maxTokens?: number;
}

/** The engine's configuration document (see `memexec_new` in include/memexec.h). */
export interface Config {
  model_dir: string;
  adapters?: Record<string, string>;
  stages?: Record<string, { adapter?: string; system?: string }>;
  batch_width?: number;
  device?: "default" | "cpu" | "gpu";
  /** Speculative decoding with exact verification (a batched engine: for a call running alone). */
  speculate?: { max_drafts: number; ngram?: number };
  limits?: {
    max_batch?: number;
    max_tokens_cap?: number;
    default_max_tokens?: number;
    max_prompt_tokens?: number | null;
  };
}

/** Counters since start-up (`memexec_stats`). */
export interface Stats {
  mode: string;
  batch_width: number;
  load_seconds: number;
  completed: number;
  failed: number;
  cancelled: number;
  tokens_in: number;
  tokens_out: number;
  prefill_seconds: number;
  decode_seconds: number;
  peak_memory_bytes: number;
  /** In batched mode: decode steps so far (a step over several rows counts once). */
  batched_steps?: number;
  /** With `speculate` configured: draft counts of the finished calls. */
  speculation?: {
    steps: number;
    steps_with_drafts: number;
    drafted: number;
    accepted: number;
    paused_steps: number;
  };
}

/** A chat message. */
export interface Message {
  role: string;
  content: string;
}

/** What the model is fed for a stage call. */
export interface Prompt {
  messages: Message[];
  text: string;
  ids: number[];
}

const MAX_POLL_DELAY_MS = 8;

/**
 * The messages of a stage call (`system = input.system ?? the stage's default`, sent only when
 * non-empty), with `stages` (a config's `stages` map) laid over the built-in defaults. Needs no
 * model.
 */
export function stageMessages(stage: string, input: LocalInput, stages?: Config["stages"]): Message[] {
  const out = new OutSlot();
  const err = new OutSlot();
  const stagesJson = stages === undefined ? null : cstr(JSON.stringify(stages));
  check(native().memexec_messages(stagesJson, cstr(stage), cstr(JSON.stringify(input)), out.ptr, err.ptr), err);
  return JSON.parse(out.takeString() ?? "[]");
}

function optsJson(opts?: CallOptions): Uint8Array | null {
  return opts?.maxTokens === undefined ? null : cstr(JSON.stringify({ max_tokens: opts.maxTokens }));
}

/** One loaded model. Create with `Memexec.open`, release with `close`. */
export class Memexec {
  #handle: Pointer | null;

  private constructor(handle: Pointer) {
    this.#handle = handle;
  }

  /**
   * Loads the model described by `config`. This blocks while the weights load (once per
   * process); generation never blocks.
   */
  static open(config: Config): Memexec {
    const out = new OutSlot();
    const err = new OutSlot();
    check(native().memexec_new(cstr(JSON.stringify(config)), out.ptr, err.ptr), err);
    return new Memexec(Number(out.value) as Pointer);
  }

  get #h(): Pointer {
    if (this.#handle === null) throw new Error("memexec: this handle was closed");
    return this.#handle;
  }

  /** The greedy completion of one input. */
  async call(stage: string, input: LocalInput, opts?: CallOptions): Promise<string> {
    return this.#submit("memexec_submit", stage, JSON.stringify(input), opts);
  }

  /** The greedy completions of a batch, `out[i]` answering `inputs[i]`. */
  async batch(stage: string, inputs: LocalInput[], opts?: CallOptions): Promise<string[]> {
    if (inputs.length === 0) return [];
    return JSON.parse(await this.#submit("memexec_submit_batch", stage, JSON.stringify(inputs), opts));
  }

  /** What the model is fed for a stage call (no generation; does not wait on the engine). */
  prompt(stage: string, input: LocalInput): Prompt {
    const out = new OutSlot();
    const err = new OutSlot();
    check(native().memexec_prompt(this.#h, cstr(stage), cstr(JSON.stringify(input)), out.ptr, err.ptr), err);
    return JSON.parse(out.takeString() ?? "{}");
  }

  /** Counters since start-up. */
  stats(): Stats {
    const out = new OutSlot();
    const err = new OutSlot();
    check(native().memexec_stats(this.#h, out.ptr, err.ptr), err);
    return JSON.parse(out.takeString() ?? "{}");
  }

  /** Stops the engine; pending calls reject with MEMEXEC_STATUS_CLOSED. Idempotent. */
  close(): void {
    if (this.#handle === null) return;
    native().memexec_free(this.#handle);
    this.#handle = null;
  }

  #submit(
    fn: "memexec_submit" | "memexec_submit_batch",
    stage: string,
    json: string,
    opts?: CallOptions,
  ): Promise<string> {
    const h = this.#h;
    const id = new OutSlot();
    const err = new OutSlot();
    check(native()[fn](h, cstr(stage), cstr(json), optsJson(opts), id.ptr, err.ptr), err);
    const requestId = id.value;
    return new Promise((resolve, reject) => {
      let delay = 0;
      const tick = () => {
        if (this.#handle === null) {
          // Freed by close(): the library failed the request; its handle can no longer be polled.
          reject(new MemexecError(Status.CLOSED, "the engine was closed while the request was in flight"));
          return;
        }
        const out = new OutSlot();
        const perr = new OutSlot();
        try {
          const status = check(native().memexec_poll(h, requestId, out.ptr, perr.ptr), perr, [
            Status.OK,
            Status.PENDING,
          ]);
          if (status === Status.PENDING) {
            delay = Math.min(delay + 1, MAX_POLL_DELAY_MS);
            setTimeout(tick, delay);
          } else {
            resolve(out.takeString() ?? "");
          }
        } catch (e) {
          reject(e);
        }
      };
      setTimeout(tick, 0);
    });
  }
}
