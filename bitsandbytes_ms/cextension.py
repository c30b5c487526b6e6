"""Loading the native library and exposing its entry points (bitsandbytes' ``cextension``).

``lib`` is built from the op table in :mod:`bitsandbytes_ms._native_table`: ``lib.<name>`` is a callable that
runs ``mindspore.ops.Custom("<library>.so:<name>", out_shape, out_dtype, func_type="aot")``. The
``ops.Custom`` objects are created on first use and cached (one per op and value of its ``static``
scalars), never per call.

Two calling styles are accepted:

* MindSpore style: ``out, absmax = lib.cquantize_blockwise_fp32(code, A, blocksize)`` with the
  table's inputs, returning the table's outputs.
* bitsandbytes style, for ported code: ``lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(A),
  get_ptr(absmax), get_ptr(out), ct.c_int32(blocksize), ct.c_int(n))``. Arguments follow upstream's
  order (``NativeOp.bnb_args``); results are copied into the tensors behind the ``get_ptr`` handles
  of the output arguments, and the call returns 0.

Without the library (missing, unloadable, or older than the package) the module still imports with one
``RuntimeWarning``: ``LIBRARY_ERROR`` says why, the ops of :mod:`bitsandbytes_ms._ops` run on the numpy reference
backend, ``lib`` is an :class:`ErrorHandlerMockBNBNativeLibrary` whose entry points raise
:class:`NativeLibraryError`, and ``python -m bitsandbytes_ms`` reports it.

Errors: a native entry point returns a nonzero status for a malformed call and MindSpore raises
``RuntimeError``; :mod:`bitsandbytes_ms.functional` validates arguments before that can happen.
Kernels that can fail on valid input (declared ``has_error=True``: the int8 GEMM ``cigemmlt_32``, the
optimizers) write an int32 status as their last output (``has_error``: 0, or the failure's status) instead of
failing the call, so nothing waits for the device to learn it. Nothing reads it on a hot path: in the checking
mode (``BNB_MS_CHECK_ERRORS=1`` or :func:`set_check_errors`) every ``lib.<name>`` call of such an op (and every
optimizer host call) reads it and raises ``RuntimeError`` naming the op and the status; :func:`check_status`
reads one where a result must be trusted; upstream-style calls (``get_ptr`` arguments) return it, as upstream's
``cigemmlt_32`` does. :func:`force_error` makes a kernel family report a failure (tests).
"""

from __future__ import annotations

import ctypes as ct
import math
import os
import re
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from . import _device_tag, _native_table

PACKAGE_DIR = Path(__file__).resolve().parent
CPU_LIBRARY_NAME = "libbitsandbytes_ms_cpu.so"
CUDA_LIBRARY_NAME = "libbitsandbytes_ms_cuda.so"
BUILD_COMMAND = "bash tools/setup.sh   (or: pip install --no-build-isolation -e .)"


class NativeLibraryError(ImportError, RuntimeError):
    """The native library is missing or cannot be loaded (an ImportError; also a RuntimeError, what upstream
    raises when a native function is called without its library)."""


def _device_target() -> str:
    try:
        return ms.get_context("device_target")
    except Exception:  # pragma: no cover - very old MindSpore
        return "CPU"


def _library_path() -> Tuple[Path, str]:
    """Returns (path, backend). ``BNB_MS_LIBRARY`` overrides the search."""
    override = os.environ.get("BNB_MS_LIBRARY")
    if override:
        p = Path(override)
        return p, ("CUDA" if "cuda" in p.name else "CPU")
    if _device_target() == "GPU" and (PACKAGE_DIR / CUDA_LIBRARY_NAME).exists():
        return PACKAGE_DIR / CUDA_LIBRARY_NAME, "CUDA"
    return PACKAGE_DIR / CPU_LIBRARY_NAME, "CPU"


