"""Full-precision linear for the layers a quantized model keeps (lm_head): the native cgemm_fp_* kernels against
the numpy reference (bit for bit: the reference replays the kernel's fma order), every SIMD level, odd K/N, 3-D
input, bias, bad inputs; the LinearFP layer (host-call hot path, ops.Custom path, the differentiable path under
value_and_grad, weights that move); the integration (lm_head fast / lm_head quantized, tied embeddings) and the
transformers patch."""

import copy
import ctypes as ct
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ml_dtypes import bfloat16

import mindspore as ms
from mindspore import Tensor

import mindnlp  # noqa: F401  (torch -> mindtorch)
import torch  # noqa: E402

from bitsandbytes_ms import _hostcall as H  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms import cextension  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from bitsandbytes_ms.cextension import lib  # noqa: E402
from bitsandbytes_ms.nn import LinearFP, use_fast_fp_layers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NP = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: bfloat16}
NAME = {ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16"}
SFX = {ms.float32: "fp32", ms.float16: "fp16", ms.bfloat16: "bf16"}
DTYPES = [ms.float32, ms.float16, ms.bfloat16]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint16)


def _t(a, dt):
    """A tensor of dtype dt holding the values of the numpy array a (already representable in dt)."""
    return Tensor(np.asarray(a, np.float32)).astype(dt)


