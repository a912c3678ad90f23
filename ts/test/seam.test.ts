// The seam's pure parts (no model): environment handling, adapter paths, messages.
import { afterEach, describe, expect, spyOn, test } from "bun:test";
import {
  adapterDirFor,
  callLocalBatch,
  configure,
  engineConfig,
  MAX_OUTPUT_TOKENS,
  memoryBatchSize,
  memoryMessages,
} from "../model";

const savedBatch = process.env.MLX_BUN_MEMORY_BATCH;
afterEach(() => {
  if (savedBatch === undefined) delete process.env.MLX_BUN_MEMORY_BATCH;
  else process.env.MLX_BUN_MEMORY_BATCH = savedBatch;
  configure({});
});

describe("seam without a model", () => {
  test("MAX_OUTPUT_TOKENS is the 64000 backstop", () => {
    expect(MAX_OUTPUT_TOKENS).toBe(64000);
  });

  test("memoryBatchSize reads MLX_BUN_MEMORY_BATCH, default 8 (batched)", () => {
    delete process.env.MLX_BUN_MEMORY_BATCH;
    expect(memoryBatchSize()).toBe(8);
    process.env.MLX_BUN_MEMORY_BATCH = "1";
    expect(memoryBatchSize()).toBe(1);
    process.env.MLX_BUN_MEMORY_BATCH = "4";
    expect(memoryBatchSize()).toBe(4);
    process.env.MLX_BUN_MEMORY_BATCH = "zero";
    expect(memoryBatchSize()).toBe(8);
    process.env.MLX_BUN_MEMORY_BATCH = "0";
    expect(memoryBatchSize()).toBe(8);
  });

  test("memoryBatchSize parses as memexec's Rust side does and warns once per bad value", () => {
    const warn = spyOn(console, "warn").mockImplementation(() => {});
    try {
      process.env.MLX_BUN_MEMORY_BATCH = " +3 ";
      expect(memoryBatchSize()).toBe(3);
      expect(warn).toHaveBeenCalledTimes(0);
      // parseInt would read 4 here; `memexec run` reads 8.
      process.env.MLX_BUN_MEMORY_BATCH = "4x";
      expect(memoryBatchSize()).toBe(8);
      expect(memoryBatchSize()).toBe(8);
      expect(warn).toHaveBeenCalledTimes(1);
      expect(String(warn.mock.calls[0][0])).toContain('"4x" is not a positive integer');
      process.env.MLX_BUN_MEMORY_BATCH = "2.5";
      expect(memoryBatchSize()).toBe(8);
      expect(warn).toHaveBeenCalledTimes(2);
    } finally {
      warn.mockRestore();
    }
  });

  test("adapterDirFor follows $HOME/.cache/mlx-bun/adapters/memory-<stage>", () => {
    expect(adapterDirFor("chunk")).toBe(`${process.env.HOME}/.cache/mlx-bun/adapters/memory-chunk`);
  });

  test("memoryMessages: default system, explicit override, empty system, unknown stage", () => {
    expect(memoryMessages("route", { user: "u" })).toEqual([
      { role: "system", content: "You answer only 'yes' or 'no'." },
      { role: "user", content: "u" },
    ]);
    expect(memoryMessages("route", { system: "S", user: "u" })[0]).toEqual({ role: "system", content: "S" });
    expect(memoryMessages("route", { system: "", user: "u" })).toEqual([{ role: "user", content: "u" }]);
    expect(memoryMessages("chunk", { user: "u" })).toEqual([{ role: "user", content: "u" }]);
    expect(memoryMessages("no-such-stage", { user: "u" })).toEqual([{ role: "user", content: "u" }]);
    configure({ stages: { chunk: { system: "trained prompt" } } });
    expect(memoryMessages("chunk", { user: "u" })[0]).toEqual({ role: "system", content: "trained prompt" });
  });

  test("an empty batch is [] without loading anything", async () => {
    configure({ modelDir: "/nonexistent/model" });
    expect(await callLocalBatch("chunk", [])).toEqual([]);
  });

  test("configure sets the model dir; batch width defaults from the environment", () => {
    process.env.MLX_BUN_MEMORY_BATCH = "3";
    configure({ modelDir: "/m" });
    const c = engineConfig();
    expect(c.model_dir).toBe("/m");
    expect(c.batch_width).toBe(3);
  });

  test("a failed start is reported and retried on the next call", async () => {
    configure({ modelDir: "/nonexistent/model" });
    const { callLocal } = await import("../model");
    await expect(callLocal("route", { user: "x" })).rejects.toThrow("MEMEXEC_STATUS_LOAD_FAILED");
    await expect(callLocal("route", { user: "x" })).rejects.toThrow("/nonexistent/model");
  });
});