def _load() -> Tuple[Path, str, ct.CDLL]:
    path, backend = _library_path()
    if not path.exists():
        raise NativeLibraryError(
            f"bitsandbytes_ms: the native library {path} does not exist. Build it from the repository "
            f"root with: {BUILD_COMMAND}"
        )
    try:
        dll = ct.CDLL(str(path))
    except OSError as e:
        raise NativeLibraryError(
            f"bitsandbytes_ms: the native library {path} failed to load ({e}). Rebuild it from the "
            f"repository root with: {BUILD_COMMAND}"
        ) from e
    missing = [name for name, op in _native_table.OPS.items()
               if not hasattr(dll, name) and not (op.cpu_only and backend != "CPU")]
    if missing:
        raise NativeLibraryError(
            f"bitsandbytes_ms: the native library {path} lacks entry points {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; it is older than the Python package. Rebuild it with: "
            f"{BUILD_COMMAND}"
        )
    return path, backend, dll


try:
    LIBRARY_PATH, BNB_BACKEND, _dll = _load()
    #: Why the native library did not load (None when it did).
    LIBRARY_ERROR: Optional[str] = None
except NativeLibraryError as _e:
    # As upstream on CPU: the package still imports (one warning); the ops then run on the numpy reference backend
    # (bitsandbytes_ms._ops), a direct lib.<name> call raises NativeLibraryError with the reason, and
    # `python -m bitsandbytes_ms` reports it.
    LIBRARY_PATH, BNB_BACKEND = _library_path()
    _dll = None
    LIBRARY_ERROR = str(_e)
    import warnings as _warnings

    _warnings.warn(f"{LIBRARY_ERROR} Until it is built, every op runs on the numpy reference backend (the same "
                   "results, much slower; the fused decoder and the host-call paths are off).",
                   RuntimeWarning, stacklevel=2)


# The kernel-path switches the native library reads from the environment, and the values it knows: any other value
# is ignored there (the library's own choice stays), so it is named here once, at import, instead of passing silently.
ENV_SWITCHES = {
    "BNB_MS_SIMD": ("scalar", "avx2", "avx512", "avx512-novbmi"),
    "BNB_MS_INT8_GEMM": ("scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx"),
    "BNB_MS_4BIT_AMX": ("0", "1"),
}


def check_env_switches(environ=None) -> list:
    """The set switches of :data:`ENV_SWITCHES` whose value the library does not know, as warning texts (also
    warned at import)."""
    environ = os.environ if environ is None else environ
    bad = []
    for name, known in ENV_SWITCHES.items():
        v = environ.get(name)
        if v and v not in known:  # exact values, as the library compares them
            bad.append(f"bitsandbytes_ms: {name}={v!r} is not one of {'|'.join(known)}; ignored (the library's own "
                       f"choice stays)")
    return bad


for _msg in check_env_switches():
    import warnings as _warnings

    _warnings.warn(_msg, RuntimeWarning, stacklevel=2)

# ---------------------------------------------------------------------------------------------
# CPU feature diagnostics (plain C helpers, not MindSpore ops)
# ---------------------------------------------------------------------------------------------
_CPU_FEATURE_BITS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                     "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16", "avx512_vbmi")
_SIMD_LEVELS = ("scalar", "avx2", "avx512")


def cpu_features() -> Tuple[str, ...]:
    """CPU features the native library detected at run time (CPUID + OS support)."""
    if _dll is None or not hasattr(_dll, "bnb_ms_cpu_features"):
        return ()
    _dll.bnb_ms_cpu_features.restype = ct.c_uint32
    bits = _dll.bnb_ms_cpu_features()
    return tuple(name for i, name in enumerate(_CPU_FEATURE_BITS) if bits & (1 << i))


def simd_level() -> str:
    """The SIMD kernel variant the CPU library dispatches to (``BNB_MS_SIMD`` can lower it)."""
    if _dll is None or not hasattr(_dll, "bnb_ms_simd_level"):
        return "n/a"
    return _SIMD_LEVELS[_dll.bnb_ms_simd_level()]


