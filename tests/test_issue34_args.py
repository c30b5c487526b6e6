"""Issue 34, classes e and f: invalid arguments refused with a ValueError naming them (code maps, optimizer
hyper-parameters in parameter groups and overrides); a 0 in a block of subnormals stays 0. Each test failed before
its fix."""

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F


# ---- e. code maps: every combination that gives entries outside [-1, 1] or non-finite ones ---------------------
@pytest.mark.parametrize("signed,max_exp,total", [(True, 0, t) for t in range(2, 9)])
def test_dynamic_map_rejects_max_exponent_bits_0(signed, max_exp, total):
    with pytest.raises(ValueError, match=r"create_dynamic_map: `max_exponent_bits` must be >= 1 .*got 0"):
        F.create_dynamic_map(signed, max_exp, total)


@pytest.mark.parametrize("signed,e,p,total", [(True, 0, 0, 1), (True, 8, 0, 9), (False, 8, 0, 8), (False, 8, 1, 9)])
def test_fp8_map_rejects_exponent_bits_giving_nan(signed, e, p, total):
    with pytest.raises(ValueError, match=rf"create_fp8_map: `exponent_bits` must be in \[1, 7\].*got {e}"):
        F.create_fp8_map(signed, e, p, total)


@pytest.mark.parametrize("offset", [-1.0, 0.0, 0.5, 1.0, 1.5, float("nan"), float("inf"), "0.9"])
@pytest.mark.parametrize("extra", [True, False])
def test_normal_map_rejects_offset_outside_half_to_one(offset, extra):
    with pytest.raises(ValueError, match=r"create_normal_map: `offset` must be a number in \(0.5, 1\)"):
        F.create_normal_map(offset, extra)


