#!/usr/bin/env python3
"""How cuBLAS sums the attention's values product, and memexec's kernel that sums the same way,
on the machine it runs on (MLX CUDA only).

MLX 0.32.2 CUDA decomposes Gemma-4's decode attention (head dims 256 / 512) and ends it with
`matmul(p, expand_dims(v, 2))`: p `[1, kv_heads, groups, 1, S]`, v a cache view `[1, kv_heads,
S, D]`, bf16. With M = 1 and v not transposed MLX has no gemv for it and calls cublasLt (f32
accumulation), ~26 us of host time per call. Modes:

  (default) per (S, D) in `--keys` x `--dims`, one compressed .npz in OUT_DIR with
      - FPRev-style probes of the summation tree (Xie et al., "FPRev: revealing the order of
        floating-point summation"). Query (i, j, W): p = 1, v's column = +BIG at key i, -BIG at
        key j, 1 at the keys of window W (<= 255 keys, so the bf16 output holds the count
        exactly), 0 elsewhere. The big terms swallow every 1 summed with them before they
        cancel, so the output is the number of W's keys OUTSIDE the smallest subtree holding i
        and j; summed over windows covering all keys, that subtree's size. Queries: (0, j),
        (j-1, j), (i, S-1) for every key and random pairs;
      - cuBLAS's output bits on random inputs (`draw_random` draws them again elsewhere);
  --log-only   one values product per key count (ranges like 1-8192 allowed), for cublasLt's own
               log: run with `CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_MASK=2 CUBLASLT_LOG_FILE=...`;
  --names      the CUDA kernels (name, grid, block) cuBLAS runs per shape, through torch's
               profiler;
  --kernels N  tensor-core candidates (mma.sync k16 / k8, plain f32) vs cuBLAS, N cases per shape;
  --gemv N     GEMV_PLAN's candidate orders for cuBLAS's gemv kernels vs cuBLAS;
  --table N    memexec's kernel (src/model/kernels/values_product.cu, as
               src/model/values_product.rs builds and launches it) vs cuBLAS for EVERY key
               count its table covers, N cases each, `--rows` key counts per call: must print
               "0 differ" (exit 1 otherwise).

Usage: values_order.py OUT_DIR [--keys 37,128,400,1000,4000] [--dims 256,512] [--random N]
                       [--log-only | --names | --kernels N | --gemv N | --table N [--rows R]]
"""
import argparse
import os
import time

import mlx.core as mx
import numpy as np

KV_HEADS, GROUPS = 2, 4
# 2^40: partial sums of up to 2^15 ones stay below half an ulp of +-BIG on both sides of its
# binade (2^30 was not enough: -2^30 + 33 rounds to -(2^30 - 64)).
BIG = float(2.0 ** 40)
WINDOW = 255