def int8_gemm_path(rows: Optional[int] = None) -> str:
    """The int8 GEMM kernel path of the CPU library (``int8_linear_matmul``): scalar, avx2, avx512, avxvnni,
    avx512vnni or amx. ``BNB_MS_INT8_GEMM=<path>`` forces one the CPU has (for every M); otherwise the
    best within the SIMD level is used, AMX only from 8 rows of A on (``rows`` asks for a given M)."""
    if _dll is None:
        return "n/a"
    if rows is not None and hasattr(_dll, "bnb_ms_int8_gemm_path_for_rows"):
        f = _dll.bnb_ms_int8_gemm_path_for_rows
        f.restype, f.argtypes = ct.c_char_p, [ct.c_int64]
        return f(int(rows)).decode()
    if not hasattr(_dll, "bnb_ms_int8_gemm_path"):
        return "n/a"
    _dll.bnb_ms_int8_gemm_path.restype = ct.c_char_p
    return _dll.bnb_ms_int8_gemm_path().decode()


def linear4_bf16_path(rows: int = 16) -> str:
    """The kernel of the 4-bit bf16-compute linear (``bf16_dot``) for ``rows`` rows of input: ``amx`` (AMX-BF16,
    from 16 rows, where the CPU and OS allow it; ``BNB_MS_4BIT_AMX=0`` turns it off), ``avx512bf16`` or
    ``portable``. The last two give the same bits; ``amx`` sums in the tile unit's order, within the same
    documented bound of the exact path."""
    if _dll is None or not hasattr(_dll, "bnb_ms_linear4_bf16dot_path_for_rows"):
        return "n/a"
    f = _dll.bnb_ms_linear4_bf16dot_path_for_rows
    f.restype, f.argtypes = ct.c_char_p, [ct.c_int64]
    return f(int(rows)).decode()


def get_num_threads() -> int:
    """Threads the CPU kernels use (the calling thread included): the CPUs this process may run on
    (``sched_getaffinity``, capped by a cgroup CPU quota), or ``BNB_MS_NUM_THREADS``, or what
    :func:`set_num_threads` set. The library's own pool (no OpenMP): its workers sleep between calls, so
    they do not compete with MindSpore's CPU thread pool."""
    if _dll is None or not hasattr(_dll, "bnb_ms_get_num_threads"):
        return 1
    return int(_dll.bnb_ms_get_num_threads())


def set_num_threads(n: int) -> int:
    """Sets the threads the CPU kernels use (``n <= 0``: back to the default); returns the count in
    effect. Results do not depend on it (every kernel gives the same bytes for any thread count)."""
    if _dll is None or not hasattr(_dll, "bnb_ms_set_num_threads"):
        return 1
    _dll.bnb_ms_set_num_threads.argtypes = [ct.c_int]
    return int(_dll.bnb_ms_set_num_threads(int(n)))


# ---------------------------------------------------------------------------------------------
# get_ptr: handles for bitsandbytes-style calls
# ---------------------------------------------------------------------------------------------
class TensorPointer(ct.c_void_p):
    """What :func:`get_ptr` returns: a ``c_void_p`` (the data address, as upstream) that also keeps
    the tensor, so ``lib.<name>(get_ptr(A), ...)`` can run the MindSpore op on it and write results
    back into output tensors."""

    tensor: Tensor

    def __init__(self, tensor: Tensor):
        super().__init__(None)
        self.tensor = tensor

    @property
    def value(self):  # the address, computed lazily (reading it synchronises the tensor)
        return int(self.tensor.data_ptr())


def get_ptr(A: Optional[Tensor]) -> Optional[TensorPointer]:
    """Returns a pointer handle for ``A`` (``None`` for ``None``), as ``bitsandbytes.functional.get_ptr``."""
    if A is None:
        return None
    return TensorPointer(A)


# ---------------------------------------------------------------------------------------------
# lib: one callable per table row
# ---------------------------------------------------------------------------------------------
def _shape_of(s) -> Tuple[int, ...]:
    return tuple(int(x) for x in s) if s is not None else ()


