"""What the per-feature CUDA checks (tools/gpu/test_*.py) and the benchmark (tools/gpu/bench.py) share: the
libraries (tools/aot_ctypes.py over ctypes, with MindSpore's AOT convention), scalars in host or device memory,
bit comparisons, the test inputs and codes, upstream bitsandbytes when it is importable, and CUDA-event timing.

No MindSpore needed: torch + numpy + ctypes.  Library paths: $BNB_MS_CUDA_LIB / $BNB_MS_CPU_LIB (defaults: the
package directory); $BNB_MS_GPU_QUICK=1 trims the largest check sizes.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from aot_ctypes import Aot  # noqa: E402  (accepts torch tensors, host or device, duck-typed)

TDT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SFX = {v: k for k, v in TDT.items()}
SDT = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.uint8: "uint8",
       torch.int64: "int64", torch.int32: "int32", torch.int8: "int8", torch.float64: "float64", torch.bool: "bool"}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.uint8: torch.uint8,
        torch.int8: torch.int8, torch.int32: torch.int32}
QUICK = os.environ.get("BNB_MS_GPU_QUICK", "") not in ("", "0")


# ---- the libraries ---------------------------------------------------------------------------------
def lib_paths() -> tuple[str, str]:
    pkg = ROOT / "bitsandbytes_ms"
    return (os.environ.get("BNB_MS_CUDA_LIB", str(pkg / "libbitsandbytes_ms_cuda.so")),
            os.environ.get("BNB_MS_CPU_LIB", str(pkg / "libbitsandbytes_ms_cpu.so")))


def unavailable() -> str | None:
    """Why the CUDA checks cannot run here (None when they can)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    for p in lib_paths():
        if not Path(p).exists():
            return f"{p} not built"
    return None


_LIBS: dict[str, Aot] = {}


def libs() -> tuple[Aot, Aot]:
    cu, cp = lib_paths()
    for p in (cu, cp):
        if p not in _LIBS:
            _LIBS[p] = Aot(p)
    return _LIBS[cu], _LIBS[cp]


def card() -> str:
    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
            f"CUDA {torch.version.cuda}, torch {torch.__version__}")


def upstream():
    """(torch.ops.bitsandbytes, bitsandbytes.functional, description) of upstream bitsandbytes, or Nones."""
    try:
        import bitsandbytes
        import bitsandbytes.functional as UF

        return torch.ops.bitsandbytes, UF, f"bitsandbytes {bitsandbytes.__version__}"
    except Exception as e:  # noqa: BLE001 -- any import failure means: no baseline
        return None, None, f"upstream unavailable ({type(e).__name__}: {e})"


# ---- results -----------------------------------------------------------------------------------------
# Each check appends its failures to FAILURES (and prints them) and returns one summary line per feature;
# the test functions assert that they added no failure, the runner collects the lines for benchmarks/gpu.md.
FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print("FAIL:", msg, flush=True)


def checked(lines: list[str], n_before: int) -> list[str]:
    """Prints the summary lines and fails the calling test if any failure was recorded since n_before."""
    for line in lines:
        print(line, flush=True)
    new = FAILURES[n_before:]
    assert not new, f"{len(new)} failures, first: " + "; ".join(new[:5])
    return lines


# ---- calls -----------------------------------------------------------------------------------------
def stream_ptr() -> int:
    return torch.cuda.current_stream().cuda_stream


def dscalar(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64, device="cuda")


def hscalar(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    a, b = a.cpu().reshape(-1), b.cpu().reshape(-1)
    ab, bb = a.view(BITS[a.dtype]), b.view(BITS[b.dtype])
    idx = (ab != bb).nonzero().reshape(-1)
    i = int(idx[0]) if idx.numel() else -1
    return f"{idx.numel()} of {a.numel()} differ; first at {i}: {a[i].item() if i >= 0 else ''} vs {b[i].item() if i >= 0 else ''}"


def fsc(v, dev):
    return torch.tensor(float(v), dtype=torch.float64, device=dev)


def isc(v, dev):
    return torch.tensor(int(v), dtype=torch.int64, device=dev)


def f32sc(v, dev):
    return torch.tensor(float(v), dtype=torch.float32, device=dev)


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.cpu().reshape(-1), b.cpu().reshape(-1)
    if a.dtype == torch.float32:
        ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
    else:
        ia, ib = a.view(torch.int16).long(), b.view(torch.int16).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF if a.dtype == torch.float32 else ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF if b.dtype == torch.float32 else ib & 0x7FFF), ib)
    return int((ia - ib).abs().max()) if ia.numel() else 0


