// The seam on the tiny fixture: answers equal the Rust API's serial greedy texts (oracle written
// by scripts/host-oracle.sh), batches keep order, an empty batch is [], and the event loop keeps
// running during a 200-token call.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { callLocal, callLocalBatch, configure, memoryPromptIds, shutdown, Status } from "../model";
import { Memexec } from "../memexec";

const oraclePath =
  process.env.MEMEXEC_HOST_ORACLE ?? join(import.meta.dir, "..", "..", "target", "host-oracle", "oracle.json");
if (!existsSync(oraclePath)) {
  throw new Error(`${oraclePath} is missing: run scripts/host-oracle.sh (after scripts/setup.sh)`);
}
const oracle = JSON.parse(readFileSync(oraclePath, "utf8"));
// Generation on a shared CPU is slow; a hung call still fails.
setDefaultTimeout(120_000);

beforeAll(() => configure({ modelDir: oracle.model_dir }));
afterAll(() => shutdown());

describe("seam on the tiny fixture", () => {
  test("callLocal equals the serial greedy text of the Rust API", async () => {
    for (const c of oracle.cases) {
      expect(await callLocal(c.stage, c.input, { maxTokens: c.max_tokens })).toBe(c.text);
    }
  });

  test("callLocalBatch of 5 mixed-length inputs equals 5 serial calls, in order", async () => {
    const b = oracle.batch;
    expect(b.inputs.length).toBe(5);
    const got = await callLocalBatch(b.stage, b.inputs, { maxTokens: b.max_tokens });
    expect(got).toEqual(b.texts);
  });

  test("an empty batch returns []", async () => {
    expect(await callLocalBatch("chunk", [])).toEqual([]);
  });

  test("unknown stages run without a default system", async () => {
    const u = oracle.unknown_stage;
    expect(await callLocal(u.stage, u.input, { maxTokens: u.max_tokens })).toBe(u.text);
  });

  test("the event loop keeps running during a 200-token call", async () => {
    const l = oracle.long;
    expect(l.tokens).toBe(200);
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    const started = performance.now();
    const text = await callLocal(l.stage, l.input, { maxTokens: l.max_tokens });
    const elapsed = performance.now() - started;
    clearInterval(timer);
    expect(text).toBe(l.text);
    // A blocked loop would tick at most once or twice; a free one ticks about every 5 ms.
    expect(ticks).toBeGreaterThan(Math.min(20, elapsed / 5 / 4));
    expect(ticks).toBeGreaterThan(3);
  });

  test("memoryPromptIds gives ids starting with one BOS", async () => {
    const ids = await memoryPromptIds("route", { user: "hi" });
    expect(ids.length).toBeGreaterThan(3);
    expect(ids[0]).toBe(2);
    expect(ids[1]).not.toBe(2);
  });

  test("errors carry their status and the engine stays usable", async () => {
    const e = Memexec.open({ model_dir: oracle.model_dir });
    try {
      await expect(e.call("x", { user: "a" }, { maxTokens: 0 })).rejects.toMatchObject({
        status: Status.INVALID_ARGUMENT,
      });
      const c = oracle.cases[0];
      expect(await e.call(c.stage, c.input, { maxTokens: c.max_tokens })).toBe(c.text);
      const pending = e.call(oracle.long.stage, oracle.long.input, { maxTokens: 64000 });
      e.close();
      await expect(pending).rejects.toMatchObject({ status: Status.CLOSED });
    } finally {
      e.close();
    }
  });
});
