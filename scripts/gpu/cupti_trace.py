"""Where a decode step's time goes on the device and on the host, for ANY process (memexec's
binary, mlx-lm): a CUPTI injection library (CUDA_INJECTION64_PATH, compiled here with the CUDA
toolkit's CUPTI) records every kernel the GPU runs and, optionally, every CUDA runtime / driver
call the host makes; this script then cuts the trace into decode steps (each ends with the
greedy argmax kernel) and prints, per step: the GPU's busy time (union of kernel intervals),
its idle gaps, kernels, and the host API calls that cost the most (graph updates / launches /
node adds, ...). The device machine has no Nsight Systems; ncu serializes kernels.

  usage: cupti_trace.py OUTDIR [--api] [--graphs] [--steps N] -- COMMAND ...   (options before the --)
  e.g.   cupti_trace.py /tmp/ct -- $MEMEXEC generate --model $E4B --prompt-ids ... --max-tokens 64

--api adds the host's CUDA calls (each record costs the host ~1 us: host times are inflated,
use them for counts and shares). --graphs adds why CUDA graphs are instantiated: each failed
cudaGraphExecUpdate (result code, the node it names and that node's kernel) and each
cudaGraphInstantiate (the graph's node types), per step. Writes OUTDIR/trace.csv and prints a summary (also
OUTDIR/summary.json).
"""
import argparse
import bisect
import collections
import glob
import json
import os
import re
import subprocess
import sys

TOP = 40
SLOW_NS = 12000

SOURCE = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;
enum { BUF = 16 * 1024 * 1024 };

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = (uint8_t *)aligned_alloc(8, BUF);
  *size = BUF;
  *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                               size_t valid) {
  CUpti_Activity *rec = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      KREC *k = (KREC *)rec;
      fprintf(out, "K,%llu,%llu,%u,%u,%ux%ux%u/%ux%ux%u,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, (unsigned)k->graphId,
              (unsigned)(k->gridX * k->gridY * k->gridZ), k->gridX, k->gridY, k->gridZ,
              k->blockX, k->blockY, k->blockZ, k->name);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)rec;
      const char *name = NULL;
      cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                    : CUPTI_CB_DOMAIN_DRIVER_API,
                           a->cbid, &name);
      fprintf(out, "A,%llu,%llu,%u,0,-,%s\n", (unsigned long long)a->start,
              (unsigned long long)a->end, (unsigned)a->threadId, name ? name : "?");
    }
  }
  free(buffer);
}

/* --graphs: why graphs are (re-)instantiated. A callback on cudaGraphExecUpdate's exit logs
   every failed update (its result code, the node it names, that node's kernel) and one on
   cudaGraphInstantiate logs the graph's node types (kernel / memcpy / memset / child graph /
   empty / other), since a graph MLX does not try to update is instantiated without a failed
   update first. Nodes are read with the driver API (libcuda, the one copy in the process, so
   no second CUDA runtime is linked in). Those calls re-enter this callback through the driver
   domain, whose names never match the two logged here, and with --api they show up among the
   host's calls (a few `cuGraphNodeGetType` per step). */
typedef struct { cudaGraphExec_t exec; cudaGraph_t graph; cudaGraphExecUpdateResultInfo *info; } UpdateParams;
typedef struct { cudaGraphExec_t *exec; cudaGraph_t graph; } InstantiateParams;

static const char *kernel_name(CUgraphNode node) {
  const char *name = NULL;
  CUDA_KERNEL_NODE_PARAMS kp;
  if (cuGraphKernelNodeGetParams(node, &kp) == CUDA_SUCCESS && kp.func &&
      cuFuncGetName(&name, kp.func) == CUDA_SUCCESS && name)
    return name;
  return "?";
}

static void node_types(CUgraph graph, char *buf, size_t len) {
  size_t n = 0;
  int counts[8] = {0};
  if (cuGraphGetNodes(graph, NULL, &n) == CUDA_SUCCESS && n > 0) {
    CUgraphNode *nodes = (CUgraphNode *)malloc(n * sizeof *nodes);
    if (nodes && cuGraphGetNodes(graph, nodes, &n) == CUDA_SUCCESS) {
      for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        if (cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS) { counts[7]++; continue; }
        counts[t == CU_GRAPH_NODE_TYPE_KERNEL ? 0 : t == CU_GRAPH_NODE_TYPE_MEMCPY ? 1
               : t == CU_GRAPH_NODE_TYPE_MEMSET ? 2 : t == CU_GRAPH_NODE_TYPE_GRAPH ? 3
               : t == CU_GRAPH_NODE_TYPE_EMPTY ? 4 : t == CU_GRAPH_NODE_TYPE_HOST ? 5 : 6]++;
      }
    }
    free(nodes);
  }
  snprintf(buf, len, "k%d c%d s%d g%d e%d h%d o%d x%d", counts[0], counts[1], counts[2],
           counts[3], counts[4], counts[5], counts[6], counts[7]);
}

