"""The CPU library's own thread pool (csrc/cpu/thread_pool.{h,cpp}; no OpenMP).

* every parallel kernel gives the same bytes with 1 thread and with 2, 3 or 5 (``set_num_threads``;
  more threads than cores is allowed and only changes the split);
* the default thread count follows the process's CPU affinity; ``BNB_MS_NUM_THREADS`` overrides it;
* calls from several Python threads at once (through ctypes, which releases the GIL, while MindSpore
  runs our ops on the main thread) all give correct results: one call owns the pool, the others run
  on their own thread;
* a forked child (also one forked while another thread was inside a kernel) gets a fresh pool and
  its kernels work.

Nothing here is timed (tools/bench_cpu.py --sections threads measures the pool against MindSpore).
The concurrency and fork checks run in subprocesses with a timeout, so a deadlock fails the test
instead of hanging the run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from bitsandbytes_ms import cextension
from bitsandbytes_ms import functional as F

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(ROOT / "tools")
LIB = str(cextension.LIBRARY_PATH)


@pytest.fixture
def threads():
    """set_num_threads for the test, the default restored afterwards."""
    yield cextension.set_num_threads
    cextension.set_num_threads(0)


def _np(x):
    if isinstance(x, (tuple, list)):
        return [a for t in x for a in _np(t)]
    if isinstance(x, F.QuantState):
        return _np(x.absmax)
    if x is None:
        return []
    return [x.asnumpy()]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).tobytes(), a.shape, str(a.dtype)


def _cases():
    rng = np.random.RandomState(0)
    W = (rng.randn(2048, 4096) * 0.02).astype(np.float32)
    A1, A3 = rng.randn(1, 4096).astype(np.float32), rng.randn(3, 4096).astype(np.float32)
    Wt = ms.Tensor(W)
    q4, s4 = F.quantize_4bit(Wt, blocksize=64, quant_type="nf4")
    X = rng.randn(64, 4096).astype(np.float32)
    X[:, [5, 700, 4000]] *= 40.0  # outlier columns
    I8a = rng.randint(-127, 128, (16, 4096)).astype(np.int8)
    I8b = rng.randint(-127, 128, (1024, 4096)).astype(np.int8)
    acc = rng.randint(-(1 << 20), 1 << 20, (64, 1024)).astype(np.int32)
    rs, cs = (rng.rand(64).astype(np.float32) + 0.5) * 3, (rng.rand(1024).astype(np.float32) + 0.5) * 3
    qw, sw = F.quantize_weight_only(Wt, bits=4)
    big = rng.randn(1 << 20).astype(np.float32)

    def optim():
        n = 1 << 19
        r = np.random.RandomState(1)
        p = ms.Tensor(r.randn(n).astype(np.float32))
        s1, s2 = ms.Tensor(np.zeros(n, np.uint8)), ms.Tensor(np.zeros(n, np.uint8))
        a1, a2 = ms.Tensor(np.zeros(n // 256, np.float32)), ms.Tensor(np.zeros(n // 256, np.float32))
        q1, q2 = F.create_dynamic_map(True), F.create_dynamic_map(False)
        for s in (1, 2):
            g = ms.Tensor(r.randn(n).astype(np.float32))
            F.optimizer_update_8bit_blockwise("adam", g, p, s1, s2, 0.9, 0.999, 0, 0, 1e-8, s, 1e-3, q1, q2, a1, a2,
                                              0.01)
        return p, s1, s2, a1, a2

    def adam32():
        n = 1 << 20
        r = np.random.RandomState(2)
        p, g = ms.Tensor(r.randn(n).astype(np.float32)), ms.Tensor(r.randn(n).astype(np.float32))
        m, v = ms.Tensor(np.zeros(n, np.float32)), ms.Tensor(np.zeros(n, np.float32))
        F.optimizer_update_32bit("adam", g, p, m, 0.9, 1e-8, 1, 1e-3, state2=v, beta2=0.999)
        return p, m, v

    return {
        "quantize_blockwise": lambda: F.quantize_blockwise(ms.Tensor(big), blocksize=256),
        "dequantize_blockwise": lambda: F.dequantize_blockwise(*F.quantize_blockwise(ms.Tensor(big), blocksize=4096)),
        "quantize_4bit": lambda: F.quantize_4bit(Wt, blocksize=64, quant_type="fp4"),
        "dequantize_4bit": lambda: F.dequantize_4bit(q4, s4),
        "gemv_4bit_m1": lambda: F.gemv_4bit(ms.Tensor(A1), q4, state=s4),
        "gemv_4bit_m3_bf16": lambda: F.gemv_4bit(ms.Tensor(A3).astype(ms.bfloat16), q4, state=s4),
        "int8_vectorwise_quant": lambda: F.int8_vectorwise_quant(ms.Tensor(X), threshold=6.0),
        "int8_linear_matmul": lambda: F.int8_linear_matmul(ms.Tensor(I8a), ms.Tensor(I8b)),
        "int8_mm_dequant": lambda: F.int8_mm_dequant(ms.Tensor(acc), ms.Tensor(rs), ms.Tensor(cs)),
        "gemm_weight_only": lambda: F.gemm_weight_only(ms.Tensor(A3), qw, sw, bits=4),
        "optimizer_8bit_blockwise": optim,
        "optimizer_32bit": adam32,
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_same_bytes_for_any_thread_count(name, threads):
    outs = {}
    for n in (1, 2, 3, 5):
        assert threads(n) == n
        outs[n] = [_bits(a) for a in _np(CASES[name]())]
    for n in (2, 3, 5):
        assert len(outs[n]) == len(outs[1])
        for i, (a, b) in enumerate(zip(outs[n], outs[1])):
            assert a == b, f"{name}: output {i} differs between 1 and {n} threads"
    # the parallel calls really ran on the pool
    assert cextension._dll.bnb_ms_pool_workers() >= 4


def test_default_thread_count(threads):
    threads(0)
    n = cextension.get_num_threads()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    assert threads(3) == 3 == cextension.get_num_threads()
    assert threads(-1) == n


_PROBE = r"""
import ctypes, json, os, sys
if len(sys.argv) > 2:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
lib = ctypes.CDLL(sys.argv[1])
print(json.dumps({"threads": lib.bnb_ms_get_num_threads(), "workers": lib.bnb_ms_pool_workers()}))
"""


def test_affinity_and_env_override():
    def probe(env, *extra):
        r = subprocess.run([sys.executable, "-c", _PROBE, LIB, *extra], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    env = {k: v for k, v in os.environ.items() if k != "BNB_MS_NUM_THREADS"}
    res = probe(env, "pin-to-one-cpu")
    assert res == {"threads": 1, "workers": 0}  # the pool is created lazily
    assert probe(dict(env, BNB_MS_NUM_THREADS="3"))["threads"] == 3
    assert probe(dict(env, BNB_MS_NUM_THREADS="junk"))["threads"] == probe(env)["threads"]


# ---------------------------------------------------------------------------------------------
# several threads at once; fork
# ---------------------------------------------------------------------------------------------
_COMMON = r"""
import json, os, sys, threading
import numpy as np
sys.path.insert(0, sys.argv[2])
from aot_ctypes import Aot, scalar
lib = Aot(sys.argv[1])
rng = np.random.RandomState(0)
CODE = np.linspace(-1, 1, 256).astype(np.float32)
NF4 = np.array([-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1848449, -0.0910500, 0.0,
                0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0], np.float32)