def misaligned(t: torch.Tensor, elems: int = 1) -> torch.Tensor:
    """Same values at an address `elems` elements past a fresh allocation (breaks 4/16-byte alignment)."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    v = buf[elems:].view(t.shape)
    v.copy_(t)
    return v


# ---- codes and inputs ------------------------------------------------------------------------------
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
FP4 = [0.0, 0.0052083333, 0.6666667, 1.0, 0.3333333, 0.5, 0.1666667, 0.25,
       0.0, -0.0052083333, -0.6666667, -1.0, -0.3333333, -0.5, -0.1666667, -0.25]


def load_reference():
    p = ROOT / "bitsandbytes_ms" / "_reference.py"
    if not p.exists():
        return None
    spec = importlib.util.spec_from_file_location("bnb_ms_reference", p)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # e.g. ml_dtypes missing
        print("reference not loadable:", e)
        return None
    return mod


def dynamic_code() -> torch.Tensor:
    try:
        import bitsandbytes.functional as F  # upstream's own map, if the wheel is importable
        return F.create_dynamic_map(signed=True).float().cpu()
    except Exception:
        ref = load_reference()
        if ref is not None and hasattr(ref, "create_dynamic_map"):
            return torch.from_numpy(np.asarray(ref.create_dynamic_map(True), dtype=np.float32))
        return torch.linspace(-1, 1, 256)


def unsigned_dynamic_code() -> torch.Tensor:
    try:
        import bitsandbytes.functional as F
        return F.create_dynamic_map(signed=False).float().cpu()
    except Exception:
        return torch.linspace(0, 1, 256)


def code4(qt: str) -> torch.Tensor:
    try:
        import bitsandbytes.functional as F
        return F.get_4bit_type(qt, device="cpu").float().contiguous()
    except Exception:
        return torch.tensor(NF4 if qt == "nf4" else FP4, dtype=torch.float32)


def codes8() -> dict[str, torch.Tensor]:
    """The 256-entry codes of the blockwise checks: the dynamic map, linear, unsorted, with duplicates."""
    g = torch.Generator().manual_seed(7)
    unsorted = torch.rand(256, generator=g) * 2 - 1
    dup = torch.linspace(-1, 1, 256)
    dup[100:110] = dup[100]
    return {"dynamic": dynamic_code(), "linear": torch.linspace(-1, 1, 256), "unsorted": unsorted, "dup": dup}


def make_input(n: int, dt: torch.dtype, bs: int, seed: int, special: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(1, generator=g) * 2)
    if n > 4 * bs:  # an all-zero block, a -0.0 block and an outlier
        x[bs:2 * bs] = 0.0
        x[2 * bs:3 * bs] = -0.0
        x[3 * bs + 1] = 1e4
    if n > 6 * bs and dt == torch.float32:  # a block of subnormals and zeros (absmax < 2^-128: the scaled lookup)
        x[5 * bs:6 * bs] = torch.randn(bs, generator=g) * 1e-39
        x[5 * bs + 2] = 0.0
    if dt == torch.float32 and n > 10:
        x[5:9] = torch.tensor([1e-40, -3e-39, 1e-45, 0.0])  # subnormals
    if special and n > 40:
        x[17] = float("nan")
        x[23] = float("inf")
        x[min(n - 1, bs + 3)] = float("-inf")
    return x.to(dt)


# ---- timing ----------------------------------------------------------------------------------------
def time_gpu(fn, reps: int = 25) -> float:
    """Median milliseconds of fn() on the current stream; a sleep kernel keeps the queue busy so the
    host's launch time is not counted."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(200_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def time_rot(fns, reps: int = 25) -> float:
    """Median ms per call cycling through fns (different buffers, so the data are not L2-resident)."""
    k = [0]

    def one():
        fns[k[0] % len(fns)]()
        k[0] += 1
    return time_gpu(one, reps)


def copy_bandwidth() -> float:
    """GB/s (bytes read + written) of a 1 GiB device-to-device copy_."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / time_gpu(lambda: dst.copy_(src), 10) / 1e6


def statuses_match(cuda: Aot, cpu: Aot, cases_for, label: str) -> tuple[int, int]:
    """Malformed calls: cases_for(dev, scalar) -> {case: (entry point, args)} built on each device (scalar makes
    an int64 0-d tensor there) and run through both libraries.  A case passes when the CUDA library returns the
    CPU library's status and that status is nonzero; a CUDA error left behind raises at the synchronize.
    Returns (passed, total)."""
    st = stream_ptr()
    results = {}
    for dev, lib, sc in (("cuda", cuda, dscalar), ("cpu", cpu, hscalar)):
        results[dev] = {k: lib(name, args, st if dev == "cuda" else None) for k, (name, args) in cases_for(dev, sc).items()}
        if dev == "cuda":
            torch.cuda.synchronize()
    ok = 0
    for k, rc in results["cpu"].items():
        if results["cuda"][k] != rc or rc == 0:
            fail(f"malformed ({label}) {k}: cuda={results['cuda'][k]} cpu={rc}")
        else:
            ok += 1
    torch.cuda.synchronize()
    return ok, len(results["cpu"])
