"""Checks that dense f32 products padded by memexec's rule (rows rounded up to a multiple of P and
to at least 2^21 multiply-adds, src/model/linear.rs `padded_rows`) give each row the same bits
whatever the row count, on the BLAS MLX loads (OpenBLAS after scripts/setup.sh).
Prints the number of (shape, rows, row) cases that differ.

usage: .deps/venv/bin/python scripts/bench/blas_row_invariance.py 8
"""
import mlx.core as mx, sys
P = int(sys.argv[1])
mx.random.seed(2)
bad = 0; tot = 0
def padded(x, W):
    M = x.shape[0]; Mp = -(-max(M, -(-(1<<21) // (W.shape[0]*W.shape[1]))) // P) * P
    if Mp != M: x = mx.concatenate([x, mx.zeros((Mp - M, x.shape[1]), x.dtype)], 0)
    return (x @ W.T)[:M]
for (K, N) in [(64,128),(128,64),(64,256),(32,64),(16,64),(64,16),(256,1024),(640,1024),(640,2048),(2048,640),(640,4096),(1024,640),(256,640),(640,262144),(128,262144),(64,262144)]:
    W = mx.random.normal((N, K)); x = mx.random.normal((128, K)); mx.eval(W, x)
    ref = padded(x[:1], W)
    refs = [padded(x[i:i+1], W) for i in range(24)]
    for M in (1,2,3,5,7,8,9,12,16,17,24,33,64,128):
        y = padded(x[:M], W)
        for i in range(min(M,24)):
            tot += 1
            if not mx.array_equal(y[i:i+1], refs[i]).item(): bad += 1; print("DIFF", K, N, M, i); break
print("pad", P, "bad", bad, "of", tot)
