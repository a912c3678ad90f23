"""One kernel variant's 8-row products of two e4b shapes, three times each (for Nsight Compute:
`ncu --kernel-name regex:quantized_rows --launch-skip 3 --launch-count 1 ... python one.py SRC HDR`
profiles the first output-head product). Run from the repository's copy on the GPU machine."""
import sys, os
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "../../../scripts/gpu"))
import mlx.core as mx
import quantized_rows as q
q.make_kernel(sys.argv[1], sys.argv[2])
for n, k in [(20480, 2560), (262144, 2560)]:
    w, s, b = mx.quantize((mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16), group_size=64, bits=4)
    x = mx.random.normal((8, k)).astype(mx.bfloat16)
    mx.eval(w, s, b, x)
    for _ in range(3):
        mx.eval(q.kernel_rows(x, w, s, b, 64, 4))
print("done")