def _rand(rng, shape, dt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(NP[dt]).astype(np.float32)


# ---- the reference's fma ------------------------------------------------------------------------------------
def test_reference_fma_matches_libm():
    libm = ct.CDLL("libm.so.6")
    libm.fmaf.restype, libm.fmaf.argtypes = ct.c_float, [ct.c_float] * 3
    rng = np.random.default_rng(0)
    cases = []
    for scale in (1.0, 1e-20, 1e20, 1e-39):  # the last: subnormal products and sums
        cases.append(((rng.standard_normal(3000) * scale), rng.standard_normal(3000), rng.standard_normal(3000) * scale))
    # products whose exact sum sits next to a float32 rounding tie (double rounding would get these wrong)
    one = np.float32(1 + 2**-12)
    b = one + np.arange(2000, dtype=np.float32) * np.float32(2**-23)
    cases.append((np.full(2000, one), b, np.full(2000, -np.float32(1 + 2**-11))))
    cases.append((np.array([0.0, -0.0, 3.0, np.inf, 1e30]), np.array([-1.0, 5.0, -0.0, 2.0, 1e30]),
                  np.array([0.0, -0.0, -0.0, 1.0, 0.0])))
    for a, b, c in cases:
        a, b, c = (np.asarray(v, np.float32) for v in (a, b, c))
        want = np.array([libm.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], np.float32)
        np.testing.assert_array_equal(_bits(R.fma_f32(a, b, c)), _bits(want))


def test_reference_is_close_to_float64():
    rng = np.random.default_rng(1)
    A, W = rng.standard_normal((3, 1000)).astype(np.float32), rng.standard_normal((20, 1000)).astype(np.float32)
    exact = A.astype(np.float64) @ W.astype(np.float64).T
    bound = 1000 * 2**-23 * (np.abs(A).astype(np.float64) @ np.abs(W).astype(np.float64).T)
    assert np.all(np.abs(R.gemm_fp(A, W) - exact) <= bound)


# ---- native kernel vs reference -------------------------------------------------------------------------------
SHAPES = [  # (A shape, N): odd K and N, every tile remainder of the AVX2 (3 x 2) and AVX-512 (4 x 4) kernels
    ((1, 576), 37), ((1, 1), 5), ((1, 15), 1), ((1, 16), 8), ((1, 17), 9), ((2, 33), 11), ((3, 100), 13),
    ((4, 64), 6), ((5, 31), 7), ((7, 129), 10), ((12, 48), 25), ((2, 3, 40), 9), ((2, 1, 3, 23), 4),
]


@pytest.mark.parametrize("dt", DTYPES, ids=NAME.get)
@pytest.mark.parametrize("a_shape, N", SHAPES)
@pytest.mark.parametrize("bias", ["none", "same", "fp32"])
def test_native_matches_reference_bitwise(dt, a_shape, N, bias):
    rng = np.random.default_rng(hash((a_shape, N)) % 2**32)
    K = a_shape[-1]
    A, W = _rand(rng, a_shape, dt), _rand(rng, (N, K), dt, 0.1)
    bdt = {"none": None, "same": dt, "fp32": ms.float32}[bias]
    b = None if bdt is None else _rand(rng, (N,), bdt)
    ref = R.gemm_fp(A, W, b, NAME[dt])
    tb = None if b is None else _t(b, bdt)
    got = lib.__getattr__(f"cgemm_fp_{SFX[dt]}")(_t(A, dt), _t(W, dt), tb)  # ops.Custom
    assert tuple(got.shape) == a_shape[:-1] + (N,) and got.dtype == dt
    np.testing.assert_array_equal(_bits(got.asnumpy()), _bits(ref))
    out = H.empty(a_shape[:-1] + (N,), dt)  # host call: same entry point, same bits
    H.entry(f"cgemm_fp_{SFX[dt]}")(H.host(_t(A, dt)), H.host(_t(W, dt)), None if b is None else H.host(tb), out)
    np.testing.assert_array_equal(_bits(out), _bits(ref))


def test_special_values():
    # inf, -0 and subnormal products follow the reference; a NaN input gives NaN in its row/column only
    A = np.array([[1.0, -0.0, np.inf, 1e-30, 2.0], [0.0, -0.0, 1.0, -1.0, 0.5]], np.float32)
    W = np.array([[1.0, 1.0, 0.0, 1e-15, 1.0], [-0.0, -1.0, 1.0, 1e-10, -2.0], [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    A2 = A.copy()
    A2[0, 2] = 1.0  # no inf * 0 -> NaN in the exactly compared case
    got = F.gemm_fp(Tensor(A2), Tensor(W)).asnumpy()
    np.testing.assert_array_equal(_bits(got), _bits(R.gemm_fp(A2, W)))
    got = F.gemm_fp(Tensor(A), Tensor(W)).asnumpy()
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and np.isnan(got[0, 2])
    A3 = A2.copy()
    A3[1, 0] = np.nan
    got = F.gemm_fp(Tensor(A3), Tensor(W)).asnumpy()
    assert np.all(np.isnan(got[1])) and np.array_equal(_bits(got[0]), _bits(R.gemm_fp(A2, W)[0]))


def test_k_zero_and_empty():
    b = np.arange(3, dtype=np.float32) - 1
    out = F.gemm_fp(Tensor(np.zeros((2, 0), np.float32)), Tensor(np.zeros((3, 0), np.float32)), Tensor(b))
    np.testing.assert_array_equal(out.asnumpy(), np.broadcast_to(b, (2, 3)))
    out = F.gemm_fp(Tensor(np.zeros((2, 0), np.float32)), Tensor(np.zeros((3, 0), np.float32)))
    assert np.array_equal(out.asnumpy(), np.zeros((2, 3), np.float32)) and not np.signbit(out.asnumpy()).any()
    out = F.gemm_fp(Tensor(np.zeros((0, 4), np.float32)), Tensor(np.ones((3, 4), np.float32)))
    assert tuple(out.shape) == (0, 3)


def test_simd_levels_agree(tmp_path):
    """BNB_MS_SIMD=scalar (the portable kernel), avx2 and this CPU's best level (also on one thread) give the same
    bits, equal to the reference; through ctypes in subprocesses (no MindSpore), with infinities, -0 and subnormals."""
    rng = np.random.default_rng(7)
    cases, refs = {}, {}
    for dt in DTYPES:
        for i, (a_shape, N) in enumerate(SHAPES + [((9, 300), 50), ((40, 70), 19)]):
            key = f"{SFX[dt]}:{i}"
            A, W = _rand(rng, a_shape, dt), _rand(rng, (N, a_shape[-1]), dt, 0.2)
            if i % 3 == 0:
                A.reshape(-1)[::7] = -0.0
                W.reshape(-1)[::5] = np.float32(1e-20) if dt == ms.float32 else 0.0
            if i % 4 == 1 and dt != ms.float16:
                A.reshape(-1)[0] = np.inf
                W[:, 0] = np.abs(W[:, 0]) + 1  # inf * positive: no NaN
                W = W.astype(NP[dt]).astype(np.float32)  # representable in dt
            cases[key + "/A"], cases[key + "/W"] = A, W
            b = None
            if i % 2:
                bdt = ms.float32 if i % 4 == 1 else dt
                b = _rand(rng, (N,), bdt)
                cases[key + "/bias"], cases[key + "/bias_dt"] = b, np.array(SFX[bdt])
            refs[key] = _bits(R.gemm_fp(A, W, b, NAME[dt]))
    np.savez(tmp_path / "cases.npz", **cases)
    levels = {}
    for level in ("scalar", "avx2", "", "1thread"):
        env = {k: v for k, v in os.environ.items() if k not in ("BNB_MS_SIMD", "BNB_MS_NUM_THREADS")}
        if level == "1thread":  # the result does not depend on how the thread pool splits N
            env["BNB_MS_NUM_THREADS"] = "1"
        elif level:
            env["BNB_MS_SIMD"] = level
        out = tmp_path / f"out_{level or 'best'}.npz"
        subprocess.run([sys.executable, str(ROOT / "tests" / "_gemm_fp_levels.py"), str(cextension.LIBRARY_PATH),
                        str(tmp_path / "cases.npz"), str(out)], env=env, check=True, capture_output=True, text=True)
        levels[level or "best"] = dict(np.load(out))
    assert int(levels["scalar"]["_level"]) == 0
    for name, got in levels.items():
        for key, ref in refs.items():
            np.testing.assert_array_equal(got[key], ref, err_msg=f"{name} {key}")


# ---- bad input --------------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_argument():
    A, W = Tensor(np.ones((2, 6), np.float32)), Tensor(np.ones((4, 6), np.float32))
    with pytest.raises(ValueError, match="gemm_fp: `A` must have dtype"):
        F.gemm_fp(Tensor(np.ones((2, 6), np.int32)), W)
    with pytest.raises(TypeError, match="gemm_fp: `W` must be a mindspore.Tensor"):
        F.gemm_fp(A, np.ones((4, 6), np.float32))
    with pytest.raises(ValueError, match="gemm_fp: `W` must have A's dtype float32; got float16"):
        F.gemm_fp(A, W.astype(ms.float16))
    with pytest.raises(ValueError, match=r"gemm_fp: `W` must have shape \[N, 6\]"):
        F.gemm_fp(A, Tensor(np.ones((4, 5), np.float32)))
    with pytest.raises(ValueError, match=r"gemm_fp: `W` must have shape"):
        F.gemm_fp(A, Tensor(np.ones((24,), np.float32)))
    with pytest.raises(ValueError, match="gemm_fp: `bias` must have W.shape\\[0\\] = 4 elements; got 3"):
        F.gemm_fp(A, W, Tensor(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="gemm_fp: `bias` must have dtype"):
        F.gemm_fp(A, W, Tensor(np.ones(4, np.int64)))
    with pytest.raises(ValueError, match="gemm_fp: `A` must have at least one dimension"):
        F.gemm_fp(Tensor(np.float32(1.0)), W)
    with pytest.raises(ValueError, match="gemm_fp: `out` must have shape"):
        F.gemm_fp(A, W, out=F.empty((2, 5)))


def test_malformed_native_calls_return_a_status():
    e = H.entry("cgemm_fp_fp32")
    A, W, out = np.ones((2, 6), np.float32), np.ones((4, 6), np.float32), np.empty((2, 4), np.float32)
    with pytest.raises(RuntimeError, match="returned status 2"):  # E_DTYPE
        e(A, W.astype(np.float16), None, out)
    with pytest.raises(RuntimeError, match="returned status 2"):
        e(A, W, np.ones(4, np.int32), out)
    with pytest.raises(RuntimeError, match="returned status 3"):  # E_SHAPE
        e(A, np.ones((4, 5), np.float32), None, out)
    with pytest.raises(RuntimeError, match="returned status 3"):
        e(A, W, np.ones(3, np.float32), out)
    with pytest.raises(RuntimeError, match="returned status 3"):
        e(A, W, None, np.empty((2, 3), np.float32))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        e.bind(A, W, out)


# ---- LinearFP ---------------------------------------------------------------------------------------------------
def _linear(K, N, bias, dt, seed=0):
    lin = torch.nn.Linear(K, N, bias=bias)
    rng = np.random.default_rng(seed)
    lin.weight.data.copy_(torch.tensor(_rand(rng, (N, K), ms.float32, 0.1)))
    if bias:
        lin.bias.data.copy_(torch.tensor(_rand(rng, (N,), ms.float32)))
    return lin.to(dt) if dt != ms.float32 else lin


def _ref_of(layer, x):
    b = None if layer.bias is None else layer.bias.float().asnumpy()
    return R.gemm_fp(x.float().asnumpy(), layer.weight.float().asnumpy(), b, NAME[x.dtype])


@pytest.mark.parametrize("dt", DTYPES, ids=NAME.get)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_fp_forward_is_the_kernel(dt, bias):
    lin = _linear(70, 33, bias, dt)
    w, b = lin.weight, lin.bias
    layer = LinearFP.from_linear(lin)
    assert layer is lin and type(layer) is LinearFP and layer.weight is w and layer.bias is b
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == ({"weight", "bias"} if bias else {"weight"})
    for shape in ((1, 70), (1, 1, 70), (3, 5, 70), (4, 70)):
        x = torch.tensor(np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)).to(dt)
        y = layer(x)
        assert y.dtype == dt and tuple(y.shape) == shape[:-1] + (33,)
        np.testing.assert_array_equal(_bits(y.asnumpy()), _bits(_ref_of(layer, x)))
        old = H.set_enabled(False)  # the same kernel through ops.Custom
        try:
            np.testing.assert_array_equal(_bits(layer(x).asnumpy()), _bits(y.asnumpy()))
        finally:
            H.set_enabled(old)
        with torch.no_grad():
            np.testing.assert_array_equal(_bits(layer(x).asnumpy()), _bits(y.asnumpy()))
        y2 = y + 1  # the result is an ordinary tensor for what follows
        assert np.allclose(y2.float().asnumpy(), y.float().asnumpy() + 1, rtol=0 if dt == ms.float32 else 1e-2, atol=0 if dt == ms.float32 else 2e-2)


def test_linear_fp_sees_new_and_updated_weights():
    layer = LinearFP.from_linear(_linear(40, 12, True, ms.float32))
    x = torch.tensor(np.random.default_rng(0).standard_normal((1, 40)).astype(np.float32))
    layer(x)
    sd = {"weight": torch.tensor(np.random.default_rng(1).standard_normal((12, 40)).astype(np.float32)),
          "bias": torch.tensor(np.random.default_rng(2).standard_normal(12).astype(np.float32))}
    layer.load_state_dict(sd)  # a new buffer under the same Parameter
    np.testing.assert_array_equal(layer(x).asnumpy(), _ref_of(layer, x))
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place
        layer.bias.add_(1.0)
    np.testing.assert_array_equal(layer(x).asnumpy(), _ref_of(layer, x))
    layer.weight = torch.nn.Parameter(torch.tensor(np.ones((12, 40), np.float32)))  # a new Parameter
    np.testing.assert_array_equal(layer(x).asnumpy(), _ref_of(layer, x))
    c = copy.deepcopy(layer)
    assert type(c) is LinearFP and "_fp_cache" not in c.__dict__
    np.testing.assert_array_equal(c(x).asnumpy(), layer(x).asnumpy())
    view = torch.tensor(np.random.default_rng(3).standard_normal((20, 40)).astype(np.float32))[4:16]
    layer.weight = torch.nn.Parameter(view)  # a view into a bigger buffer (storage offset): host copy
    np.testing.assert_array_equal(layer(x).asnumpy(), _ref_of(layer, x))


def test_linear_fp_many_rows_uses_matmul():
    layer = LinearFP.from_linear(_linear(64, 30, True, ms.float32))
    n = F.GEMM_FP_NATIVE_MAX_ROWS[ms.float32] + 3
    x = torch.tensor(np.random.default_rng(0).standard_normal((1, n, 64)).astype(np.float32))
    assert not F.gemm_fp_uses_native(n, ms.float32)
    y = layer(x)
    assert tuple(y.shape) == (1, n, 30)
    np.testing.assert_allclose(y.asnumpy(), _ref_of(layer, x), rtol=1e-5, atol=1e-5)
    for dt in (ms.float16, ms.bfloat16):  # no MindSpore CPU path for these: native at any size
        assert F.gemm_fp_uses_native(4096, dt)


def test_linear_fp_gradient_path():
    """Under value_and_grad the layer runs nn.Linear's differentiable forward: same gradients as nn.Linear."""
    lin = _linear(24, 10, True, ms.float32)
    ref_lin = copy.deepcopy(lin)
    layer = LinearFP.from_linear(lin)
    x = torch.tensor(np.random.default_rng(0).standard_normal((3, 24)).astype(np.float32))

    def loss_of(m):
        return lambda inp: (m(inp) ** 2).sum()

    params = [layer.weight, layer.bias]
    (v, (gx, (gw, gb))) = ms.value_and_grad(loss_of(layer), grad_position=0, weights=params)(x)
    (rv, (rgx, (rgw, rgb))) = ms.value_and_grad(loss_of(ref_lin), grad_position=0,
                                                weights=[ref_lin.weight, ref_lin.bias])(x)
    np.testing.assert_allclose(v.asnumpy(), rv.asnumpy(), rtol=1e-6)
    for a, b in ((gx, rgx), (gw, rgw), (gb, rgb)):
        assert np.abs(a.asnumpy()).max() > 0
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)


def test_linear_fp_bad_input_names_the_argument():
    layer = LinearFP(16, 4)
    with pytest.raises(ValueError, match=r"LinearFP: `input` must have shape \[\.\.\., 16\]"):
        layer(torch.ones(2, 15))
    with pytest.raises(ValueError, match="LinearFP: `input` must have shape"):
        layer(torch.tensor(1.0))


def test_from_linear_and_use_fast_fp_layers_leave_other_layers():
    import bitsandbytes_ms.nn as bnn

    with pytest.raises(TypeError, match="`linear` must be a torch.nn.Linear"):
        LinearFP.from_linear(bnn.Linear8bitLt(4, 4))
    seq = torch.nn.Sequential(torch.nn.Linear(8, 8), bnn.Linear4bit(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    assert use_fast_fp_layers(seq) == ["0", "3"]
    assert [type(m).__name__ for m in seq] == ["LinearFP", "Linear4bit", "ReLU", "LinearFP"]
    assert "native" in repr(seq[0])


# ---- integration: a small random Llama ----------------------------------------------------------------------------
def _tiny_llama(tie):
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    transformers.logging.set_verbosity_error()
    cfg = LlamaConfig(vocab_size=384, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    m = AutoModelForCausalLM.from_config(cfg)
    rng = np.random.RandomState(0)
    for _, p in m.named_parameters():
        p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.05).astype(np.float32)))
    m.eval()
    return m


IDS = np.array([[1, 57, 300, 12, 44, 9, 212, 77]], dtype=np.int64)


def _logits(m, ids=IDS):
    with torch.no_grad():
        return m(torch.tensor(ids)).logits.float().asnumpy()


@pytest.mark.parametrize("mode", ["int8", "nf4"])
@pytest.mark.parametrize("tie", [False, True])
def test_integration_lm_head_fast(mode, tie):
    from bitsandbytes_ms.integrations import quant_4bit, quant_8bit

    def q(m, **kw):
        skipped = []
        if mode == "int8":
            quant_8bit(m, skipped=skipped, progress=False, **kw)
        else:
            quant_4bit(m, quant_type="nf4", compute_dtype="fp32", skipped=skipped, progress=False, **kw)
        return skipped

    slow, fast = _tiny_llama(tie), _tiny_llama(tie)
    assert q(slow, fast_fp_layers=False) == ["lm_head"] and type(slow.lm_head) is torch.nn.Linear
    assert q(fast) == ["lm_head"] and type(fast.lm_head) is LinearFP
    if tie:
        assert fast.lm_head.weight is fast.model.embed_tokens.weight
    a, b = _logits(slow), _logits(fast)  # nn.Linear (dense) vs the native kernel: rounding only
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    # decoding: one row at a time through the host-call path, the same tokens
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ta = slow.generate(torch.tensor(IDS), generation_config=gc).asnumpy()
        tb = fast.generate(torch.tensor(IDS), generation_config=gc).asnumpy()
    np.testing.assert_array_equal(ta, tb)


@pytest.mark.parametrize("mode", ["int8", "nf4"])
@pytest.mark.parametrize("tie", [False, True])
def test_integration_lm_head_quantized(mode, tie):
    from bitsandbytes_ms.integrations import quant_4bit, quant_8bit
    import bitsandbytes_ms.nn as bnn

    m = _tiny_llama(tie)
    ref = _logits(m)
    emb = m.model.embed_tokens.weight.asnumpy().copy()
    converted, skipped = [], []
    if mode == "int8":
        quant_8bit(m, modules_to_not_convert=[], converted=converted, skipped=skipped, progress=False)
    else:
        quant_4bit(m, quant_type="nf4", compute_dtype="fp32", modules_to_not_convert=[], converted=converted,
                   skipped=skipped, progress=False)
    assert "lm_head" in converted and skipped == []
    assert isinstance(m.lm_head, bnn.Linear8bitLt if mode == "int8" else bnn.Linear4bit)
    w = m.model.embed_tokens.weight  # the embedding keeps its full-precision weight
    assert w.dtype == ms.float32 and np.array_equal(w.asnumpy(), emb)
    assert m.config.tie_word_embeddings is False
    m.tie_weights()  # transformers does not tie the quantized head back
    assert isinstance(m.lm_head, bnn.Linear8bitLt if mode == "int8" else bnn.Linear4bit)
    got = _logits(m)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < (0.05 if mode == "int8" else 0.2), err


def test_patch_from_pretrained_kept_layers_are_linear_fp(tmp_path):
    import bitsandbytes_ms as bnb
    from bitsandbytes_ms.integrations.patches import registry
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    bnb.register()
    m = _tiny_llama(False)
    m.save_pretrained(str(tmp_path), safe_serialization=True)
    ref = _logits(m)
    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    names = ["transformers-bnb4bit-kept-layers-native", "transformers-bnb8bit-kept-layers-native"]
    assert all(registry.is_applied(n) for n in names)
    q = AutoModelForCausalLM.from_pretrained(str(tmp_path), quantization_config=cfg, dtype=torch.float32)
    assert type(q.lm_head) is LinearFP and isinstance(q.model.layers[0].mlp.down_proj, bnb.nn.Linear4bit)
    q8 = AutoModelForCausalLM.from_pretrained(str(tmp_path), quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                              dtype=torch.float32)
    assert type(q8.lm_head) is LinearFP
    registry.remove(names)
    try:
        plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), quantization_config=cfg, dtype=torch.float32)
        assert type(plain.lm_head) is torch.nn.Linear
    finally:
        registry.apply(names)
    q.eval()
    plain.eval()
    a, b = _logits(plain), _logits(q)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    assert np.abs(b - ref).max() / np.abs(ref).max() < 0.2
