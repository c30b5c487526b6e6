"""The op layer: every operation declared once by meaning, with one implementation per backend.

This is upstream bitsandbytes' design (>= 0.46, ``bitsandbytes/_ops.py`` + ``backends/*/ops.py``): an op has a
name, its arguments and what it returns (upstream's schema where upstream has the op); each backend registers a
kernel for it; :mod:`bitsandbytes_ms.functional` validates arguments and calls the op, never a C symbol.

Backends (``bitsandbytes_ms/backends/``):

* ``"cpu"`` / ``"cuda"`` -- the native library (:mod:`bitsandbytes_ms.backends.native`): its C entry points are
  the rows of :mod:`bitsandbytes_ms._native_table` (the C ABI table, one name per dtype), run through
  ``ops.Custom`` or, on the CPU inference path, as host calls (:mod:`bitsandbytes_ms._hostcall`). The CPU and
  the CUDA library share entry-point names and argument order, so one set of kernels serves both.
* ``"reference"`` -- numpy (:mod:`bitsandbytes_ms.backends.reference` over :mod:`bitsandbytes_ms._reference`,
  the executable spec): the same bytes as the native kernels, slowly. It runs every op when the native library
  did not load (``cextension.LIBRARY_ERROR``; one warning at import), as upstream's pure-torch ``default``
  backend does.

``op(*args)`` runs the active backend's kernel (:func:`backend`) and gives every tensor it returns mindtorch's
device tag: this call's return is the one place where results are tagged (:func:`tag`). ``op.kernel(name)`` is
one backend's kernel itself (tests compare backends with it). MindSpore has no torch op registry;
:mod:`bitsandbytes_ms.torch_ops` installs these ops as ``torch.ops.bitsandbytes.<op>`` under
:func:`bitsandbytes_ms.register`.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from . import cextension
from ._device_tag import tag  # noqa: F401  (re-exported: `from bitsandbytes_ms._ops import tag`)

#: The optimizers of optimizer_update_32bit / optimizer_update_8bit_blockwise (LAMB and LARS are the adam and
#: momentum rules with a trust ratio: their callers pass max_unorm).
OPTIMIZERS = ("adam", "ademamix", "lion", "momentum", "rmsprop", "adagrad")

#: The backends kernels can be registered for.
BACKENDS = ("cpu", "cuda", "reference")


def backend() -> str:
    """The backend ops run on: the native library's (``"cpu"`` or ``"cuda"``) when it loaded, else ``"reference"``."""
    return _active


_active = "reference" if cextension.LIBRARY_ERROR is not None else cextension.BNB_BACKEND.lower()


class Op:
    """One operation: ``name``, ``signature`` (upstream's schema where upstream has the op, else ours, same
    notation), ``returns`` (the result's shapes and dtypes in words) and its kernels per backend."""

    def __init__(self, name: str, signature: str, returns: str, upstream: bool = True, doc: str = ""):
        self.name, self.signature, self.returns, self.upstream = name, signature, returns, upstream
        self.kernels: Dict[str, Callable] = {}
        self._fn: Optional[Callable] = None
        self.__doc__ = f"{name}{signature}: {returns}" + (f". {doc}" if doc else "")

    def register(self, *backends: str):
        """Decorator: registers the decorated function as this op's kernel for ``backends``."""
        for b in backends:
            if b not in BACKENDS:
                raise ValueError(f"op {self.name}: unknown backend {b!r}; one of {BACKENDS}")

        def deco(fn):
            for b in backends:
                if b in self.kernels:
                    raise ValueError(f"op {self.name}: a {b} kernel is registered twice")
                self.kernels[b] = fn
            self._fn = None
            return fn
        return deco

    def kernel(self, name: Optional[str] = None) -> Callable:
        """The kernel of backend ``name`` (default: the active backend)."""
        name = name or _active
        fn = self.kernels.get(name)
        if fn is None:
            raise NotImplementedError(f"op {self.name} has no {name} kernel (registered: {sorted(self.kernels)})"
                                      + (f"; the native library did not load: {cextension.LIBRARY_ERROR}"
                                         if name == "reference" and cextension.LIBRARY_ERROR else ""))
        return fn

    def __call__(self, *args, **kwargs):
        fn = self._fn
        if fn is None:
            fn = self._fn = self.kernel()
        return tag(fn(*args, **kwargs), args)

    def __repr__(self):
        return f"<op bitsandbytes_ms._ops.{self.name}{self.signature}>"


#: Every op, by name.
OPS: Dict[str, Op] = {}


def define(name: str, signature: str, returns: str, upstream: bool = True, doc: str = "") -> Op:
    if name in OPS:
        raise ValueError(f"op {name!r} is declared twice")
    op = OPS[name] = Op(name, signature, returns, upstream, doc)
    return op


# ---- blockwise 8-bit ----
quantize_blockwise = define(
    "quantize_blockwise", "(Tensor A, Tensor code, int blocksize) -> (Tensor, Tensor)",
    "(uint8 codes shaped like A, float32 absmax [ceil(numel/blocksize)])")
dequantize_blockwise = define(
    "dequantize_blockwise", "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype) -> Tensor",
    "code[A] * absmax[block] in dtype, shaped like A")

# ---- 4-bit ----
quantize_4bit = define(
    "quantize_4bit", "(Tensor A, int blocksize, str quant_type, ScalarType quant_storage) -> (Tensor, Tensor)",
    "(packed codes as quant_storage [(numel+1)//2 / itemsize, 1], float32 absmax [ceil(numel/blocksize)])")