static void CUPTIAPI on_api(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                            const void *data) {
  const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
  if (cb->callbackSite != CUPTI_API_EXIT || !cb->functionName) return;
  /* MLX may call either API; a runtime call may also show up as the driver call it makes, so
     the domain is logged with each record (U / I: runtime, V / J: driver) and counted apart. */
  int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
  const char *name = cb->functionName;
  int update = runtime ? strncmp(name, "cudaGraphExecUpdate", 19) == 0
                       : strncmp(name, "cuGraphExecUpdate", 17) == 0;
  int inst = runtime ? strncmp(name, "cudaGraphInstantiate", 20) == 0
                     : strncmp(name, "cuGraphInstantiate", 18) == 0;
  if (!update && !inst) return;
  uint64_t ts = 0;
  cuptiGetTimestamp(&ts);
  if (update) {
    const UpdateParams *p = (const UpdateParams *)cb->functionParams;
    int result = p->info ? (int)p->info->result : -1;
    if (result != (int)cudaGraphExecUpdateSuccess) {
      char types[96] = "-";
      const char *kernel = "-";
      if (p->info && p->info->errorNode) {
        CUgraphNodeType t;
        CUgraphNode node = (CUgraphNode)p->info->errorNode;
        if (cuGraphNodeGetType(node, &t) == CUDA_SUCCESS) {
          snprintf(types, sizeof types, "type%d", (int)t);
          if (t == CU_GRAPH_NODE_TYPE_KERNEL) kernel = kernel_name(node);
        }
      }
      fprintf(out, "%c,%llu,%llu,%d,0,%s,%s\n", runtime ? 'U' : 'V', (unsigned long long)ts,
              (unsigned long long)ts, result, types, kernel);
    }
  } else {
    const InstantiateParams *p = (const InstantiateParams *)cb->functionParams;
    char types[96];
    node_types((CUgraph)p->graph, types, sizeof types);
    fprintf(out, "%c,%llu,%llu,0,0,%s,-\n", runtime ? 'I' : 'J', (unsigned long long)ts,
            (unsigned long long)ts, types);
  }
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  fclose(out);
}

int InitializeInjection(void) {
  const char *path = getenv("CUPTI_TRACE_OUT");
  out = fopen(path ? path : "/tmp/cupti-trace.csv", "w");
  cuptiActivityRegisterCallbacks(requested, completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (getenv("CUPTI_TRACE_GRAPHS")) {
    CUpti_SubscriberHandle sub;
    cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_api, NULL);
    cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API);
    cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API);
  }
  if (getenv("CUPTI_TRACE_API")) {
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  }
  atexit(finish);
  return 1;
}
"""


def cupti_dirs():
    """(include dir, lib dir) of the CUDA toolkit's CUPTI."""
    heads = glob.glob("/usr/local/cuda*/extras/CUPTI/include/cupti.h") + glob.glob(
        "/usr/local/cuda*/targets/*/include/cupti.h") + glob.glob("/usr/local/cuda*/include/cupti.h")
    libs = glob.glob("/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*") + glob.glob(
        "/usr/local/cuda*/targets/*/lib/libcupti.so*") + glob.glob("/usr/local/cuda*/lib64/libcupti.so*")
    if not heads or not libs:
        sys.exit(f"no CUPTI found (headers {heads}, libraries {libs})")
    return os.path.dirname(heads[0]), os.path.dirname(libs[0])


def build(outdir):
    inc, lib = cupti_dirs()
    header = open(os.path.join(inc, "cupti_activity.h")).read()
    versions = [int(v) for v in re.findall(r"\}\s*CUpti_ActivityKernel(\d+)\s*;", header)]
    # The newest versioned kernel record is the one CUPTI writes (older headers also have the
    # unversioned name as the newest).
    krec = f"CUpti_ActivityKernel{max(versions)}" if versions else "CUpti_ActivityKernel"
    src = os.path.join(outdir, "inject.c")
    so = os.path.join(outdir, "libinject.so")
    open(src, "w").write(SOURCE)
    cmd = ["gcc", "-O2", "-shared", "-fPIC", f"-DKREC={krec}", f"-I{inc}",
           "-I/usr/local/cuda/include", src, "-o", so, f"-L{lib}", "-L/usr/local/cuda/lib64/stubs", "-lcupti", "-lcuda",
           f"-Wl,-rpath,{lib}"]
    subprocess.run(cmd, check=True)
    print(f"[cupti] injection built with {krec} ({inc})", flush=True)
    return so


