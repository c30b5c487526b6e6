"""The bridge: the op table, lib callables, get_ptr-style calls, library loading errors."""

import ctypes as ct
import os
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms

from bitsandbytes_ms import _native_table, _reference as R, cextension
from bitsandbytes_ms import functional as F
from bitsandbytes_ms.cextension import get_ptr, lib


def test_every_table_row_is_exported_by_the_library():
    dll = ct.CDLL(str(cextension.LIBRARY_PATH))
    for name in _native_table.OPS:
        assert hasattr(dll, name), name


def test_ops_are_created_once_and_cached():
    A = ms.Tensor(np.random.randn(300).astype(np.float32))
    code = F.create_dynamic_map()
    fn = lib.cquantize_blockwise_fp32
    fn._cache.clear()
    fn(code, A, 64)
    n_cached = len(fn._cache)
    assert n_cached == 1
    fn(code, A, 64)
    fn(code, ms.Tensor(np.random.randn(1000).astype(np.float32)), 64)
    assert len(fn._cache) == n_cached
    fn(code, A, 128)  # another static blocksize -> one more op object
    assert len(fn._cache) == n_cached + 1


def test_bitsandbytes_style_call_with_get_ptr():
    """Code ported from bitsandbytes 0.45 (lib.cquantize_blockwise_fp32(get_ptr(...), ...)) works."""
    x = np.random.RandomState(0).randn(1000).astype(np.float32)
    A = ms.Tensor(x)
    code = F.create_dynamic_map()
    absmax = F.empty((4,), ms.float32)
    out = F.empty((1000,), ms.uint8)
    rc = lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(A), get_ptr(absmax), get_ptr(out),
                                      ct.c_int32(256), ct.c_int(1000))
    assert rc == 0
    q_ref, a_ref = R.quantize_blockwise(x, code.asnumpy(), 256)
    np.testing.assert_array_equal(out.asnumpy(), q_ref)
    np.testing.assert_array_equal(absmax.asnumpy(), a_ref)
    back = F.empty((1000,), ms.float32)
    lib.cdequantize_blockwise_fp32(get_ptr(code), get_ptr(out), get_ptr(absmax), get_ptr(back),
                                   ct.c_int32(256), ct.c_int(1000))
    np.testing.assert_array_equal(back.asnumpy(), R.dequantize_blockwise(q_ref, a_ref, code.asnumpy(), 256))


def test_get_ptr_is_the_data_address():
    A = ms.Tensor(np.arange(4, dtype=np.float32))
    assert get_ptr(None) is None
    p = get_ptr(A)
    assert isinstance(p, ct.c_void_p) and p.value == A.data_ptr()


def test_unknown_symbol_is_a_clear_attribute_error():
    with pytest.raises(AttributeError, match="no entry point 'cnot_a_kernel'"):
        lib.cnot_a_kernel


_WITHOUT_LIBRARY = (
    "import warnings, numpy as np, mindspore as ms\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    "    import bitsandbytes_ms as bnb\n"
    "    import bitsandbytes_ms.nn\n"
    "from bitsandbytes_ms import cextension, functional as F\n"
    "print('WARNINGS', sum('native library' in str(x.message) for x in w))\n"
    "print('ERROR', cextension.LIBRARY_ERROR)\n"
    "from bitsandbytes_ms import _ops, _reference as R\n"
    "print('BACKEND', _ops.backend())\n"
    "x = np.random.RandomState(0).randn(1000).astype(np.float32)\n"
    "q, st = F.quantize_blockwise(ms.Tensor(x), blocksize=64)\n"
    "qr, ar = R.quantize_blockwise(x, st.code.asnumpy(), 64)\n"
    "back = F.dequantize_blockwise(q, st).asnumpy()\n"
    "print('BLOCKWISE', np.array_equal(q.asnumpy(), qr) and np.array_equal(st.absmax.asnumpy(), ar)\n"
    "      and np.array_equal(back, R.dequantize_blockwise(qr, ar, st.code.asnumpy(), 64)))\n"
    "p4, qs = F.quantize_4bit(ms.Tensor(x), blocksize=64, quant_type='nf4')\n"
    "p4r, a4r = R.quantize_4bit(x, qs.code.asnumpy(), 64)\n"
    "d4 = F.dequantize_4bit(p4, qs).asnumpy()\n"
    "print('FOURBIT', np.array_equal(p4.asnumpy(), p4r) and np.array_equal(qs.absmax.asnumpy(), a4r)\n"
    "      and np.array_equal(d4, R.dequantize_4bit(p4r, a4r, qs.code.asnumpy(), 64, 1000)))\n"
    "try:\n"
    "    cextension.lib.cquantize_blockwise_fp32(st.code, ms.Tensor(x), 64)\n"
    "except RuntimeError as e:\n"
    "    print('RAISED', type(e).__name__, isinstance(e, ImportError), e)\n"
)


