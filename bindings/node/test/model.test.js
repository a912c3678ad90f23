// The addon's seam on the tiny fixture: answers equal the Rust API's serial greedy texts (oracle
// written by scripts/host-oracle.sh), batch order, empty batch, and the event loop keeps running
// during a 200-token call, a speculative engine, a batched engine's step count. Runs under
// `node --test` and `bun test`.
"use strict";
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { existsSync, readFileSync } = require("node:fs");
const { join } = require("node:path");
const seam = require("../seam.js");

const oraclePath =
  process.env.MEMEXEC_HOST_ORACLE ?? join(__dirname, "..", "..", "..", "target", "host-oracle", "oracle.json");
if (!existsSync(oraclePath)) {
  throw new Error(`${oraclePath} is missing: run scripts/host-oracle.sh (after scripts/setup.sh)`);
}
const oracle = JSON.parse(readFileSync(oraclePath, "utf8"));

before(() => seam.configure({ modelDir: oracle.model_dir }));
after(() => seam.shutdown());

test("callLocal equals the serial greedy text of the Rust API", async () => {
  for (const c of oracle.cases) {
    assert.equal(await seam.callLocal(c.stage, c.input, { maxTokens: c.max_tokens }), c.text);
  }
});

test("callLocalBatch of 5 mixed-length inputs equals 5 serial calls, in order", async () => {
  const b = oracle.batch;
  assert.equal(b.inputs.length, 5);
  assert.deepEqual(await seam.callLocalBatch(b.stage, b.inputs, { maxTokens: b.max_tokens }), b.texts);
  assert.deepEqual(await seam.callLocalBatch("chunk", []), []);
});

test("concurrent calls each equal their serial answer", async () => {
  const got = await Promise.all(
    oracle.cases.map((c) => seam.callLocal(c.stage, c.input, { maxTokens: c.max_tokens })),
  );
  assert.deepEqual(got, oracle.cases.map((c) => c.text));
});

test("the event loop keeps running during a 200-token call", async () => {
  const l = oracle.long;
  assert.equal(l.tokens, 200);
  let ticks = 0;
  const timer = setInterval(() => ticks++, 5);
  const text = await seam.callLocal(l.stage, l.input, { maxTokens: l.max_tokens });
  clearInterval(timer);
  assert.equal(text, l.text);
  assert.ok(ticks > 3, `only ${ticks} timer ticks during the call`);
});

test("bad input rejects with a status code; the engine stays usable", async () => {
  await assert.rejects(seam.callLocal("x", { user: "a" }, { maxTokens: 0 }), (e) => e.code === "MEMEXEC_STATUS_INVALID_ARGUMENT");
  const c = oracle.cases[0];
  assert.equal(await seam.callLocal(c.stage, c.input, { maxTokens: c.max_tokens }), c.text);
});

test("a speculative engine answers as serial greedy and reports its draft counts", async () => {
  const { open } = require("../index.js");
  const config = { model_dir: oracle.model_dir, batch_width: 1, speculate: { max_drafts: 3 } };
  const engine = await open(JSON.stringify(config));
  try {
    const l = oracle.long;
    assert.equal(await engine.call(l.stage, l.input, { maxTokens: l.max_tokens }), l.text);
    // A call's counts are recorded before its answer is sent: no waiting here.
    const s = engine.stats();
    assert.match(s.mode, /speculative k3/);
    assert.equal(s.batchedSteps, undefined, "a serial engine reports batched steps");
    assert.ok(s.speculation, "stats carry no speculation counts");
    assert.ok(s.speculation.steps > 0 && s.speculation.steps <= l.tokens, JSON.stringify(s.speculation));
    assert.ok(s.speculation.accepted <= s.speculation.drafted, JSON.stringify(s.speculation));
    // A paused step has no drafts (NaN, and so a failure, if the field is missing).
    assert.ok(
      s.speculation.pausedSteps + s.speculation.stepsWithDrafts <= s.speculation.steps,
      JSON.stringify(s.speculation),
    );
  } finally {
    engine.close();
  }
});

test("a batched engine counts its decode steps, which the rows of a batch share", async () => {
  const { open } = require("../index.js");
  const engine = await open(JSON.stringify({ model_dir: oracle.model_dir, batch_width: 4 }));
  try {
    assert.equal(engine.stats().batchedSteps, 0);
    const b = oracle.batch;
    assert.deepEqual(await engine.batch(b.stage, b.inputs, { maxTokens: b.max_tokens }), b.texts);
    // Counted before the answers are sent: no waiting here.
    const s = engine.stats();
    assert.ok(s.batchedSteps > 0 && s.batchedSteps < s.tokensOut, JSON.stringify(s));
  } finally {
    engine.close();
  }
});