#: What the entry points' nonzero statuses mean (csrc/aot.h).
STATUS_MEANING = {1: "wrong number of params", 2: "a param has the wrong dtype",
                  3: "a param has the wrong shape or element count", 4: "a scalar param has a value that is not allowed",
                  5: "a required param is missing (null)", 6: "not available on this CPU/GPU",
                  7: "device runtime error", 8: "out of host memory", 100: "not implemented for these arguments"}

# ---- has_error outputs ----------------------------------------------------------------------------------
_CHECK_ERRORS = os.environ.get("BNB_MS_CHECK_ERRORS", "0").strip().lower() not in ("", "0", "false", "no", "off")


def set_check_errors(enabled: bool = True) -> None:
    """Switches the checking mode on or off (default: ``BNB_MS_CHECK_ERRORS``, off): when on, the ``has_error``
    output of every op that has one is read after the op (a host synchronisation) and a failure raises
    ``RuntimeError``; when off nothing reads it."""
    global _CHECK_ERRORS
    _CHECK_ERRORS = bool(enabled)


def check_errors_enabled() -> bool:
    """Whether the checking mode is on (:func:`set_check_errors`)."""
    return _CHECK_ERRORS


def has_error_message(what: str, code: int) -> str:
    return (f"{what}: the native kernel reported has_error {code} "
            f"({STATUS_MEANING.get(int(code), 'unknown status')}) on {BNB_BACKEND}; its outputs are not valid")


def check_host_status(what: str, status: np.ndarray) -> None:
    """The checking mode's check of a host call's has_error buffer (numpy; reading it costs nothing)."""
    if _CHECK_ERRORS and int(status.reshape(-1)[0]) != 0:
        raise RuntimeError(has_error_message(what, int(status.reshape(-1)[0])))


def force_error(family: str, code: int) -> None:
    """Testing hook: every call of the native kernel family ``family`` (``"igemm"``: ``cigemmlt_32``; ``"optim"``:
    the optimizer updates) reports ``code`` in its has_error output without running, until ``force_error(family,
    0)``. Process-wide."""
    if _dll is None or not hasattr(_dll, "bnb_ms_force_error"):
        raise NativeLibraryError(f"force_error needs the native library: {LIBRARY_ERROR or 'no bnb_ms_force_error'}")
    fn = _dll.bnb_ms_force_error
    fn.argtypes, fn.restype = [ct.c_char_p, ct.c_int], ct.c_int
    if fn(family.encode(), int(code)) != 0:
        raise ValueError(f"force_error: `family` must be a short name like 'igemm' or 'optim'; got {family!r}")


def status_error(name: str, status: int, op: Optional[_native_table.NativeOp] = None, args=None) -> RuntimeError:
    """The RuntimeError for entry point ``name`` refusing a call with ``status``: what the status means and, with
    ``op``/``args``, the table row's inputs next to what was passed (shape and dtype of each)."""
    what = STATUS_MEANING.get(int(status), "unknown status")
    msg = f"lib.{name}: native entry point {name} returned status {status} ({what})"
    if op is not None and args is not None:
        def desc(v):
            if isinstance(v, Tensor):
                return f"{v.dtype} {tuple(v.shape)}"
            return "None" if v is None else f"{type(v).__name__} {v!r}"

        given = ", ".join(f"`{n}` {desc(v)}" for n, v in zip(op.inputs, args))
        msg += f"; its inputs must match the table row (bitsandbytes_ms/_native_table.py): {given}"
    return RuntimeError(msg)