def _run_without_library(lib_path, *args):
    env = dict(os.environ, BNB_MS_LIBRARY=str(lib_path))
    cmd = [sys.executable, *args] if args else [sys.executable, "-c", _WITHOUT_LIBRARY]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("kind", ["missing", "unloadable"])
def test_without_the_library_the_package_imports_and_runs_on_the_reference(tmp_path, kind):
    """Issues 15 and 14: a missing or broken native library does not fail `import bitsandbytes_ms` (upstream imports
    on CPU without its library): one RuntimeWarning naming the file and the build command; the ops then run on the
    numpy reference backend (blockwise 8-bit and NF4 quantize/dequantize give the reference's bytes), and a direct
    native call raises NativeLibraryError (an ImportError and a RuntimeError) saying why."""
    path = tmp_path / "libbitsandbytes_ms_cpu.so"
    if kind == "unloadable":
        path.write_bytes(b"not an ELF file")
    r = _run_without_library(path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WARNINGS 1" in r.stdout
    why = "does not exist" if kind == "missing" else "failed to load"
    error_line = next(line for line in r.stdout.splitlines() if line.startswith("ERROR "))
    assert str(path) in error_line and why in error_line and "tools/setup.sh" in error_line
    assert "BACKEND reference" in r.stdout and "BLOCKWISE True" in r.stdout and "FOURBIT True" in r.stdout
    raised = next(line for line in r.stdout.splitlines() if line.startswith("RAISED "))
    assert raised.startswith("RAISED NativeLibraryError True lib.cquantize_blockwise_fp32 needs the native library")
    assert str(path) in raised


def test_without_the_library_the_cli_reports_instead_of_a_traceback(tmp_path):
    path = tmp_path / "libbitsandbytes_ms_cpu.so"
    r = _run_without_library(path, "-m", "bitsandbytes_ms")
    assert r.returncode == 0 and "Traceback" not in r.stderr + r.stdout
    assert f"native library    NOT LOADED: bitsandbytes_ms: the native library {path} does not exist" in r.stdout
    assert "op backend        reference" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "SUCCESS! (on the numpy reference backend)"  # the sanity check ran
    r = _run_without_library(path, "-m", "bitsandbytes_ms", "quantize")
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert r.stderr.rstrip().splitlines()[-1].startswith(f"bnb-ms quantize: error: bitsandbytes_ms: the native library {path}")


def test_empty_allocates_without_numpy():
    t = F.empty((3, 5), ms.float16)
    assert t.shape == (3, 5) and t.dtype == ms.float16
    z = F.empty((0,), ms.uint8)
    assert z.shape == (0,)
    e = F.empty_like(t, ms.int8)
    assert e.shape == (3, 5) and e.dtype == ms.int8
    with pytest.raises(ValueError, match="`shape` must be non-negative"):
        F.empty((-1, 2))


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_simd_levels_agree(level):
    """The portable path and the SIMD paths give the same bytes (run in a subprocess with
    BNB_MS_SIMD lowering the dispatch level)."""
    code = (
        "import mindspore as ms, numpy as np; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c;"
        "x=np.random.RandomState(7).randn(3, 5000).astype(np.float32);"
        "outs=[];"
        "[outs.append(F.quantize_blockwise(ms.Tensor(x).astype(dt), blocksize=256)[0].asnumpy().tobytes()) for dt in (ms.float32, ms.float16, ms.bfloat16)];"
        "q,s=F.quantize_blockwise(ms.Tensor(x), blocksize=256);"
        "[outs.append(F.dequantize_blockwise(q, F.QuantState(s.absmax, code=s.code, blocksize=256, dtype=dt)).asnumpy().tobytes()) for dt in (ms.float32, ms.float16, ms.bfloat16)];"
        "import hashlib,sys; sys.stdout.write(c.simd_level()+' '+hashlib.sha256(b''.join(outs)).hexdigest())"
    )
    def run(env_level):
        env = dict(os.environ)
        env.pop("BNB_MS_SIMD", None)
        if env_level:
            env["BNB_MS_SIMD"] = env_level
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return r.stdout.split()
    lvl, digest = run(level)
    assert lvl == level or (level == "avx2" and lvl == "scalar")  # a CPU without AVX2 stays scalar
    _, best = run(None)
    assert digest == best