def union(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def short_name(name):
    """A demangled kernel's qualified name: no return type, template arguments or parameters
    (`std::enable_if<...>::type mlx::core::cu::gather<...>(...)` -> `mlx::core::cu::gather`)."""
    stack, top = [], []
    for ch in name:
        if ch == "(" and not stack:
            break
        if ch in "<(" and (ch == "(" or not stack or stack[-1] == "<"):
            stack.append(ch)
        elif stack and ch == {"<": ">", "(": ")"}[stack[-1]]:
            stack.pop()
        elif not stack:
            top.append(ch)
    words = "".join(top).split()
    return (words[-1] if words else name)[:70]


def demangle(names):
    """Readable kernel names (c++filt), see `short_name`."""
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), text=True, capture_output=True)
        out = r.stdout.splitlines()
    except OSError:
        out = names
    if len(out) != len(names):
        out = names
    return [short_name(x) for x in out]


# One line of the trace: a kernel (`tag` its CUDA graph, `blocks` its grid size, `dims`
# "grid/block"), a host call (`tag` its thread) or, with --graphs, a failed graph update
# (`tag` its result code, `dims` the node it names, `name` that node's kernel) or a graph
# instantiation (`dims` its node types); graph records come apart in `summarize`.
Record = collections.namedtuple("Record", "start end tag blocks name dims")


def per_kernel(kernels):
    """No decode steps in the trace: each kernel (name, grid / block) with its calls and mean
    device time."""
    calls, time = collections.Counter(), collections.Counter()
    for k in kernels:
        calls[(k.name, k.dims)] += 1
        time[(k.name, k.dims)] += k.end - k.start
    keys = [key for key, _ in time.most_common(TOP)]
    names = demangle([key[0] for key in keys])
    return {"kernels": [(name, key[1], calls[key], time[key] / calls[key] / 1e3)
                        for name, key in zip(names, keys)]}