X = rng.randn(1 << 19).astype(np.float32)
Q4 = rng.randint(0, 256, 2048 * 4096 // 2).astype(np.uint8)
AM = (rng.rand(2048 * 4096 // 64).astype(np.float32) + 0.1)
V = rng.randn(2, 4096).astype(np.float32)
IA = rng.randint(-127, 128, (8, 2048)).astype(np.int8)
IB = rng.randint(-127, 128, (600, 2048)).astype(np.int8)

def quant():
    out, am = np.empty(X.size, np.uint8), np.empty(X.size // 256, np.float32)
    assert lib("cquantize_blockwise_fp32", [CODE, X, scalar(256), out, am]) == 0
    return out.tobytes() + am.tobytes()

def gemv():
    out = np.empty((2, 2048), np.float32)
    assert lib("cgemm_4bit_inference_naive_fp32", [V, Q4, AM, NF4, scalar(64), scalar(2048), out]) == 0
    return out.tobytes()

def igemm():
    out = np.empty((8, 600), np.int32)
    assert lib("cigemmlt_32", [IA, IB, out]) == 0
    return out.tobytes()

KERNELS = {"quant": quant, "gemv": gemv, "igemm": igemm}
def expected():
    lib.dll.bnb_ms_set_num_threads(1)
    ref = {k: f() for k, f in KERNELS.items()}
    lib.dll.bnb_ms_set_num_threads(0)
    return ref
"""

_CONCURRENT = _COMMON + r"""
ref = expected()
errors = []
def worker(i):
    try:
        names = list(KERNELS)
        for it in range(12):
            k = names[(i + it) % len(names)]
            if KERNELS[k]() != ref[k]:
                errors.append(f"thread {i} iteration {it}: {k} wrong")
    except BaseException as e:  # noqa: BLE001
        errors.append(f"thread {i}: {e!r}")

lib.dll.bnb_ms_set_num_threads(int(sys.argv[3]))
ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in ts: t.start()
# meanwhile MindSpore runs our ops on this thread (its own launch path), through the same library
import mindspore as ms
ms.set_device("CPU"); ms.runtime.launch_blocking()
from bitsandbytes_ms import functional as F
W = ms.Tensor((np.random.RandomState(3).randn(1024, 2048) * 0.02).astype(np.float32))
q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
A = ms.Tensor(np.random.RandomState(4).randn(1, 2048).astype(np.float32))
ms_ref = F.gemv_4bit(A, q, state=st).asnumpy()
for _ in range(10):
    if not np.array_equal(F.gemv_4bit(A, q, state=st).asnumpy(), ms_ref):
        errors.append("MindSpore-launched gemv_4bit wrong")
for t in ts: t.join()
print(json.dumps({"errors": errors[:10], "workers": lib.dll.bnb_ms_pool_workers()}))
"""


@pytest.mark.parametrize("nthreads", [0, 3])
def test_concurrent_calls_from_several_threads(nthreads):
    r = subprocess.run([sys.executable, "-c", _CONCURRENT, LIB, TOOLS, str(nthreads)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["errors"] == []


_FORK = _COMMON + r"""
import signal
ref = expected()
assert quant() == ref["quant"]  # the parent's pool exists
parent_workers = lib.dll.bnb_ms_pool_workers()
busy = threading.Event(); stop = threading.Event()
def spin():  # keeps the parent's pool busy while it forks
    while not stop.is_set():
        busy.set(); gemv()
t = threading.Thread(target=spin); t.start(); busy.wait()
results = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        signal.alarm(120)  # a deadlocked child dies instead of hanging
        ok = lib.dll.bnb_ms_pool_workers() == 0
        ok = ok and all(KERNELS[k]() == ref[k] for k in KERNELS for _ in range(2))
        ok = ok and lib.dll.bnb_ms_pool_workers() == parent_workers
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    results.append(status)
stop.set(); t.join()
assert all(KERNELS[k]() == ref[k] for k in KERNELS)  # the parent's pool still works
print(json.dumps({"statuses": results, "parent_workers": parent_workers}))
"""


def test_forked_child_gets_a_fresh_pool():
    r = subprocess.run([sys.executable, "-c", _FORK, LIB, TOOLS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res["parent_workers"] == 0:
        pytest.skip("a single CPU: the pool never starts")
    assert res["statuses"] == [0, 0, 0]
