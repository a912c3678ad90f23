// The bun:ffi binding without a model: the symbol table against the committed header, and the
// C API's answers to bad input that never reaches an engine.
import { describe, expect, test } from "bun:test";
import { FFIType } from "bun:ffi";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { cstr, native, OutSlot, Status, statusName, symbols } from "../ffi";

const header = readFileSync(join(import.meta.dir, "..", "..", "include", "memexec.h"), "utf8");

function ffiType(c: string): number {
  const t = c.replace(/\s+/g, " ").trim();
  if (t.endsWith("*")) return FFIType.ptr;
  const table: Record<string, number> = {
    "enum memexec_status": FFIType.i32,
    int32_t: FFIType.i32,
    uint32_t: FFIType.u32,
    uint64_t: FFIType.u64,
    void: FFIType.void,
  };
  const f = table[t];
  if (f === undefined) throw new Error(`no FFI type for C type \`${t}\``);
  return f;
}

describe("symbol table", () => {
  test("matches every function declared in include/memexec.h", () => {
    const decls = new Map<string, { args: number[]; returns: number }>();
    const re = /^([a-z_][\w ]*?[\s*]+)(memexec_\w+)\(([^)]*)\);/gm;
    for (const m of header.matchAll(re)) {
      const params = m[3]!.trim() === "void" ? [] : m[3]!.split(",").map((p) => p.trim().replace(/\w+$/, ""));
      decls.set(m[2]!, { args: params.map(ffiType), returns: ffiType(m[1]!) });
    }
    expect(decls.size).toBeGreaterThan(10);
    const table = Object.fromEntries(
      Object.entries(symbols).map(([k, v]) => [k, { args: [...v.args], returns: v.returns }]),
    );
    expect(table).toEqual(Object.fromEntries(decls));
  });

  test("status codes match the header's enum", () => {
    for (const [name, value] of Object.entries(Status)) {
      expect(header).toContain(`MEMEXEC_STATUS_${name} = ${value},`);
      expect(statusName(value)).toBe(`MEMEXEC_STATUS_${name}`);
    }
    expect(statusName(999)).toBe("MEMEXEC_STATUS_UNKNOWN");
  });

  test("abi version", () => {
    const m = header.match(/#define MEMEXEC_ABI_VERSION (\d+)/);
    expect(native().memexec_abi_version()).toBe(Number(m![1]));
  });
});

describe("bad input without a model", () => {
  function newWith(config: string | null): { status: number; message?: string } {
    const h = new OutSlot();
    const err = new OutSlot();
    const status = native().memexec_new(config === null ? null : cstr(config), h.ptr, err.ptr);
    if (status === Status.OK) native().memexec_free(Number(h.value) as never);
    return { status, message: err.takeString() };
  }

  test("NULL config", () => {
    expect(newWith(null)).toEqual({ status: Status.NULL_ARGUMENT, message: "argument `config_json` is NULL" });
  });
  test("malformed config JSON", () => {
    const r = newWith("{model_dir");
    expect(r.status).toBe(Status.INVALID_JSON);
    expect(r.message).toContain("invalid JSON in config");
  });
  test("unknown config key", () => {
    const r = newWith(JSON.stringify({ model_dir: "/x", modeldir: "/y" }));
    expect(r.status).toBe(Status.INVALID_JSON);
    expect(r.message).toContain("unknown field `modeldir`");
  });
  test("undeclared adapter", () => {
    const r = newWith(JSON.stringify({ model_dir: "/x", stages: { chunk: { adapter: "memory-chunk" } } }));
    expect(r.status).toBe(Status.INVALID_CONFIG);
    expect(r.message).toContain("memory-chunk");
  });
  test("missing model directory", () => {
    const r = newWith(JSON.stringify({ model_dir: "/nonexistent/memexec-model" }));
    expect(r.status).toBe(Status.LOAD_FAILED);
    expect(r.message).toContain("/nonexistent/memexec-model");
  });
  test("invalid handle", () => {
    const out = new OutSlot();
    const err = new OutSlot();
    const s = native().memexec_call(12345 as never, cstr("x"), cstr('{"user":"a"}'), null, out.ptr, err.ptr);
    expect(s).toBe(Status.INVALID_HANDLE);
    expect(err.takeString()).toContain("invalid handle");
    expect(native().memexec_free(null)).toBe(Status.INVALID_HANDLE);
  });
});