def summarize(path, steps_wanted):
    kernels, api, graph_events = [], [], []
    for line in open(path, errors="replace"):
        parts = line.rstrip("\n").split(",", 6)
        if len(parts) < 7:
            continue
        rec = Record(int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]), parts[6], parts[5])
        if parts[0] in ("U", "I", "V", "J"):
            graph_events.append((parts[0], rec))
        else:
            (kernels if parts[0] == "K" else api).append(rec)
    kernels.sort(key=lambda k: k.end)
    api.sort()
    kernel_ends = [k.end for k in kernels]
    api_starts = [x.start for x in api]

    def step_kernels(a, b):
        """The kernels that end in (a, b], by start."""
        return sorted(kernels[bisect.bisect_right(kernel_ends, a):bisect.bisect_right(kernel_ends, b)])

    ends = [k.end for k in kernels if "arg_reduce" in k.name or "argmax" in k.name.lower()]
    if len(ends) < 3:
        return per_kernel(kernels)
    bounds = ends[-(steps_wanted + 1):]
    steps = []
    names = collections.Counter()
    blocks = collections.Counter()
    name_time = collections.Counter()
    api_count, api_time = collections.Counter(), collections.Counter()
    graph_events.sort(key=lambda e: e[1].start)
    event_starts = [e[1].start for e in graph_events]
    failed, instantiated = collections.Counter(), collections.Counter()
    for a, b in zip(bounds, bounds[1:]):
        for kind, e in graph_events[bisect.bisect_right(event_starts, a):bisect.bisect_right(event_starts, b)]:
            api_name = "runtime" if kind in "UI" else "driver"
            if kind in "UV":
                failed[(api_name, e.tag, e.dims, e.name)] += 1
            else:
                instantiated[(api_name, e.dims)] += 1
        ks = step_kernels(a, b)
        busy = union([(max(k.start, a), k.end) for k in ks])
        gaps = sorted((ks[i + 1].start - ks[i].end for i in range(len(ks) - 1)), reverse=True)
        steps.append({"wall_us": (b - a) / 1e3, "busy_us": busy / 1e3, "kernels": len(ks),
                      "graphs": len({k.tag for k in ks}), "gap_top5_us": [g / 1e3 for g in gaps[:5]]})
        for k in ks:
            names[k.name] += 1
            blocks[k.name] += k.blocks
            name_time[k.name] += k.end - k.start
        for x in api[bisect.bisect_right(api_starts, a):bisect.bisect_right(api_starts, b)]:
            api_count[x.name] += 1
            api_time[x.name] += x.end - x.start
    # One step in order: its slow kernels (and the first few), to see what they wait on.
    seq = step_kernels(bounds[len(bounds) // 2 - 1], bounds[len(bounds) // 2])
    slow = [(i, (k.end - k.start) / 1e3, k.dims, k.name) for i, k in enumerate(seq)
            if i < 8 or k.end - k.start > SLOW_NS]
    n = len(steps)
    failed_keys = [k for k, _ in failed.most_common()]
    top = [k for k, _ in name_time.most_common(TOP)]
    readable = dict(zip(top, demangle(top)))
    mean = lambda key: sum(s[key] for s in steps) / n
    summary = {
        "steps": n,
        "wall_us_per_step": mean("wall_us"),
        "gpu_busy_us_per_step": mean("busy_us"),
        "gpu_busy_fraction": mean("busy_us") / mean("wall_us"),
        "kernels_per_step": mean("kernels"),
        "graphs_per_step": mean("graphs"),
        "kernel_us_top": [(readable[k], names[k] / n, name_time[k] / n / 1e3, blocks[k] / names[k])
                          for k in top],
        "api_us_top": [(k, api_count[k] / n, api_time[k] / n / 1e3) for k, _ in api_time.most_common(TOP)],
        "api_us_per_step": sum(api_time.values()) / n / 1e3,
        "graph_updates_failed_per_step": [(*k[:3], name, failed[k] / n) for k, name in
                                          zip(failed_keys, demangle([k[3] for k in failed_keys]))],
        "graphs_instantiated_per_step": [(*k, c / n) for k, c in instantiated.most_common()],
        "first_steps": steps[:3],
        "one_step_slow": [(i, us, dims, r) for (i, us, dims, _), r in
                          zip(slow, demangle([x[3] for x in slow]))],
    }
    return summary


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__)
    cut = sys.argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--api", action="store_true")
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--steps", type=int, default=48)
    a = ap.parse_args(sys.argv[1:cut])
    cmd = sys.argv[cut + 1:]
    os.makedirs(a.outdir, exist_ok=True)
    so = build(a.outdir)
    trace = os.path.join(a.outdir, "trace.csv")
    env = dict(os.environ, CUDA_INJECTION64_PATH=so, CUPTI_TRACE_OUT=trace)
    if a.api:
        env["CUPTI_TRACE_API"] = "1"
    if a.graphs:
        env["CUPTI_TRACE_GRAPHS"] = "1"
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    tail = r.stdout.strip().splitlines()[-1:] if r.stdout else []
    print(f"[cupti] command rc={r.returncode}; last line: {tail[0][:300] if tail else ''}", flush=True)
    s = summarize(trace, a.steps)
    json.dump(s, open(os.path.join(a.outdir, "summary.json"), "w"), indent=1)
    if "kernels" in s:
        print("[cupti] no decode steps; kernels by total time (calls, mean us, grid/block, name):")
        for name, dims, calls, us in s["kernels"]:
            print(f"   {calls:6d} {us:9.1f}  {dims:>24}  {name}")
        sys.exit(r.returncode)
    print(f"[cupti] {s['steps']} steps: wall {s['wall_us_per_step']:.0f} us, GPU busy "
          f"{s['gpu_busy_us_per_step']:.0f} us ({100 * s['gpu_busy_fraction']:.0f}%), "
          f"{s['kernels_per_step']:.0f} kernels in {s['graphs_per_step']:.0f} graphs per step; "
          f"host CUDA API {s['api_us_per_step']:.0f} us per step")
    print("[cupti] kernels per step (count, us, mean blocks per launch):")
    for name, c, t, b in s["kernel_us_top"]:
        print(f"   {c:7.1f} {t:8.1f} {b:8.0f}  {name}")
    if s["api_us_top"]:
        print("[cupti] host CUDA calls per step (count, us):")
        for name, c, t in s["api_us_top"]:
            print(f"   {c:7.1f} {t:8.1f}  {name}")
    if a.graphs:
        print("[cupti] failed graph updates per step (API, result code, node type, kernel):")
        for api_name, code, node, name, c in s["graph_updates_failed_per_step"]:
            print(f"   {c:7.2f}  {api_name:>7}  {code:>3}  {node:>6}  {name}")
        print("[cupti] graph instantiations per step (node types: kernel, memcpy, memset, child "
              "graph, empty, host, other, unreadable):")
        for api_name, types, c in s["graphs_instantiated_per_step"]:
            print(f"   {c:7.2f}  {api_name:>7}  {types}")
    print("[cupti] first steps:", json.dumps(s["first_steps"]))
    print(f"[cupti] one step in order: the first 8 kernels and every one over {SLOW_NS / 1e3:.0f} us "
          "(index, us, grid/block, name):")
    for i, us, dims, name in s["one_step_slow"]:
        print(f"   {i:5d} {us:8.1f}  {dims:>24}  {name}")
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
