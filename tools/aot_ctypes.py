"""Calling the native libraries' entry points through ctypes with MindSpore's AOT convention, without
MindSpore or torch (numpy only; torch tensors are accepted too, duck-typed, so the CUDA checks in tools/gpu/ use
this class as well).

Every entry point is ``int f(int nparam, void **params, int *ndims, int64_t **shapes, const char
**dtypes, void *stream, void *extra)`` (csrc/aot.h): the inputs, then the outputs, in the order of the
op table (bitsandbytes_ms/_native_table.py); a Python scalar is a 0-d array; ``None`` is a null pointer with
dtype "none".

    lib = Aot("bitsandbytes_ms/libbitsandbytes_ms_cpu.so")
    out = np.empty((M, N), np.int32)
    rc = lib("cigemmlt_32", [A, B, out])          # 0 on success, a bnb_ms::E_* code otherwise
    call = lib.prepare("cigemmlt_32", [A, B, out])  # bind once, call many times (timing)

bfloat16 arrays: an ``ml_dtypes.bfloat16`` array, or ``Typed(uint16_array, "bfloat16")`` where
ml_dtypes is not installed.
"""
from __future__ import annotations

import ctypes as ct

import numpy as np


class Typed:
    """A numpy array passed with an explicit dtype name (e.g. uint16 bits as "bfloat16")."""

    def __init__(self, array: np.ndarray, dtype: str):
        self.array = np.ascontiguousarray(array)
        self.dtype = dtype


def scalar(v, dtype=None) -> np.ndarray:
    """A 0-d array as MindSpore passes a Python scalar: int -> int64, float -> float32, bool -> bool."""
    if dtype is None:
        dtype = np.bool_ if isinstance(v, bool) else np.int64 if isinstance(v, int) else np.float32
    return np.array(v, dtype=dtype)


def describe(a):
    """(pointer, shape, dtype name) of one AOT argument."""
    if a is None:
        return (None, (), "none")
    if isinstance(a, tuple):
        return a
    if isinstance(a, Typed):
        return (a.array.ctypes.data, tuple(a.array.shape), a.dtype)
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise ValueError("AOT arguments must be C-contiguous")
        return (a.ctypes.data, tuple(a.shape), a.dtype.name)
    if hasattr(a, "data_ptr"):  # a torch tensor (duck-typed: this module never imports torch)
        return (a.data_ptr(), tuple(a.shape), str(a.dtype).replace("torch.", ""))
    raise TypeError(f"unsupported AOT argument {type(a).__name__}")


class Aot:
    """One native library; ``prepare(name, args, stream)`` binds the AOT arrays once and returns a
    zero-argument callable returning the status. ``args``: numpy arrays (or torch tensors, host or
    device), ``None`` (null, dtype "none"), :class:`Typed`, or ``(ptr, shape, dtype_str)`` tuples for
    hand-made malformed calls."""

    ARGTYPES = [ct.c_int, ct.POINTER(ct.c_void_p), ct.POINTER(ct.c_int), ct.POINTER(ct.POINTER(ct.c_int64)),
                ct.POINTER(ct.c_char_p), ct.c_void_p, ct.c_void_p]

    def __init__(self, path: str):
        self.path = path
        self.dll = ct.CDLL(path)

    def has(self, name: str) -> bool:
        return hasattr(self.dll, name)

    def prepare(self, name: str, args, stream: int | None = None):
        fn = getattr(self.dll, name)
        fn.restype, fn.argtypes = ct.c_int, self.ARGTYPES
        items = [describe(a) for a in args]
        n = len(items)
        params = (ct.c_void_p * n)(*[p for p, _, _ in items])
        ndims = (ct.c_int * n)(*[len(s) for _, s, _ in items])
        keep = [(ct.c_int64 * max(1, len(s)))(*s) for _, s, _ in items]
        shapes = (ct.POINTER(ct.c_int64) * n)(*[ct.cast(k, ct.POINTER(ct.c_int64)) for k in keep])
        dtypes = (ct.c_char_p * n)(*[d.encode() for _, _, d in items])
        st = ct.c_void_p(stream)
        ref = (args, keep, params, ndims, shapes, dtypes)  # keep everything alive

        def call() -> int:
            _ = ref
            return fn(n, params, ndims, shapes, dtypes, st, None)

        return call

    def __call__(self, name, args, stream=None) -> int:
        return self.prepare(name, args, stream)()

    # ---- diagnostics exports (plain C functions) ----
    def simd_level(self) -> str:
        if not self.has("bnb_ms_simd_level"):
            return "?"
        return {0: "scalar", 1: "avx2", 2: "avx512"}.get(self.dll.bnb_ms_simd_level(), "?")

    def int8_gemm_path(self, rows: int | None = None) -> str:
        """The int8 GEMM path the library uses (for ``rows`` rows of A when given)."""
        if rows is not None and self.has("bnb_ms_int8_gemm_path_for_rows"):
            f = self.dll.bnb_ms_int8_gemm_path_for_rows
            f.restype, f.argtypes = ct.c_char_p, [ct.c_int64]
            return f(rows).decode()
        if not self.has("bnb_ms_int8_gemm_path"):
            return "?"
        f = self.dll.bnb_ms_int8_gemm_path
        f.restype = ct.c_char_p
        return f().decode()
