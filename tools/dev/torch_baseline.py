# Host-side baseline for the int8 GEMM timings: torch fp32 matmul and torch._int_mm on the CPU (same shapes).
import time, torch
def med(fn, r=7):
    fn(); ts = []
    for _ in range(r):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2]
print("torch", torch.__version__, "threads", torch.get_num_threads())
for M, K, N in [(1, 4096, 11008), (16, 4096, 11008), (1024, 4096, 4096)]:
    a = torch.randn(M, K); w = torch.randn(N, K)
    t = med(lambda: a @ w.t())
    ai = torch.randint(-127, 128, (max(M, 17), K), dtype=torch.int8); wi = torch.randint(-127, 128, (K, N), dtype=torch.int8)
    try:
        ti = med(lambda: torch._int_mm(ai, wi)); ti_s = f"{ti*1e3:.2f} ms (M={ai.shape[0]}) {2*ai.shape[0]*N*K/ti/1e9:.0f} GOP/s"
    except Exception as e:
        ti_s = f"n/a ({type(e).__name__})"
    print(f"{M}x{K}x{N}: fp32 matmul {t*1e3:.2f} ms {2*M*N*K/t/1e9:.0f} GFLOP/s; torch._int_mm {ti_s}")