dequantize_4bit = define(
    "dequantize_4bit", "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype) "
    "-> Tensor", "code[nibble] * absmax[block] (fp32, rounded to dtype), shaped `shape`",
    doc="absmax float32 (a double-quantized absmax is decoded by the caller)")
gemv_4bit = define(
    "gemv_4bit", "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize) -> Tensor",
    "A[..., K] @ W[N, K].T in A's dtype, [..., N] (W packed in B, decoded in registers)")
linear_4bit = define(
    "linear_4bit", "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize, Tensor? bias, "
    "Tensor? absmax2, Tensor? code2, Tensor? offset, int blocksize2=256, bool bf16_dot=False) -> Tensor",
    "A[..., K] @ W[N, K].T (+ bias) in A's dtype, [..., N]", upstream=False,
    doc="the 4-bit linear forward in one call (upstream's gemm_4bit): absmax float32, or uint8 double-quant "
        "codes decoded as code2[q] * absmax2[b // blocksize2] + offset; bf16_dot: bf16 A as a bf16 dot product")

# ---- int8 (LLM.int8()) ----
int8_vectorwise_quant = define(
    "int8_vectorwise_quant", "(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor)",
    "(int8 codes shaped like A, float32 row_stats [rows], uint8 outlier-column flags [K])",
    doc="upstream returns the outlier column indices; the flags are what the kernel writes (functional turns "
        "them into indices)")
int8_linear_matmul = define(
    "int8_linear_matmul", "(Tensor A, Tensor B) -> Tensor", "A[..., K] @ B[N, K].T, int32 [..., N] (exact)")
int8_mm_dequant = define(
    "int8_mm_dequant", "(Tensor A, Tensor row_stats, Tensor col_stats, ScalarType? dtype=None, Tensor? bias=None) "
    "-> Tensor", "float(A) * row_stats[r] * col_stats[c] / 127^2 (+ bias) rounded once to dtype (float16), "
                 "shaped like A [rows, N]")
int8_mixed_mm_dequant = define(
    "int8_mixed_mm_dequant", "(Tensor C, Tensor row_stats, Tensor col_stats, Tensor? bias, Tensor A, Tensor CB, "
    "Tensor col_flags, ScalarType dtype) -> Tensor",
    "int8_mm_dequant(C) (+ bias) + A[:, J] @ (CB[:, J] * col_stats / 127).T over the flagged columns J, in fp32, "
    "rounded once to dtype, [rows, N]", upstream=False)
int8_linear = define(
    "int8_linear", "(Tensor A, Tensor CB, Tensor SCB, Tensor? bias, float threshold) -> (Tensor, Tensor)",
    "(A @ dequant(CB, SCB).T (+ bias) in A's dtype [..., N], uint8 outlier-column flags [K])", upstream=False,
    doc="the LLM.int8() linear forward in one call")

# ---- optimizers (in place) ----
optimizer_update_32bit = define(
    "optimizer_update_32bit", "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, "
    "Tensor(a3!)? state2, Tensor(a4!)? unorm_vec, float max_unorm, float param_norm, float beta1, float beta2, "
    "float beta3, float alpha, float eps, float weight_decay, int step, float lr, float gnorm_scale, "
    "bool skip_zeros=False) -> ()", "None: p, state1, state2 and unorm_vec updated in place",
    doc="optimizer_name one of adam, ademamix, lion, momentum, rmsprop, adagrad (lamb/lars resolved by the caller)")
optimizer_update_8bit_blockwise = define(
    "optimizer_update_8bit_blockwise", "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, "
    "Tensor(a3!)? state2, float beta1, float beta2, float beta3, float alpha, float eps, int step, float lr, "
    "Tensor(a4!) qmap1, Tensor(a5!)? qmap2, Tensor(a6!) absmax1, Tensor(a7!)? absmax2, float weight_decay, "
    "float gnorm_scale, bool skip_zeros=False) -> ()",
    "None: p, state1, state2, absmax1 and absmax2 updated in place (blocks of 256)")

# ---- weight-only int8/int4, full-precision linear (ours) ----
quantize_weight_only = define(
    "quantize_weight_only", "(Tensor W, int bits) -> (Tensor, Tensor)",
    "(int8 [N, K] or packed uint8 [N, (K+1)//2], float32 scale [N])", upstream=False)
dequantize_weight_only = define(
    "dequantize_weight_only", "(Tensor q, Tensor scale, int K, int bits, ScalarType dtype) -> Tensor",
    "q * scale[n] (fp32, rounded to dtype), [N, K]", upstream=False)
gemm_weight_only = define(
    "gemm_weight_only", "(Tensor A, Tensor q, Tensor scale, int bits) -> Tensor",
    "scale[n] * (A[..., K] @ q[N, K].T) in A's dtype, [..., N]", upstream=False)
gemm_fp = define(
    "gemm_fp", "(Tensor A, Tensor W, Tensor? bias) -> Tensor",
    "A[..., K] @ W[N, K].T (+ bias) in A's dtype, [..., N] (fp32 accumulation in a fixed order)", upstream=False)


# The kernels register themselves from bitsandbytes_ms/backends/ (native, reference), as upstream's
# backends/<device>/ops.py do: importing the package bitsandbytes_ms.backends registers them, and
# bitsandbytes_ms/__init__.py imports it. This module imports no backend (no import circle).