def capacity(n):
    """A cache buffer's positions for `n` keys, as attention_cases.py lays them out."""
    return ((n + 255) // 256) * 256 + (256 if n % 256 == 0 else 0)


def values_product(p, vbuf, n):
    """memexec's / MLX's call: p `[1, G, H/G, 1, n]` times the first n positions of vbuf."""
    v = vbuf[:, :, :n, :]
    return p @ mx.expand_dims(v, 2)


def to_bf16(a):
    return mx.array(np.ascontiguousarray(a, dtype=np.float32)).astype(mx.bfloat16)


def queries(n, rng, pairs):
    """(i, j) pairs: (0, j), (j-1, j), (i, n-1) for every key, then `pairs` random ones."""
    q = [(0, j) for j in range(1, n)] + [(j - 1, j) for j in range(1, n)]
    q += [(i, n - 1) for i in range(0, n - 1)]
    for _ in range(pairs):
        i, j = sorted(rng.choice(n, 2, replace=False).tolist())
        q.append((i, j))
    seen, out = set(), []
    for x in q:
        if x not in seen and x[0] != x[1]:
            seen.add(x)
            out.append(x)
    return np.array(out, dtype=np.int32)


def order_probes(n, d, pairs, seed):
    """Runs every (pair, window) query; returns pairs [Q, 2], windows' starts [W] and the counts
    outside the pair's subtree [Q, W] (each window holds keys [start, start + WINDOW) less i and
    j)."""
    rng = np.random.default_rng(seed)
    qs = queries(n, rng, pairs)
    starts = np.arange(0, n, WINDOW, dtype=np.int32)
    jobs = [(qi, wi) for qi in range(len(qs)) for wi in range(len(starts))]
    per_call = KV_HEADS * d
    cap = capacity(n)
    counts = np.full((len(qs), len(starts)), -1, dtype=np.int32)
    p = mx.ones((1, KV_HEADS, GROUPS, 1, n), dtype=mx.bfloat16)
    disagree = 0
    for c0 in range(0, len(jobs), per_call):
        batch = jobs[c0:c0 + per_call]
        v = np.zeros((KV_HEADS, cap, d), dtype=np.float32)
        for slot, (qi, wi) in enumerate(batch):
            h, col = divmod(slot, d)
            s = starts[wi]
            v[h, s:min(n, s + WINDOW), col] = 1.0
            i, j = qs[qi]
            v[h, i, col] = BIG
            v[h, j, col] = -BIG
        out = values_product(p, to_bf16(v[None]), n)  # [1, G, H/G, 1, d]
        o = np.array(out.astype(mx.float32))[0, :, :, 0, :]  # [G, H/G, d]
        disagree += int((o != o[:, :1, :]).sum())
        flat = o[:, 0, :].reshape(-1)
        for slot, (qi, wi) in enumerate(batch):
            counts[qi, wi] = int(flat[slot])
    return qs, starts, counts, disagree


def draw_random(n, d, case):
    """Case `case`'s inputs for n keys / head dim d: probabilities (a softmax of normal scores,
    rounded to bf16) `[1, G, H/G, 1, n]` and a values buffer `[1, G, capacity(n), d]`, both as
    float32 numpy arrays holding bf16 values (round with MLX's astype to get the bits)."""
    rng = np.random.default_rng(1000003 * n + 7919 * d + case)
    s = rng.standard_normal((1, KV_HEADS, GROUPS, 1, n)).astype(np.float32) * 2.0
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
    v = rng.standard_normal((1, KV_HEADS, capacity(n), d)).astype(np.float32)
    return p, v


def random_cases(n, d, cases):
    outs = []
    for c in range(cases):
        p, v = draw_random(n, d, c)
        out = values_product(to_bf16(p), to_bf16(v), n)
        outs.append(np.array(out.view(mx.uint16)))
    return np.stack(outs) if outs else np.zeros((0,), np.uint16)


MMA_BODY = r"""
const int lane = threadIdx.x % 32;
const int warp_global = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
const int tiles = D / 16;
const int g = warp_global / tiles;
const int d0 = (warp_global % tiles) * 16;
const int kv_heads = v_shape[1];
if (g >= kv_heads) return;
const int n_keys = v_shape[2];
const T* vh = v + g * v_strides[1];
const T* ph = p + g * 4 * n_keys;
const int gid = lane >> 2, tig = lane & 3;
float c[4] = {0.f, 0.f, 0.f, 0.f};
auto ldv = [&](int k0, int m, int k) -> uint32_t {
  int kk = k0 + k;
  return kk < n_keys ? (uint32_t)__bfloat16_as_ushort(vh[kk * v_strides[2] + d0 + m]) : 0u;
};
auto ldp = [&](int k0, int k, int n) -> uint32_t {
  int kk = k0 + k;
  return (n < 4 && kk < n_keys) ? (uint32_t)__bfloat16_as_ushort(ph[n * n_keys + kk]) : 0u;
};
#if KSTEP == 16
for (int k0 = 0; k0 < n_keys; k0 += 16) {
  uint32_t a0 = ldv(k0, gid, tig * 2) | (ldv(k0, gid, tig * 2 + 1) << 16);
  uint32_t a1 = ldv(k0, gid + 8, tig * 2) | (ldv(k0, gid + 8, tig * 2 + 1) << 16);
  uint32_t a2 = ldv(k0, gid, tig * 2 + 8) | (ldv(k0, gid, tig * 2 + 9) << 16);
  uint32_t a3 = ldv(k0, gid + 8, tig * 2 + 8) | (ldv(k0, gid + 8, tig * 2 + 9) << 16);
  uint32_t b0 = ldp(k0, tig * 2, gid) | (ldp(k0, tig * 2 + 1, gid) << 16);
  uint32_t b1 = ldp(k0, tig * 2 + 8, gid) | (ldp(k0, tig * 2 + 9, gid) << 16);
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#elif KSTEP == 8
for (int k0 = 0; k0 < n_keys; k0 += 8) {
  uint32_t a0 = ldv(k0, gid, tig * 2) | (ldv(k0, gid, tig * 2 + 1) << 16);
  uint32_t a1 = ldv(k0, gid + 8, tig * 2) | (ldv(k0, gid + 8, tig * 2 + 1) << 16);
  uint32_t b0 = ldp(k0, tig * 2, gid) | (ldp(k0, tig * 2 + 1, gid) << 16);
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, "
      "{%6}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
#else
if (lane < 16) {
  for (int n = 0; n < 4; n++) {
    float s = 0.f;
    for (int k = 0; k < n_keys; k++) {
      s = __fadd_rn(s, __fmul_rn(static_cast<float>(ph[n * n_keys + k]),
                                 static_cast<float>(vh[k * v_strides[2] + d0 + lane])));
    }
    o[(g * 4 + n) * D + d0 + lane] = static_cast<T>(s);
  }
}
return;
#endif
for (int e = 0; e < 4; e++) {
  int m = gid + (e >= 2 ? 8 : 0);
  int n = tig * 2 + (e & 1);
  if (n < 4) {
    o[(g * 4 + n) * D + d0 + m] = static_cast<T>(c[e]);
  }
}
"""

KERNELS = {}


def mma_kernel(kstep):
    """A candidate: the values product on the tensor cores with mma.sync, k16 or k8 steps in key
    order (kstep 16 / 8), or plain f32 sequential sums (kstep 1), one warp per 16 dims."""
    if kstep not in KERNELS:
        KERNELS[kstep] = mx.fast.cuda_kernel(
            name=f"values_mma_k{kstep}", input_names=["p", "v"], output_names=["o"],
            source=MMA_BODY, header=f"#define KSTEP {kstep}\n", ensure_row_contiguous=False)
    return KERNELS[kstep]


def kernel_product(kstep, p, vbuf, n):
    d = vbuf.shape[-1]
    v = vbuf[:, :, :n, :]
    warps = KV_HEADS * d // 16
    (o,) = mma_kernel(kstep)(
        inputs=[p, v], template=[("T", mx.bfloat16), ("D", d)],
        grid=(warps * 32, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(1, KV_HEADS, GROUPS, 1, d)], output_dtypes=[mx.bfloat16])
    return o


def kernel_check(keys, dims, cases):
    """Each candidate against cuBLAS on `cases` random cases per shape: fraction of equal bits."""
    for d in dims:
        for n in keys:
            line = []
            for kstep in (16, 8, 1):
                eq = tot = 0
                for c in range(cases):
                    p, v = draw_random(n, d, 100 + c)
                    pb, vb = to_bf16(p), to_bf16(v)
                    ref = values_product(pb, vb, n)
                    ours = kernel_product(kstep, pb, vb, n)
                    a = np.array(ref.view(mx.uint16))
                    b = np.array(ours.view(mx.uint16))
                    eq += int((a == b).sum())
                    tot += a.size
                line.append(f"k{kstep} {eq / tot:.5f}")
            print(f"kernels D={d} S={n}: " + "  ".join(line), flush=True)


def kernel_names(keys, dims):
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.zeros(1, device="cuda")
    for d in dims:
        for n in keys:
            p, v = draw_random(n, d, 0)
            pb, vb = to_bf16(p), to_bf16(v)
            mx.eval(pb, vb, values_product(pb, vb, n))
            mx.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                mx.eval(values_product(pb, vb, n))
                mx.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                prof.export_chrome_trace(f.name)
                trace = json.load(open(f.name))
            seen = []
            for e in trace.get("traceEvents", []):
                if e.get("cat") == "kernel":
                    args = e.get("args", {})
                    seen.append(f"{e['name']} grid={args.get('grid')} block={args.get('block')}"
                                f" smem={args.get('shared memory')} regs={args.get('registers per thread')}")
            print(f"names D={d} S={n}: " + (" | ".join(seen) if seen else "(no kernel seen)"),
                  flush=True)


GEMV_BODY = r"""
const int idx = blockIdx.x * blockDim.x + threadIdx.x;
const int kv_heads = v_shape[1];
const int n_keys = v_shape[2];
if (idx >= kv_heads * 4 * D) return;
const int g = idx / (4 * D);
const int n = (idx / D) % 4;
const int d = idx % D;
const T* vh = v + g * v_strides[1] + d;
const T* ph = p + (g * 4 + n) * n_keys;
const int64_t ks = v_strides[2];
float part[Y];
for (int y = 0; y < Y; y++) part[y] = 0.f;
#define TERM(k) __fmul_rn(static_cast<float>(ph[k]), static_cast<float>(vh[(k) * ks]))
if (MODE == 0) {
  for (int y = 0; y < Y; y++)
    for (int base = V * y; base < n_keys; base += V * Y)
      for (int e = 0; e < V; e++)
        if (base + e < n_keys) part[y] = __fadd_rn(part[y], TERM(base + e));
} else if (MODE == 2) {
  for (int y = 0; y < Y; y++)
    for (int base = V * y; base < n_keys; base += V * Y) {
      float s = 0.f;
      for (int e = 0; e < V; e++)
        if (base + e < n_keys) s = __fadd_rn(s, TERM(base + e));
      part[y] = __fadd_rn(part[y], s);
    }
} else {
  int c = (n_keys + Y - 1) / Y;
  c = (c + R - 1) / R * R;
  for (int y = 0; y < Y; y++)
    for (int k = y * c; k < min(n_keys, (y + 1) * c); k++)
      part[y] = __fadd_rn(part[y], TERM(k));
}
float r;
if (COMB == 0) {
  r = part[0];
  for (int y = 1; y < Y; y++) r = __fadd_rn(r, part[y]);
} else if (COMB == 1) {
  for (int o = Y / 2; o >= 1; o /= 2)
    for (int l = 0; l < o; l++) part[l] = __fadd_rn(part[l], part[l + o]);
  r = part[0];
} else {
  for (int o = 1; o < Y; o *= 2)
    for (int l = 0; l + o < Y; l += 2 * o) part[l] = __fadd_rn(part[l], part[l + o]);
  r = part[0];
}
o[(g * 4 + n) * D + d] = static_cast<T>(r);
"""

MODES = {"vec": 0, "contig": 1, "vecsep": 2}
COMBS = {"seq": 0, "desc": 1, "asc": 2}


def gemv_product(cfg, p, vbuf, n):
    """A candidate order `cfg` = (Y, mode, V, R, comb): each output summed over Y partial sums
    (keys split `vec`: V consecutive keys per partial per pass, `vecsep`: the same with each V
    summed apart first, `contig`: chunks of ceil(S / Y) rounded up to R), in f32, partials
    combined `seq`uentially or as a tree with falling (`desc`) or rising (`asc`) offsets."""
    y, mode, v_, r, comb = cfg
    name = f"values_gemv_{y}_{mode}_{v_}_{r}_{comb}"
    if name not in KERNELS:
        KERNELS[name] = mx.fast.cuda_kernel(
            name=name, input_names=["p", "v"], output_names=["o"], source=GEMV_BODY,
            header=(f"#define Y {y}\n#define MODE {MODES[mode]}\n#define V {v_}\n"
                    f"#define R {r}\n#define COMB {COMBS[comb]}\n"),
            ensure_row_contiguous=False)
    d = vbuf.shape[-1]
    v = vbuf[:, :, :n, :]
    total = KV_HEADS * GROUPS * d
    (o,) = KERNELS[name](
        inputs=[p, v], template=[("T", mx.bfloat16), ("D", d)],
        grid=(total, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(1, KV_HEADS, GROUPS, 1, d)], output_dtypes=[mx.bfloat16])
    return o


# (name, head dim, key counts, candidate orders) per cuBLAS kernel seen on the H200.
GEMV_PLAN = [
    ("gemvNSP [24,32] (opt 10)", 256, (2, 7, 37, 129, 201, 300, 425),
     [(32, "vec", 4, 1, "desc"), (32, "vecsep", 4, 1, "desc")]),
    ("gemvNSP [24,32] (opt 10)", 512, (47, 129, 201, 308),
     [(32, "vec", 4, 1, "desc"), (32, "vecsep", 4, 1, "desc")]),
    ("gemvx<6> [32,2] (opt 94)", 512, (2, 7, 37, 45),
     [(2, "contig", 1, r, "seq") for r in (1, 2, 4)]),
    ("gemvx<9> [16,32] (opt 93)", 256, (426, 511, 700, 1100, 2571),
     [(32, "vec", 1, 1, c) for c in ("desc", "asc")]),
    ("gemvx<9> [64,8] (opt 106)", 512, (309, 310, 333, 401, 455, 497, 505, 511, 700),
     [(8, "contig", 1, r, "desc") for r in (1, 2, 4, 8, 16, 32, 64)]),
]


def gemv_check(cases):
    for label, d, keys, cfgs in GEMV_PLAN:
        for cfg in cfgs:
            line = []
            for n in keys:
                eq = tot = 0
                for c in range(cases):
                    p, v = draw_random(n, d, 200 + c)
                    pb, vb = to_bf16(p), to_bf16(v)
                    a = np.array(values_product(pb, vb, n).view(mx.uint16))
                    b = np.array(gemv_product(cfg, pb, vb, n).view(mx.uint16))
                    eq += int((a == b).sum())
                    tot += a.size
                line.append(f"S={n}:{eq / tot:.5f}")
            print(f"gemv {label} D={d} {cfg}: " + " ".join(line), flush=True)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# src/model/values_product.rs: HEADER, ORDERS, source().
PROD_HEADER = (
    "template <int N> struct MemexecInt { static constexpr int value = N; };\n"
    "#define MEMEXEC_MMA_K16(c, a0, a1, a2, a3, b0, b1) asm volatile("
    "\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
    "{%0,%1,%2,%3};\" : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a0), \"r\"(a1), "
    "\"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1))\n")
ORDERS = {256: dict(HALVES_MAX=0, NSP_MAX=425, STRIDED_MAX=2571, STRIDED_Y=32, STRIDED_V=1),
          512: dict(HALVES_MAX=46, NSP_MAX=308, STRIDED_MAX=1190, STRIDED_Y=8, STRIDED_V=64)}


def prod_source(rows):
    body = open(os.path.join(ROOT, "src/model/kernels/values_product.cu")).read()
    body = "\n".join(l for l in body.splitlines() if not l.strip().startswith("//"))
    s = ("const int kv_heads = v0_shape[1];\nconst int groups = p0_shape[2];\n"
         "const int row = blockIdx.x / (kv_heads * (D / 32));\n"
         "const T* pr;\nconst T* vr;\nint n_keys;\nint64_t v_head, v_step;\nswitch (row) {\n")
    for r in range(rows):
        s += (f"  case {r}: pr = p{r}; vr = v{r}; n_keys = v{r}_shape[2]; "
              f"v_head = v{r}_strides[1];\n    v_step = v{r}_strides[2]; break;\n")
    return s + "  default: return;\n}\n" + body


def prod_product(ps, vs):
    """memexec's kernel (src/model/kernels/values_product.cu) over rows ps[r] / vs[r]."""
    rows = len(ps)
    name = f"memexec_values_product_{rows}"
    if name not in KERNELS:
        KERNELS[name] = mx.fast.cuda_kernel(
            name=name, input_names=[f"p{r}" for r in range(rows)] + [f"v{r}" for r in range(rows)],
            output_names=["o"], source=prod_source(rows), header=PROD_HEADER,
            ensure_row_contiguous=False)
    d = vs[0].shape[-1]
    kv, groups = ps[0].shape[1], ps[0].shape[2]
    # STRIDED_MAX stays on the host (values_product.rs `Order::constants`).
    consts = [("T", mx.bfloat16), ("D", d)] + [
        (k, v) for k, v in ORDERS[d].items() if k != "STRIDED_MAX"]
    (o,) = KERNELS[name](
        inputs=list(ps) + list(vs), template=consts,
        grid=(rows * kv * (d // 32) * 1024, 1, 1), threadgroup=(1024, 1, 1),
        output_shapes=[(rows, kv, groups, 1, d)], output_dtypes=[mx.bfloat16])
    return o


def table_sweep(dims, cases, rows_per_call):
    """Every key count the table covers, `cases` random cases each, `rows_per_call` key counts
    per kernel call (rows of one call): prints the key counts whose output differs from cuBLAS
    and returns how many (key count, case) pairs differ."""
    rng = np.random.default_rng(4242)
    differ = 0
    for d in dims:
        top = ORDERS[d]["STRIDED_MAX"]
        cap = capacity(top + 64)
        vbig = to_bf16(rng.standard_normal((1, KV_HEADS, cap, d)))
        pbig = to_bf16(rng.random((1, KV_HEADS, GROUPS, 1, cap)) * 0.01)
        bad, checked, t = [], 0, time.time()
        for c in range(cases):
            keys = list(range(1, top + 1))
            for i in range(0, len(keys), rows_per_call):
                chunk = keys[i:i + rows_per_call]
                off = (c * 37 + i) % 64
                ps = [mx.contiguous(pbig[..., off:off + n]) for n in chunk]
                vs = [vbig[:, :, off:off + n, :] for n in chunk]
                ours = prod_product(ps, vs)
                refs = [values_product(p, vbig[:, :, off:, :], n) for p, n in zip(ps, chunk)]
                a = np.array(ours.view(mx.uint16))
                for r, (n, ref) in enumerate(zip(chunk, refs)):
                    b = np.array(ref.view(mx.uint16))[0]
                    checked += 1
                    if not (a[r] == b).all():
                        bad.append((n, int((a[r] != b).sum())))
        print(f"table D={d}: {checked} (key count, case) pairs in {time.time() - t:.0f} s, "
              f"{len(bad)} differ: {bad[:60]}", flush=True)
        differ += len(bad)
    return differ


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--keys", default="37,128,400,1000,4000")
    ap.add_argument("--dims", default="256,512")
    ap.add_argument("--pairs", type=int, default=600)
    ap.add_argument("--random", type=int, default=6)
    ap.add_argument("--log-only", action="store_true",
                    help="one values product per shape (for CUBLASLT_LOG_LEVEL), nothing saved")
    ap.add_argument("--no-order", action="store_true")
    ap.add_argument("--gemv", type=int, default=0,
                    help="N random cases per shape: GEMV_PLAN's candidate orders vs cuBLAS")
    ap.add_argument("--table", type=int, default=0,
                    help="N cases of every key count memexec's kernel covers vs cuBLAS")
    ap.add_argument("--rows", type=int, default=8, help="rows per kernel call for --table")
    ap.add_argument("--names", action="store_true",
                    help="the CUDA kernels (name, grid, block) cuBLAS runs per shape (torch's "
                         "profiler), then stop")
    ap.add_argument("--kernels", type=int, default=0,
                    help="N random cases per shape: candidate kernels vs cuBLAS, then stop")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    keys = []
    for x in a.keys.split(","):
        lo, _, hi = x.partition("-")
        keys += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    dims = [int(x) for x in a.dims.split(",")]
    print("mlx", mx.__version__, mx.default_device(), flush=True)
    if a.kernels:
        kernel_check(keys, dims, a.kernels)
        return
    if a.gemv:
        gemv_check(a.gemv)
        return
    if a.table:
        raise SystemExit(1 if table_sweep(dims, a.table, a.rows) else 0)
    if a.names:
        kernel_names(keys, dims)
        return
    if a.log_only:
        # One buffer per head dim, sliced: thousands of shapes in seconds.
        rng = np.random.default_rng(0)
        for d in dims:
            cap = capacity(max(keys))
            vbuf = to_bf16(rng.standard_normal((1, KV_HEADS, cap, d)))
            pall = to_bf16(rng.random((1, KV_HEADS, GROUPS, 1, cap)))
            for n in keys:
                p = mx.contiguous(pall[..., :n])
                mx.eval(values_product(p, vbuf, n))
            mx.synchronize()
            print(f"logged D={d}: {len(keys)} key counts", flush=True)
        return
    for d in dims:
        for n in keys:
            t = time.time()
            res = {"keys": n, "dim": d}
            if not a.no_order:
                qs, starts, counts, disagree = order_probes(n, d, a.pairs, n * 31 + d)
                res.update(pairs=qs, starts=starts, counts=counts, group_disagree=disagree)
            res["random_out"] = random_cases(n, d, a.random)
            np.savez_compressed(os.path.join(a.out, f"order-S{n}-D{d}.npz"), **res)
            extra = "" if a.no_order else (
                f"{len(res['pairs'])} pairs x {len(res['starts'])} windows, groups disagree "
                f"{res['group_disagree']}")
            print(f"D={d} S={n}: {extra} in {time.time() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