class NativeFunction:
    """Callable for one :class:`~bitsandbytes_ms._native_table.NativeOp`."""

    def __init__(self, op: _native_table.NativeOp, path: Path):
        self.op = op
        self._path = path
        self._cache: Dict[Tuple[Any, ...], ops.Custom] = {}
        self.__doc__ = op.doc

    def _custom(self, static: Dict[str, Any]) -> ops.Custom:
        key = tuple(static[k] for k in self.op.static)
        prim = self._cache.get(key)
        if prim is None:
            op = self.op
            names = op.inputs

            def out_shape(*args):
                shapes = {n: _shape_of(a) for n, a in zip(names, args)}
                res = [r[0] for r in op.infer(shapes, {}, static)]
                return res[0] if len(res) == 1 else tuple(res)

            def out_dtype(*args):
                res = [r[1] for r in op.infer(_DummyShapes(), dict(zip(names, args)), static)]
                return res[0] if len(res) == 1 else tuple(res)

            prim = ops.Custom(f"{self._path}:{op.name}", out_shape=out_shape, out_dtype=out_dtype,
                              func_type="aot")
            self._cache[key] = prim
        return prim

    def __call__(self, *args, **kwargs):
        if any(isinstance(a, (TensorPointer, ct._SimpleCData)) for a in (*args, *kwargs.values())):
            return self._call_bnb(*args, **kwargs)
        op = self.op
        values = _bind(op.name, op.inputs, args, kwargs, "inputs")
        for n, v in values.items():  # a numpy array or list would fail inside MindSpore without naming the input
            if not isinstance(v, _INPUT_TYPES):
                raise TypeError(f"lib.{op.name}: input `{n}` must be a Tensor, a Python scalar or None; got "
                                f"{_type_name(v)} (wrap arrays with mindspore.Tensor(...))")
        static = {k: values[k] for k in op.static}
        for k, v in static.items():  # they size the outputs: checked here, not as a failure inside MindSpore
            if isinstance(v, Tensor) and v.ndim == 0 and v.dtype in (ms.int32, ms.int64):
                v = static[k] = int(v.asnumpy())
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise TypeError(f"lib.{op.name}: `{k}` must be a non-negative int (it sizes the outputs); got "
                                f"{type(v).__name__} {v!r}")
        inputs = [values[n] for n in op.inputs]
        if op.name.startswith("cgemm_4bit_inference_naive"):
            _check_gemv_4bit_sizes(op.name, values)
        try:
            op.infer({n: _shape_of(getattr(a, "shape", None)) for n, a in zip(op.inputs, inputs)}, {}, static)
        except (IndexError, KeyError, TypeError, ValueError) as e:
            raise TypeError(f"lib.{op.name}: the inputs do not fit its table row (bitsandbytes_ms/_native_table.py: inputs "
                            f"{op.inputs}); the output shapes cannot be derived from shapes "
                            f"{[_shape_of(getattr(a, 'shape', None)) for a in inputs]} ({type(e).__name__}: {e})") from None
        try:
            out = self._custom(static)(*inputs)
        except RuntimeError as e:  # MindSpore's "Return value from CPU AOT kernel(...)'s function(...) is 3"
            m = _AOT_STATUS.search(str(e))
            if m is None:
                raise
            raise status_error(op.name, int(m.group(1)), op, inputs) from None
        if op.has_error and _CHECK_ERRORS:
            check_status(out[-1] if isinstance(out, (tuple, list)) else out, f"lib.{op.name}")
        # mindtorch's Tensor methods (.float(), .to(), .all()) raise "Tensor must have device" on a tensor without
        # its device tag: the results carry the inputs' device (mindtorch's CPU device once it is imported)
        return _tag_device(out, inputs)

    def _call_bnb(self, *args, **kwargs):
        op = self.op
        if op.bnb_args is None:
            raise TypeError(f"lib.{op.name} has no bitsandbytes-style signature")
        args, kwargs = _drop_stream(op, args, kwargs)
        named = _bind(op.name, op.bnb_args, args, kwargs, "arguments")
        _upstream_4bit_forms(op.name, named)
        for n in op.outputs:  # anything but a get_ptr handle would silently receive nothing
            if n in named and named[n] is not None and not isinstance(named[n], TensorPointer):
                raise TypeError(f"lib.{op.name}: output `{n}` must be get_ptr(tensor) or None; got "
                                f"{_type_name(named[n])}")

        def value(n, a):
            if isinstance(a, TensorPointer):
                return a.tensor
            if isinstance(a, ct._SimpleCData):
                return a.value
            if not isinstance(a, _INPUT_TYPES):
                raise TypeError(f"lib.{op.name}: argument `{n}` must be get_ptr(tensor), a ctypes scalar or None; "
                                f"got {_type_name(a)}")
            return a

        inputs = [value(n, named[n]) for n in op.inputs]
        _check_bnb_sizes(op.name, named)
        self._check_out_buffers_before(named, inputs)
        results = self(*inputs)
        if not isinstance(results, (tuple, list)):
            results = (results,)
        for name, res in zip(op.outputs, results):  # every output buffer checked before any is written
            target = named.get(name)
            if isinstance(target, TensorPointer):
                _check_out_buffer(op.name, name, target.tensor, res)
        for name, res in zip(op.outputs, results):
            target = named.get(name)
            if isinstance(target, TensorPointer):
                res = ops.reshape(res, tuple(target.tensor.shape))
                if hasattr(target.tensor, "_device"):  # mindtorch's copy_ reads the source's device
                    res._device = target.tensor._device
                target.tensor.copy_(res)
        # upstream's cigemmlt_32 returns its has_error (its callers raise on nonzero): so does the same call here
        return int(results[-1].asnumpy().reshape(-1)[0]) if op.has_error else 0

    def _check_out_buffers_before(self, named, inputs) -> None:
        """Checks the output buffers against the table row's output shapes and dtypes before native code runs (a
        short buffer would otherwise fail in MindSpore's reshape with a C++ stack). Inputs the row cannot size are
        left to the call itself, which names them."""
        op = self.op
        values = dict(zip(op.inputs, inputs))
        try:
            static = {k: int(values[k]) for k in op.static}
            shapes = op.infer({n: _shape_of(getattr(a, "shape", None)) for n, a in values.items()}, {}, static)
            dtypes = op.infer(_DummyShapes(), values, static)
        except Exception:  # noqa: BLE001 - reported by the call with the inputs named
            return
        for name, (shape, _), (_, dtype) in zip(op.outputs, shapes, dtypes):
            target = named.get(name)
            if isinstance(target, TensorPointer):
                _check_out_buffer(op.name, name, target.tensor, _Expected(tuple(shape), dtype))


