"""What the memexec-vs-mlx-lm step comparisons share (logprobs_compare.py, trace_compare.py):
their common arguments, the seeded random-id prompts (drawn as e4b_parity.py draws them, so
the same --lengths give the same prompts), and the `memexec generate --logprobs-out` run."""
import os
import random
import subprocess

SEED = 20261130


def add_args(ap, lengths, tokens):
    """MEMEXEC MODEL_DIR OUT.json [--lengths] [--tokens] [--max-id] [--seed]."""
    ap.add_argument("memexec")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--lengths", default=lengths)
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--max-id", type=int, default=200000)
    ap.add_argument("--seed", type=int, default=SEED)


def random_prompts(a):
    """(name, ids) per --lengths entry: [2] + random ids in [3, max-id), one seeded stream."""
    rng = random.Random(a.seed)
    for n in map(int, a.lengths.split(",")):
        yield f"rand{n}", [2] + [rng.randrange(3, a.max_id) for _ in range(n - 1)]


def memexec_logprobs(a, ids, out_dir, env=None):
    """Runs `memexec generate --logprobs-out OUT_DIR/lp.json` (unpipelined step-by-step
    decode, then the ordinary one) on `ids`; returns the lp.json path, or None after printing
    why memexec failed."""
    path = os.path.join(out_dir, "lp.json")
    p = subprocess.run([a.memexec, "generate", "--model", a.model, "--prompt-ids",
                        ",".join(map(str, ids)), "--max-tokens", str(a.tokens),
                        "--ignore-eos", "--json", "--logprobs-out", path],
                       capture_output=True, text=True,
                       env=None if env is None else dict(os.environ, **env))
    if p.returncode != 0:
        print(f"memexec failed: {p.stderr.strip()[-300:]}")
        return None
    return path
