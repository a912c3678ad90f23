// The addon's seam without a model: environment, adapter paths, messages, empty batch, and a
// failed start that is reported and retried. Runs under `node --test` and `bun test`.
"use strict";
const { test } = require("node:test");
const assert = require("node:assert/strict");
const seam = require("../seam.js");
const addon = require("../index.js");

test("abi version matches the header", () => {
  const header = require("node:fs").readFileSync(require("node:path").join(__dirname, "../../../include/memexec.h"), "utf8");
  assert.equal(addon.abiVersion(), Number(/#define MEMEXEC_ABI_VERSION (\d+)/.exec(header)[1]));
});

test("constants and environment", () => {
  assert.equal(seam.MAX_OUTPUT_TOKENS, 64000);
  const saved = process.env.MLX_BUN_MEMORY_BATCH;
  process.env.MLX_BUN_MEMORY_BATCH = "5";
  assert.equal(seam.memoryBatchSize(), 5);
  process.env.MLX_BUN_MEMORY_BATCH = "-2";
  assert.equal(seam.memoryBatchSize(), 8);
  process.env.MLX_BUN_MEMORY_BATCH = "1";
  assert.equal(seam.memoryBatchSize(), 1);
  process.env.MLX_BUN_MEMORY_BATCH = " +3 ";
  assert.equal(seam.memoryBatchSize(), 3);
  // parseInt would read 4 here; `memexec run` reads 8, and so must the seam.
  const warnings = [];
  const warn = console.warn;
  console.warn = (m) => warnings.push(String(m));
  try {
    process.env.MLX_BUN_MEMORY_BATCH = "4x";
    assert.equal(seam.memoryBatchSize(), 8);
    assert.equal(seam.memoryBatchSize(), 8);
  } finally {
    console.warn = warn;
  }
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /"4x" is not a positive integer/);
  if (saved === undefined) delete process.env.MLX_BUN_MEMORY_BATCH;
  else process.env.MLX_BUN_MEMORY_BATCH = saved;
  assert.equal(seam.adapterDirFor("chunk"), `${process.env.HOME}/.cache/mlx-bun/adapters/memory-chunk`);
});

test("memoryMessages follows the stage defaults", () => {
  seam.configure({});
  assert.deepEqual(seam.memoryMessages("route", { user: "u" }), [
    { role: "system", content: "You answer only 'yes' or 'no'." },
    { role: "user", content: "u" },
  ]);
  assert.deepEqual(seam.memoryMessages("chunk", { user: "u" }), [{ role: "user", content: "u" }]);
  assert.deepEqual(seam.memoryMessages("route", { system: "", user: "u" }), [{ role: "user", content: "u" }]);
  seam.configure({ stages: { chunk: { system: "trained" } } });
  assert.deepEqual(seam.memoryMessages("chunk", { user: "u" })[0], { role: "system", content: "trained" });
  seam.configure({});
});

test("empty batch is [] without loading; a failed start is reported and retried", async () => {
  seam.configure({ modelDir: "/nonexistent/model" });
  assert.deepEqual(await seam.callLocalBatch("chunk", []), []);
  for (let attempt = 0; attempt < 2; attempt++) {
    await assert.rejects(seam.callLocal("route", { user: "x" }), (e) => {
      assert.equal(e.code, "MEMEXEC_STATUS_LOAD_FAILED");
      assert.match(e.message, /\/nonexistent\/model/);
      return true;
    });
  }
  seam.configure({ modelDir: "/m", limits: { max_batchh: 1 } });
  await assert.rejects(seam.callLocal("route", { user: "x" }), (e) => e.code === "MEMEXEC_STATUS_INVALID_JSON");
  seam.configure({});
});