def _bnb_sizes(name: str, named: Dict[str, Any]) -> Dict[str, int]:
    """The size scalars of an upstream-style call (``n``, ``m``/``n``/``k``, ``rows``/``cols``,
    ``numRows``/``numCols``) as the tensors behind its pointers give them."""
    def t(k):
        v = named.get(k)
        return v.tensor if isinstance(v, TensorPointer) else None

    def rows_cols(A):
        cols = int(A.shape[-1]) if A.ndim else 1
        return (math.prod(A.shape) // cols if cols else 0), cols

    A, p = t("A"), t("p")
    fourbit_dequant = name.startswith("cdequantize_blockwise") and name.endswith(("_nf4", "_fp4"))  # n: an input
    if name.startswith(("cquantize_blockwise", "cdequantize_blockwise")) and A is not None and not fourbit_dequant:
        return {"n": math.prod(A.shape)}
    if {"rows", "cols"} <= named.keys() and A is not None:  # the int8 vector quantizer's (rows, cols)
        return dict(zip(("rows", "cols"), rows_cols(A)))
    if name.startswith("cdequant_mm_int32") and A is not None:
        return dict(zip(("numRows", "numCols"), rows_cols(A)))
    if name.startswith("cgemm_4bit_inference_naive") and A is not None:
        return {"k": rows_cols(A)[1]}
    if "_grad_" in name and p is not None:
        return {"n": math.prod(p.shape)}
    return {}


def _check_gemv_4bit_sizes(name: str, values: Dict[str, Any]) -> None:
    """The packed weight ``B`` holds ``n_out * K`` nibbles, K being ``A``'s last dimension: the kernel reads B's rows
    with stride K/2 bytes, so another K would pair A with the wrong weights without an error (issue 34)."""
    A, B, n_out = values.get("A"), values.get("B"), values.get("n_out")
    if not (isinstance(A, Tensor) and isinstance(B, Tensor)) or not A.ndim:
        return
    from .utils import ITEMSIZES
    nbytes = math.prod(B.shape) * ITEMSIZES.get(B.dtype, 1)
    want = int(n_out) * int(A.shape[-1])
    if nbytes != (want + 1) // 2:  # two values a byte, an odd count padded
        raise ValueError(f"lib.{name}: `B` must hold n_out * K = {int(n_out)} * {int(A.shape[-1])} 4-bit values "
                         f"in {(want + 1) // 2} bytes (K: `A`'s last dimension); got {nbytes} bytes "
                         f"({B.dtype} {tuple(B.shape)})")


def _drop_stream(op, args, kwargs):
    """Upstream passes its CUDA stream last to the (de)quantize and 4-bit GEMV entry points
    (``lib.cdequantize_blockwise_fp32(..., ct.c_int(n), stream)``); a row without ``stream`` takes that call too
    (the CPU library has no streams)."""
    if op.bnb_args[-1] == "stream":
        return args, kwargs
    if len(args) == len(op.bnb_args) + 1 and not isinstance(args[-1], TensorPointer):  # a buffer is no stream
        args = args[:-1]
    if "stream" in kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
    return args, kwargs


def _upstream_4bit_forms(name: str, named: Dict[str, Any]) -> None:
    """Upstream's own calls of the 4-bit entry points: ``code`` None (the kernel knows its NF4/FP4 table), and
    the GEMV as ``(m = output features, n = 1, k, ...)`` where this table reads ``(rows, n_out, k, ...)`` (the out
    buffer's size tells which order the caller used)."""
    if name.endswith(("_nf4", "_fp4")) and "code" in named and named["code"] is None:
        from ._formats_common import get_4bit_type
        named["code"] = get_ptr(get_4bit_type(name[-3:]))
    if name.startswith("cgemm_4bit_inference_naive"):
        A, out = named.get("A"), named.get("out")
        if not (isinstance(A, TensorPointer) and isinstance(out, TensorPointer)) or not A.tensor.ndim:
            return
        val = lambda v: v.value if isinstance(v, ct._SimpleCData) else v  # noqa: E731
        m, n_out = val(named.get("m")), val(named.get("n_out"))
        rows = math.prod(A.tensor.shape[:-1])
        have = math.prod(out.tensor.shape)
        if isinstance(m, int) and isinstance(n_out, int) and have != rows * n_out and have == rows * m:
            named["m"], named["n_out"] = n_out, m


def _check_bnb_sizes(name: str, named: Dict[str, Any]) -> None:
    """Upstream's kernels read and write as many elements as these scalars say; the kernels here take the sizes
    from the tensors, so a scalar that disagrees with them would be silently ignored (upstream: reads or writes
    past the buffers). Refused instead, naming it (issue 34)."""
    for arg, want in _bnb_sizes(name, named).items():
        if arg not in named:
            continue
        v = named[arg]
        v = v.value if isinstance(v, ct._SimpleCData) else v
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) != want:
            raise ValueError(f"lib.{name}: `{arg}` must be {want} (the size of the tensors passed); got {v!r}")


