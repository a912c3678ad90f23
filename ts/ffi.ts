// The bun:ffi binding of include/memexec.h: the symbol table (checked against the header by
// test/ffi.test.ts) and the helpers that move strings across the boundary.
import { dlopen, FFIType, ptr, CString, suffix, type Pointer } from "bun:ffi";
import { existsSync } from "node:fs";
import { join } from "node:path";

/** Status codes of the C API (`enum memexec_status`). */
export const Status = {
  OK: 0,
  PENDING: 1,
  NULL_ARGUMENT: 2,
  INVALID_UTF8: 3,
  INVALID_JSON: 4,
  INVALID_ARGUMENT: 5,
  INVALID_CONFIG: 6,
  LOAD_FAILED: 7,
  PROMPT_TOO_LONG: 8,
  CANCELLED: 9,
  CLOSED: 10,
  INVALID_HANDLE: 11,
  UNKNOWN_REQUEST: 12,
  GENERATION_FAILED: 13,
  INTERNAL: 14,
} as const;

/** The C signatures this binding uses; `test/ffi.test.ts` compares them with the header. */
export const symbols = {
  memexec_abi_version: { args: [], returns: FFIType.u32 },
  memexec_status_name: { args: [FFIType.i32], returns: FFIType.ptr },
  memexec_new: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  memexec_free: { args: [FFIType.ptr], returns: FFIType.i32 },
  memexec_call: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_batch: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_submit: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_submit_batch: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_poll: { args: [FFIType.ptr, FFIType.u64, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  memexec_cancel: { args: [FFIType.ptr, FFIType.u64, FFIType.ptr], returns: FFIType.i32 },
  memexec_prompt: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_messages: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.i32,
  },
  memexec_stats: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  memexec_string_free: { args: [FFIType.ptr], returns: FFIType.void },
} as const;

/** Where the cdylib is: `$MEMEXEC_LIB`, else this checkout's release then debug build. */
export function libraryPath(): string {
  const fromEnv = process.env.MEMEXEC_LIB;
  if (fromEnv) return fromEnv;
  const name = `libmemexec.${suffix}`;
  for (const profile of ["release", "debug"]) {
    const candidate = join(import.meta.dir, "..", "target", profile, name);
    if (existsSync(candidate)) return candidate;
  }
  throw new Error(`memexec: ${name} not found under target/; run \`cargo build\` or set MEMEXEC_LIB`);
}

type Lib = ReturnType<typeof dlopen<typeof symbols>>["symbols"];
let lib: Lib | undefined;

/** The loaded library (opened on first use). */
export function native(): Lib {
  lib ??= dlopen(libraryPath(), symbols).symbols;
  return lib;
}

const encoder = new TextEncoder();

/** A NUL-terminated UTF-8 copy of `s`; keep it referenced for the duration of the call. */
export function cstr(s: string): Uint8Array {
  return encoder.encode(s + "\0");
}

/** An out-parameter slot for one pointer (or one uint64). */
export class OutSlot {
  readonly cell = new BigUint64Array(1);
  get ptr(): Pointer {
    return ptr(this.cell);
  }
  get value(): bigint {
    return this.cell[0];
  }
  /** Reads the library-owned string in the slot and frees it; `undefined` when NULL. */
  takeString(): string | undefined {
    const p = Number(this.cell[0]);
    if (p === 0) return undefined;
    this.cell[0] = 0n;
    try {
      return new CString(p as Pointer).toString();
    } finally {
      native().memexec_string_free(p as Pointer);
    }
  }
}

/** An error from the C API: its status code, status name and message. */
export class MemexecError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(`${statusName(status)}: ${message}`);
    this.name = "MemexecError";
  }
}

/** `memexec_status_name` (a static string, not freed). */
export function statusName(status: number): string {
  const p = native().memexec_status_name(status);
  return p ? new CString(p).toString() : `status ${status}`;
}

/** Throws a MemexecError unless `status` is one of `ok`. */
export function check(status: number, err: OutSlot, ok: number[] = [Status.OK]): number {
  if (ok.includes(status)) return status;
  throw new MemexecError(status, err.takeString() ?? "(no message)");
}
