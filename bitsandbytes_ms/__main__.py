"""``python -m bitsandbytes_ms`` / ``bnb-ms``: diagnostics and the command-line jobs.

    bnb-ms                 diagnostics (versions, backend, library, CPU features, kernel path)
    bnb-ms diagnostics     the same
    bnb-ms demo            diagnostics + a blockwise 8-bit quantize/dequantize round trip
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import platform
import sys
import time


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def diagnostics() -> int:
    import mindspore as ms

    import bitsandbytes_ms as bnb
    from bitsandbytes_ms import cextension

    print("bitsandbytes_ms diagnostics")
    print(f"  bitsandbytes_ms   {bnb.__version__} (follows bitsandbytes {bnb.__upstream_version__})")
    print(f"  python            {platform.python_version()} ({sys.executable})")
    for dist in ("mindspore", "mindnlp", "numpy"):
        print(f"  {dist:<17} {_version(dist)}")
    print(f"  device target     {ms.get_context('device_target')}")
    print(f"  backend           {cextension.BNB_BACKEND}")
    print(f"  native library    {cextension.LIBRARY_PATH}")
    feats = cextension.cpu_features()
    print(f"  CPU features      {' '.join(feats) if feats else '(none beyond baseline x86-64)'}")
    print(f"  CPU kernel path   {cextension.simd_level()}  (BNB_MS_SIMD=scalar|avx2|avx512 lowers it)")
    print(f"  native ops        {len(cextension._ops.OPS)} entry points in the op table")
    return 0


def demo() -> int:
    """Diagnostics, then a blockwise 8-bit round trip on a real weight matrix."""
    import numpy as np
    import mindspore as ms

    from bitsandbytes_ms import functional as F

    diagnostics()
    print()
    weight, source = _demo_tensor()
    A = ms.Tensor(weight)
    print(f"round trip: quantize_blockwise / dequantize_blockwise on {source} {tuple(weight.shape)} float32")
    for bs in (64, 256, 4096):
        t0 = time.perf_counter()
        q, state = F.quantize_blockwise(A, blocksize=bs)
        t1 = time.perf_counter()
        back = F.dequantize_blockwise(q, state)
        t2 = time.perf_counter()
        err = np.abs(back.asnumpy() - weight)
        rel = err.mean() / np.abs(weight).mean()
        stored = q.nbytes + state.absmax.nbytes
        print(f"  blocksize {bs:>5}: mean abs err {err.mean():.3e}, max {err.max():.3e}, rel {rel:.4f}; "
              f"{weight.nbytes / 2**20:.1f} MiB -> {stored / 2**20:.2f} MiB; "
              f"quantize {1e3 * (t1 - t0):.1f} ms, dequantize {1e3 * (t2 - t1):.1f} ms")
    return 0


def _demo_tensor():
    """The largest weight of the embedded model if it is there, else a seeded N(0, 0.02) matrix."""
    import numpy as np
    from pathlib import Path

    path = Path(__file__).resolve().parent / "default_model" / "model.safetensors"
    if path.exists():
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
        name = max((k for k, v in tensors.items() if v.ndim == 2), key=lambda k: tensors[k].size)
        return tensors[name].astype(np.float32), f"embedded model weight '{name}'"
    rng = np.random.RandomState(0)
    return (rng.randn(1024, 1024) * 0.02).astype(np.float32), "seeded N(0, 0.02) matrix"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bnb-ms", description="bitsandbytes_ms command line")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("diagnostics", help="print versions, backend, library and CPU kernel path")
    sub.add_parser("demo", help="diagnostics + a blockwise 8-bit quantize/dequantize round trip")
    args = parser.parse_args(argv)

    import mindspore as ms

    ms.set_device("CPU") if ms.get_context("device_target") != "GPU" else None
    ms.runtime.launch_blocking()
    if args.cmd in (None, "diagnostics"):
        return diagnostics()
    if args.cmd == "demo":
        return demo()
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