#: What an input of a MindSpore-style call may be (the C ABI table's inputs are tensors or scalars).
_INPUT_TYPES = (Tensor, type(None), bool, int, float, np.integer, np.floating, np.bool_)


def _type_name(v) -> str:
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def _bind(fn: str, names: Tuple[str, ...], args, kwargs, what: str) -> Dict[str, Any]:
    """Binds positional and keyword arguments to the table row's ``names``; a wrong count, an unknown or repeated
    keyword, or a missing name is a TypeError naming it (not a KeyError deep in the bridge)."""
    if len(args) > len(names):
        raise TypeError(f"lib.{fn} takes {len(names)} {what} {names}, got {len(args)} positional")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"lib.{fn}: unknown keyword argument `{k}`; its {what} are {names}")
        if k in bound:
            raise TypeError(f"lib.{fn}: argument `{k}` given both by position and by keyword")
        bound[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"lib.{fn}: missing argument `{missing[0]}` (its {what} are {names})")
    return bound


def _tag_device(out, inputs):
    return _device_tag.tag(out, inputs)


class _Expected:
    """An output's expected shape and dtype (what _check_out_buffer compares a buffer with)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _check_out_buffer(fn: str, name: str, buf, res) -> None:
    """An output buffer of a bitsandbytes-style call must take the result as it is: same dtype, same number of
    elements (upstream's kernel would write that many bytes of that type through the pointer)."""
    if buf.dtype != res.dtype:
        raise TypeError(f"lib.{fn}: output `{name}` must have dtype {res.dtype}; got {buf.dtype}")
    want, have = math.prod(res.shape), math.prod(buf.shape)
    if want != have:
        raise ValueError(f"lib.{fn}: output `{name}` must have {want} elements; got shape {tuple(buf.shape)}")


_AOT_STATUS = re.compile(r"Return value from \w+ AOT kernel\(.*?\)'s function\(\w+\) is (-?\d+)")


def compiling(t) -> bool:
    """True while MindSpore's graph compiler parses the caller (``mindspore.jit``, ``GRAPH_MODE``), False when it
    runs in Python (PyNative): in Python every ``Tensor`` has ``asnumpy``; while the compiler parses the code,
    ``hasattr`` is answered from the graph's tensor type, which has none (a host-side method). One attribute
    lookup on the PyNative path; see :mod:`bitsandbytes_ms._graph`."""
    return isinstance(t, Tensor) and not hasattr(t, "asnumpy")


class _DummyShapes(dict):
    """Shape lookup used when only output dtypes are wanted."""

    def __missing__(self, key):
        return (1,)


class NativeLibrary:
    """``lib``: attribute access gives the entry point callables of the loaded library."""

    def __init__(self, path: Path, backend: str):
        self.path = path
        self.backend = backend
        self._fns: Dict[str, NativeFunction] = {}

    def __getattr__(self, name: str) -> NativeFunction:
        if name.startswith("__"):
            raise AttributeError(name)
        fn = self._fns.get(name)
        if fn is None:
            op = _native_table.OPS.get(name)
            if op is None:
                raise AttributeError(f"bitsandbytes_ms native library has no entry point {name!r}")
            fn = self._fns[name] = NativeFunction(op, self.path)
        return fn

    def __dir__(self):
        return sorted(_native_table.OPS)


class ErrorHandlerMockBNBNativeLibrary:
    """``lib`` when the native library did not load (upstream's name for the same stand-in): attribute access
    works, and calling an entry point raises :class:`NativeLibraryError` naming it, the library and why."""

    def __init__(self, error_msg: str):
        self.error_msg = error_msg
        self.path = LIBRARY_PATH
        self.backend = BNB_BACKEND

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in _native_table.OPS:
            raise AttributeError(f"bitsandbytes_ms native library has no entry point {name!r}")
        msg = self.error_msg

        def missing(*args, **kwargs):
            raise NativeLibraryError(f"lib.{name} needs the native library, which did not load: {msg}")

        missing.__name__ = name
        return missing

    def __dir__(self):
        return sorted(_native_table.OPS)


lib = NativeLibrary(LIBRARY_PATH, BNB_BACKEND) if _dll is not None else ErrorHandlerMockBNBNativeLibrary(LIBRARY_ERROR)


def check_status(status: Tensor, what: str) -> None:
    """Raises ``RuntimeError`` if a kernel's ``has_error`` output is nonzero. This reads the tensor
    (a host sync), so call it only where a result must be trusted (the checking mode calls it after every op that
    has one)."""
    code = int(status.asnumpy().reshape(-1)[0])
    if code == 100:
        raise NotImplementedError(f"{what}: not implemented for these arguments on {BNB_BACKEND}")
    if code != 0:
        raise RuntimeError(has_error_message(what, code))


#: Upstream names that ported code reads (no ROCm build exists for MindSpore).
HIP_ENVIRONMENT = False
ROCM_GPU_ARCH = None