def test_maps_upstream_uses_stay_valid_and_in_range():
    # upstream's own code and tests: optimizers' maps, test_few_bit_quant (bits 2..8), test_fp8_quant (e 1..6)
    codes = [F.create_dynamic_map(True), F.create_dynamic_map(False), F.create_normal_map(),
             F.create_normal_map(0.9677083, False), F.create_fp8_map()]
    codes += [F.create_dynamic_map(True, b, b) for b in range(2, 9)]
    codes += [F.create_fp8_map(True, -(-b // 2), b - -(-b // 2) - 1, b) for b in range(2, 9)]
    codes += [F.create_fp8_map(True, e, 7 - e) for e in range(1, 7)]
    for c in codes:
        c = c.asnumpy()
        assert c.shape == (256,) and np.isfinite(c).all() and np.abs(c).max() == 1.0


# ---- e. optimizer hyper-parameters given per parameter group or by override ---------------------------------------
def _p():
    return torch.nn.Parameter(torch.tensor(np.random.RandomState(0).randn(300).astype(np.float32)))


GROUP_BAD = [("lr", -1.0, r"Invalid learning rate: -1.0"), ("eps", -1e-8, r"Invalid epsilon value: -1e-08"),
             ("weight_decay", -0.1, r"Invalid weight_decay value: -0.1"), ("lr", float("nan"), "Invalid learning rate"),
             ("betas", (1.0, 0.999), r"Invalid beta parameter at index 0: 1.0"),
             ("betas", (0.9, -0.5), r"Invalid beta parameter at index 1: -0.5")]


OPTS = ["Adam8bit", "AdamW8bit", "Lion8bit", "RMSprop8bit", "Adagrad8bit", "AdEMAMix8bit", "PagedAdamW8bit", "Adam"]


@pytest.mark.parametrize("name,key,value,msg", [(n, *b) for n in OPTS for b in GROUP_BAD  # (no betas argument)
                                                if not (b[0] == "betas" and n in ("RMSprop8bit", "Adagrad8bit"))])
def test_8bit_optimizer_rejects_invalid_group_hyperparameters(name, key, value, msg):
    cls = getattr(bnb.optim, name)
    if key == "betas" and name == "AdEMAMix8bit":
        value = tuple(value) + (0.9999,)
    with pytest.raises(ValueError, match=msg):
        cls([{"params": [_p()], key: value}], min_8bit_size=0)
    opt = cls([_p()], min_8bit_size=0)
    with pytest.raises(ValueError, match=msg):
        opt.add_param_group({"params": [_p()], key: value})
    assert len(opt.param_groups) == 1


def test_sgd8bit_rejects_negative_group_momentum_and_lr():
    with pytest.raises(ValueError, match=r"Invalid learning rate: -0.5"):
        bnb.optim.SGD8bit([{"params": [_p()], "lr": -0.5}], lr=0.1, momentum=0.9)


def test_override_config_rejects_invalid_hyperparameters():
    p = _p()
    mng = bnb.optim.GlobalOptimManager.get_instance()
    with pytest.raises(ValueError, match=r"Invalid learning rate: -1.0"):
        mng.override_config(p, "lr", -1.0)
    with pytest.raises(ValueError, match=r"Invalid beta parameter at index 1: 1.5"):
        mng.override_config(p, key_value_dict={"betas": (0.9, 1.5)})
    mng.override_config(p, key_value_dict={"optim_bits": 32, "lr": 0.0})  # valid values still go through


# ---- f. a 0 in a block whose 1/absmax overflows stays 0 -------------------------------------------------------
def _tiny_blocks(rng, n, scale):
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    x[::3] = 0.0
    x[1::7] = -0.0
    return x


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("blocksize", [64, 256, 4096])
@pytest.mark.parametrize("scale", [1e-41, 3e-40, 1e-39])
def test_blockwise_zero_in_subnormal_block_stays_zero(dtype, blocksize, scale):
    rng = np.random.default_rng(blocksize)
    x = _tiny_blocks(rng, 5000, scale if dtype == "float32" else max(scale, 3e-40))  # (bf16: none near 1e-41)
    t = ms.Tensor(x).astype(getattr(ms, dtype))
    xs = t.astype(ms.float32).asnumpy()
    q, st = F.quantize_blockwise(t, blocksize=blocksize)
    code = st.code.asnumpy()
    rq, ram = R.quantize_blockwise(xs, code, blocksize)
    np.testing.assert_array_equal(q.asnumpy(), rq)  # kernels == numpy reference
    np.testing.assert_array_equal(st.absmax.asnumpy(), ram)
    back = F.dequantize_blockwise(q, st).astype(ms.float32).asnumpy()
    assert np.count_nonzero(back[xs == 0]) == 0
    live = np.repeat(ram > 0, blocksize)[: xs.size]  # (an all-zero block stores codes 0 and absmax 0)
    assert live.any() and (q.asnumpy()[(xs == 0) & live] == np.argmin(np.abs(code))).all()


def test_blockwise_zero_in_normal_block_keeps_upstream_code():
    # bit-exactness with upstream's grid elsewhere: a 0 in a normal block takes the code of its grid bin (131,
    # 2.125e-5 of the dynamic map), as upstream's CPU kernel
    x = np.float32([0.0, 0.5, -1.0, 1e-40] * 16)
    q, st = F.quantize_blockwise(ms.Tensor(x), blocksize=64)
    assert q.asnumpy()[0] == 131 and q.asnumpy()[3] == 131


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_4bit_zero_in_subnormal_block_stays_zero(quant_type, dtype):
    x = _tiny_blocks(np.random.default_rng(7), 64 * 40, 1e-39)
    t = ms.Tensor(x.reshape(40, 64)).astype(getattr(ms, dtype))
    q, st = F.quantize_4bit(t, blocksize=64, quant_type=quant_type)
    back = F.dequantize_4bit(q, st).astype(ms.float32).asnumpy().reshape(-1)
    assert np.count_nonzero(back[t.astype(ms.float32).asnumpy().reshape(-1) == 0]) == 0


# ---- found by the generators (tests/test_fuzz_issue34.py); each failed before its fix -----------------------------
@pytest.mark.parametrize("fn,kw,exc,msg", [
    ("create_dynamic_map", dict(max_exponent_bits=0.5), TypeError, r"`max_exponent_bits` must be an int; got float"),
    ("create_dynamic_map", dict(total_bits=None), TypeError, r"`total_bits` must be an int; got NoneType"),
    ("create_dynamic_map", dict(total_bits=-1), ValueError, r"`total_bits` must be in \[0, 8\]; got -1"),
    ("create_dynamic_map", dict(signed=False, max_exponent_bits=1, total_bits=1), ValueError,
     r"`max_exponent_bits` 1 gives 3 values, `total_bits` 1 needs 2\*\*total_bits = 2"),
    ("create_linear_map", dict(total_bits="8"), TypeError, r"`total_bits` must be an int; got str"),
    ("create_linear_map", dict(total_bits=10), ValueError, r"`total_bits` must be in \[1, 8\]; got 10"),
    ("create_fp8_map", dict(exponent_bits=5, precision_bits=5), ValueError,
     r"`exponent_bits` 5 \+ `precision_bits` 5 \+ `signed` 1 != `total_bits` 8"),
    ("create_fp8_map", dict(precision_bits=40, exponent_bits=0, total_bits=41), ValueError,
     r"`precision_bits` must be in \[0, 8\]; got 40")])  # (2**40 loop steps before)
def test_code_maps_name_the_argument_of_a_bad_type_or_range(fn, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        getattr(F, fn)(**kw)


@pytest.mark.parametrize("name,kw,exc,msg", [
    ("SGD8bit", dict(lr=0.1, momentum=5), ValueError, r"Invalid beta parameter at index 0: 5 \(SGD8bit: `momentum` "
                                                      r"must be in \[0, 1\)"),
    ("LARS", dict(lr=0.1, momentum="0.1"), TypeError, r"LARS: `momentum` must be a number; got str"),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=1.5), ValueError, r"`dampening` must be in \[0, 1\)"),
    ("RMSprop8bit", dict(alpha=-0.5), ValueError, r"`alpha` must be in \[0, 1\)"),
    ("AdEMAMix8bit", dict(t_alpha=0), ValueError, r"`t_alpha` must be None or a number of steps > 0; got 0"),
    ("AdEMAMix8bit", dict(t_beta3="0.1"), ValueError, r"`t_beta3` must be None or a number of steps > 0; got '0.1'")])
def test_optimizer_arguments_passed_on_as_betas_or_schedules_are_named(name, kw, exc, msg):
    """SGD/LARS momentum and dampening, RMSprop alpha: upstream's 1-state optimizers check them as betas (the error
    named `betas`); AdEMAMix's t_alpha = 0 divided by zero at the first step, a string one failed inside it."""
    with pytest.raises(exc, match=msg):
        getattr(bnb.optim, name)([_p()], **kw).step(grads=[torch.tensor(np.ones(300, np.float32))])


def test_optimizer_momentum_and_schedules_in_range_still_step():
    for name, kw in [("SGD8bit", dict(lr=0.1, momentum=0.9, dampening=0.1)), ("RMSprop8bit", dict(alpha=0.9)),
                     ("AdEMAMix8bit", dict(t_alpha=10, t_beta3=10))]:
        p = _p()
        before = p.asnumpy().copy()
        getattr(bnb.optim, name)([p], **kw).step(grads=[torch.tensor(np.ones(300, np.float32))])
        after = p.asnumpy()
        assert np.isfinite(after).all() and not np.array_equal(after, before), name
