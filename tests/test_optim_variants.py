"""The stamped optimizer classes (Adam, Adam8bit, PagedAdam32bit, ... in bitsandbytes_ms/optim/{adagrad,adam,...}.py)
against a snapshot of the hand-written classes they replaced (issue 35, item 2).

For every class exported by ``bitsandbytes_ms.optim`` and defined in those modules: name, ``__module__``,
``__qualname__``, ``__mro__[1]`` (8-bit variants are not subclasses of the plain class, as upstream), docstring and
``inspect.signature(cls.__init__)``; then, with the base ``__init__`` (Optimizer1State / Optimizer2State) patched to
record its call, exactly what reaches it (rule name, optim_bits, is_paged, every argument) for the defaults and for each
probed keyword, or the exception raised (type and text, the 8-bit refusals and Python's own TypeErrors included).
Last, real instances: optim_bits / is_paged / rule as built, a step, pickle, deepcopy and a state_dict round trip.

Regenerate the snapshot only for an intended change: ``python tests/test_optim_variants.py``, paste its output."""

import copy
import inspect
import pickle

import numpy as np
import pytest

from mindspore import Parameter, Tensor

import bitsandbytes_ms as bnb
import bitsandbytes_ms.optim as bo
from bitsandbytes_ms.optim.optimizer import Optimizer1State, Optimizer2State

MODULES = ("adagrad", "adam", "adamw", "ademamix", "lamb", "lars", "lion", "rmsprop", "sgd")

#: keyword -> a valid non-default value, probed on every class (also those without the keyword: Python's TypeError)
PROBES = dict(lr=0.0123, betas=(0.81, 0.982), eps=1.5e-7, weight_decay=0.031, amsgrad=True, optim_bits=8,
              optim_bits_32=32, args="ARGS", min_8bit_size=777, is_paged=True, is_paged_false=False, alpha=0.95,
              t_alpha=100, t_beta3=200, lr_decay=0.1, initial_accumulator_value=0.1, momentum=0.85, dampening=0.1,
              nesterov=True, centered=True, bias_correction=False, adam_w_mode=False, max_unorm=0.5)
#: several bad values at once (the order of the checks shows) and negative values; probed where all keys are accepted
COMBOS = {"amsgrad+optim_bits": dict(amsgrad=True, optim_bits=8), "amsgrad+max_unorm": dict(amsgrad=True, max_unorm=0.5),
          "adagrad_order": dict(lr=-1.0, initial_accumulator_value=0.1, lr_decay=0.1, optim_bits=16),
          "lr_decay+optim_bits": dict(lr_decay=0.1, optim_bits=16), "rmsprop_order": dict(alpha=0, centered=True,
                                                                                            momentum=-1),
          "centered+momentum": dict(centered=True, momentum=-1), "momentum0+dampening": dict(momentum=0, dampening=-1),
          "negative_momentum": dict(momentum=-0.5), "negative_lr": dict(lr=-1.0)}
PARAMS = "P"  # stands for `params` in the recorded calls


def _classes():
    mods = {f"bitsandbytes_ms.optim.{m}" for m in MODULES}
    return {n: c for n, c in sorted(vars(bo).items()) if isinstance(c, type) and c.__module__ in mods}


def _required(cls):
    # LARS / SGD: lr has no default and momentum=0 is refused
    sig = inspect.signature(cls.__init__).parameters
    return {"lr": 0.01, "momentum": 0.9} if sig["lr"].default is inspect.Parameter.empty else {}


class _Recorded(Exception):
    pass


@pytest.fixture
def record_base(monkeypatch):
    def patch(base):
        def init(self, *args, **kwargs):
            raise _Recorded(base.__name__, args, kwargs)
        monkeypatch.setattr(base, "__init__", init)
    patch(Optimizer1State)
    patch(Optimizer2State)


def _call(cls, *args, **kwargs):
    """What the base __init__ receives, as (base, positional args after self, sorted kwargs), or the exception."""
    try:
        cls(*args, **kwargs)
    except _Recorded as e:
        base, a, kw = e.args
        return (base, tuple(PARAMS if x is args[0] else x for x in a), tuple(sorted(kw.items())))
    except Exception as e:  # noqa: BLE001 - the message is what is compared
        return f"!{type(e).__name__}: {e}"
    raise AssertionError(f"{cls.__name__}: the base __init__ was not reached")


def _diff(base_call, call):
    """A probe's result relative to the defaults' call: '=' (ignored), 'a<i>=<v>' / 'k<name>=<v>', or '!Error: msg'."""
    if isinstance(call, str):
        return call
    if call[0] != base_call[0] or len(call[1]) != len(base_call[1]):
        return repr(call)
    out = [f"a{i}={v!r}" for i, (u, v) in enumerate(zip(base_call[1], call[1])) if u != v]
    old, new = dict(base_call[2]), dict(call[2])
    out += [f"k{k}={new.get(k, '<absent>')!r}" for k in sorted(set(old) | set(new)) if old.get(k, object()) != new.get(k)]
    return " ".join(out) or "="


def _probe(cls):
    req = _required(cls)
    pl = [PARAMS]  # a list stand-in; the identity is what _call replaces
    default = _call(cls, pl, **req)
    out = {"()": default if isinstance(default, str) else repr(default)}
    for key, value in PROBES.items():
        name = key.rsplit("_", 1)[0] if key in ("optim_bits_32", "is_paged_false") else key
        betas = inspect.signature(cls.__init__).parameters.get("betas")
        if name == "betas" and betas is not None and len(betas.default) == 3:
            value = value + (0.9991,)
        out[key] = _diff(default, _call(cls, pl, **{**req, name: value}))
    sig = inspect.signature(cls.__init__).parameters
    for key, kw in COMBOS.items():
        if set(kw) <= set(sig):
            out[key] = _diff(default, _call(cls, pl, **{**req, **kw}))
    # Python's own "unexpected keyword argument" TypeErrors are left out: a key absent from the snapshot means that
    return {k: v for k, v in out.items() if v != _unexpected(cls, k)}


def _unexpected(cls, key):
    name = key.rsplit("_", 1)[0] if key in ("optim_bits_32", "is_paged_false") else key
    return f"!TypeError: {cls.__name__}.__init__() got an unexpected keyword argument '{name}'"


def _static(cls):
    return dict(module=cls.__module__.rsplit(".", 1)[1], base=cls.__mro__[1].__name__, doc=cls.__doc__,
                signature=str(inspect.signature(cls.__init__)))


def _params(seed=0):
    rng = np.random.RandomState(seed)
    return [Parameter(Tensor(rng.randn(64, 80).astype(np.float32)), name="w"),
            Parameter(Tensor(rng.randn(33).astype(np.float32)), name="b")]


def _grads(seed):
    rng = np.random.RandomState(seed)
    return [Tensor(rng.randn(64, 80).astype(np.float32) * 0.1), Tensor(rng.randn(33).astype(np.float32) * 0.1)]


def _built(cls):
    opt = cls(_params(), **_required(cls))
    return (opt.args.optim_bits, opt.is_paged, opt.optimizer_name)


def snapshot():
    classes = _classes()
    return {n: dict(_static(c), probes=_probe_unpatched(c), built=_built(c)) for n, c in classes.items()}


def _probe_unpatched(cls):  # for regenerating the snapshot outside pytest
    mp = pytest.MonkeyPatch()
    try:
        for base in (Optimizer1State, Optimizer2State):
            def init(self, *a, _b=base.__name__, **kw):
                raise _Recorded(_b, a, kw)
            mp.setattr(base, "__init__", init)
        return _probe(cls)
    finally:
        mp.undo()


# ---------------------------------------------------------------------------------------------------------------
# the snapshot, taken from the hand-written classes before the refactor (git 2026-12-06)
# ---------------------------------------------------------------------------------------------------------------
SNAPSHOT = {
    'AdEMAMix': dict(
        module='ademamix', base='Optimizer2State', built=(32, False, 'ademamix'),
        doc='AdEMAMix.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, optim_bits=32, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 32, None, 4096), (('alpha', 5.0), ('is_paged', False), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'min_8bit_size': 'a8=777',
               'is_paged': 'kis_paged=True', 'is_paged_false': '=', 'alpha': 'kalpha=0.95',
               't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200', 'negative_lr': 'a2=-1.0'}),
    'AdEMAMix32bit': dict(
        module='ademamix', base='Optimizer2State', built=(32, False, 'ademamix'),
        doc='AdEMAMix32bit.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 32, None, 4096), (('alpha', 5.0), ('is_paged', False), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True',
               'is_paged_false': '=', 'alpha': 'kalpha=0.95', 't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200',
               'negative_lr': 'a2=-1.0'}),
    'AdEMAMix8bit': dict(
        module='ademamix', base='Optimizer2State', built=(8, False, 'ademamix'),
        doc='AdEMAMix8bit.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 8, None, 4096), (('alpha', 5.0), ('is_paged', False), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True',
               'is_paged_false': '=', 'alpha': 'kalpha=0.95', 't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200',
               'negative_lr': 'a2=-1.0'}),
    'Adagrad': dict(
        module='adagrad', base='Optimizer1State', built=(32, False, 'adagrad'),
        doc='Adagrad.',
        signature='(self, params, lr=0.01, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('adagrad', 'P', 0.01, (0.0, 0.0), 1e-10, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'lr_decay': '!ValueError: Lr Decay != 0.0 not supported!',
               'initial_accumulator_value': '!ValueError: Initial accumulator value != 0.0 not supported!',
               'adagrad_order': '!ValueError: Invalid learning rate: -1.0 (Adagrad: `lr` must be >= 0)',
               'lr_decay+optim_bits': '!ValueError: Lr Decay != 0.0 not supported!',
               'negative_lr': '!ValueError: Invalid learning rate: -1.0 (Adagrad: `lr` must be >= 0)'}),
    'Adagrad32bit': dict(
        module='adagrad', base='Optimizer1State', built=(32, False, 'adagrad'),
        doc='Adagrad32bit.',
        signature='(self, params, lr=0.01, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('adagrad', 'P', 0.01, (0.0, 0.0), 1e-10, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'optim_bits': '=',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'lr_decay': '!ValueError: Lr Decay != 0.0 not supported!',
               'initial_accumulator_value': '!ValueError: Initial accumulator value != 0.0 not supported!',
               'adagrad_order': '!ValueError: Invalid learning rate: -1.0 (Adagrad32bit: `lr` must be >= 0)',
               'lr_decay+optim_bits': '!ValueError: Lr Decay != 0.0 not supported!',
               'negative_lr': '!ValueError: Invalid learning rate: -1.0 (Adagrad32bit: `lr` must be >= 0)'}),
    'Adagrad8bit': dict(
        module='adagrad', base='Optimizer1State', built=(8, False, 'adagrad'),
        doc='Adagrad8bit.',
        signature='(self, params, lr=0.01, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=8, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('adagrad', 'P', 0.01, (0.0, 0.0), 1e-10, 0, 8, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'optim_bits': '=',
               'optim_bits_32': '!ValueError: Adagrad8bit: `optim_bits` must be 8; got 32', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'lr_decay': '!ValueError: Lr Decay != 0.0 not supported!',
               'initial_accumulator_value': '!ValueError: Initial accumulator value != 0.0 not supported!',
               'adagrad_order': '!ValueError: Invalid learning rate: -1.0 (Adagrad8bit: `lr` must be >= 0)',
               'lr_decay+optim_bits': '!ValueError: Lr Decay != 0.0 not supported!',
               'negative_lr': '!ValueError: Invalid learning rate: -1.0 (Adagrad8bit: `lr` must be >= 0)'}),
    'Adam': dict(
        module='adam', base='Optimizer2State', built=(32, False, 'adam'),
        doc='Adam: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'amsgrad+optim_bits': 'a6=8', 'negative_lr': 'a2=-1.0'}),
    'Adam32bit': dict(
        module='adam', base='Optimizer2State', built=(32, False, 'adam'),
        doc='Adam32bit: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': '=', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'amsgrad+optim_bits': '=', 'negative_lr': 'a2=-1.0'}),
    'Adam8bit': dict(
        module='adam', base='Optimizer2State', built=(8, False, 'adam'),
        doc='Adam8bit: always 8-bit state.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 8, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '!ValueError: Adam8bit does not support amsgrad=True',
               'optim_bits': '!ValueError: Adam8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got 8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True',
               'is_paged_false': '=', 'amsgrad+optim_bits': '!ValueError: Adam8bit does not support amsgrad=True',
               'negative_lr': 'a2=-1.0'}),
    'AdamW': dict(
        module='adamw', base='Optimizer2State', built=(32, False, 'adam'),
        doc='AdamW: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'amsgrad+optim_bits': 'a6=8', 'negative_lr': 'a2=-1.0'}),
    'AdamW32bit': dict(
        module='adamw', base='Optimizer2State', built=(32, False, 'adam'),
        doc='AdamW32bit: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': '=', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'amsgrad+optim_bits': '=', 'negative_lr': 'a2=-1.0'}),
    'AdamW8bit': dict(
        module='adamw', base='Optimizer2State', built=(8, False, 'adam'),
        doc='AdamW8bit: always 8-bit state.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 8, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '!ValueError: AdamW8bit does not support amsgrad=True',
               'optim_bits': '!ValueError: AdamW8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got 8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True',
               'is_paged_false': '=', 'amsgrad+optim_bits': '!ValueError: AdamW8bit does not support amsgrad=True',
               'negative_lr': 'a2=-1.0'}),
    'LAMB': dict(
        module='lamb', base='Optimizer2State', built=(32, False, 'lamb'),
        doc='LAMB.',
        signature='(self, params, lr=0.001, bias_correction=True, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, adam_w_mode=True, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=1.0)',
        call="('Optimizer2State', ('lamb', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('max_unorm', 1.0),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'bias_correction': '=', 'adam_w_mode': '=', 'max_unorm': 'kmax_unorm=0.5',
               'amsgrad+optim_bits': 'a6=8', 'amsgrad+max_unorm': 'kmax_unorm=0.5', 'negative_lr': 'a2=-1.0'}),
    'LAMB32bit': dict(
        module='lamb', base='Optimizer2State', built=(32, False, 'lamb'),
        doc='LAMB32bit.',
        signature='(self, params, lr=0.001, bias_correction=True, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0)',
        call="('Optimizer2State', ('lamb', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('max_unorm', 1.0),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'bias_correction': '=',
               'adam_w_mode': '=', 'max_unorm': 'kmax_unorm=0.5', 'amsgrad+max_unorm': 'kmax_unorm=0.5',
               'negative_lr': 'a2=-1.0'}),
    'LAMB8bit': dict(
        module='lamb', base='Optimizer2State', built=(8, False, 'lamb'),
        doc='LAMB8bit.',
        signature='(self, params, lr=0.001, bias_correction=True, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0)',
        call="('Optimizer2State', ('lamb', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 8, None, 4096), (('max_unorm', 1.0),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '!ValueError: LAMB8bit does not support amsgrad=True', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'bias_correction': '=', 'adam_w_mode': '=',
               'max_unorm': '!ValueError: LAMB8bit: `max_unorm` other than 1.0 is not supported by the 8-bit update; got 0.5',
               'amsgrad+max_unorm': '!ValueError: LAMB8bit does not support amsgrad=True', 'negative_lr': 'a2=-1.0'}),
    'LARS': dict(
        module='lars', base='Optimizer1State', built=(32, False, 'lars'),
        doc='LARS.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=0.02)',
        call="('Optimizer1State', ('lars', 'P', 0.01, (0.9, 0), 0.0, 0, 32, None, 4096), (('max_unorm', 0.02),))",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8', 'optim_bits_32': '=',
               'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'momentum': 'a3=(0.85, 0)',
               'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=', 'max_unorm': 'kmax_unorm=0.5',
               'momentum0+dampening': '!NotImplementedError: LARS without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (LARS: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
    'LARS32bit': dict(
        module='lars', base='Optimizer1State', built=(32, False, 'lars'),
        doc='LARS32bit.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096, max_unorm=0.02)',
        call="('Optimizer1State', ('lars', 'P', 0.01, (0.9, 0), 0.0, 0, 32, None, 4096), (('max_unorm', 0.02),))",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'momentum': 'a3=(0.85, 0)', 'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=',
               'max_unorm': 'kmax_unorm=0.5',
               'momentum0+dampening': '!NotImplementedError: LARS without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (LARS32bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
    'LARS8bit': dict(
        module='lars', base='Optimizer1State', built=(8, False, 'lars'),
        doc='LARS8bit.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096, max_unorm=0.02)',
        call="('Optimizer1State', ('lars', 'P', 0.01, (0.9, 0), 0.0, 0, 8, None, 4096), (('max_unorm', 0.02),))",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'momentum': 'a3=(0.85, 0)', 'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=',
               'max_unorm': 'kmax_unorm=0.5',
               'momentum0+dampening': '!NotImplementedError: LARS without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (LARS8bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
    'Lion': dict(
        module='lion', base='Optimizer1State', built=(32, False, 'lion'),
        doc='Lion.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True',
               'is_paged_false': '=', 'negative_lr': 'a2=-1.0'}),
    'Lion32bit': dict(
        module='lion', base='Optimizer1State', built=(32, False, 'lion'),
        doc='Lion32bit.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 32, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'negative_lr': 'a2=-1.0'}),
    'Lion8bit': dict(
        module='lion', base='Optimizer1State', built=(8, False, 'lion'),
        doc='Lion8bit.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 8, None, 4096), (('is_paged', False),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': 'kis_paged=True', 'is_paged_false': '=',
               'negative_lr': 'a2=-1.0'}),
    'PagedAdEMAMix': dict(
        module='ademamix', base='Optimizer2State', built=(32, True, 'ademamix'),
        doc='PagedAdEMAMix.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, optim_bits=32, min_8bit_size=4096)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 32, None, 4096), (('alpha', 5.0), ('is_paged', True), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'min_8bit_size': 'a8=777',
               'alpha': 'kalpha=0.95', 't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200',
               'negative_lr': 'a2=-1.0'}),
    'PagedAdEMAMix32bit': dict(
        module='ademamix', base='Optimizer2State', built=(32, True, 'ademamix'),
        doc='PagedAdEMAMix32bit.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, min_8bit_size=4096)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 32, None, 4096), (('alpha', 5.0), ('is_paged', True), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'min_8bit_size': 'a8=777', 'alpha': 'kalpha=0.95',
               't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200', 'negative_lr': 'a2=-1.0'}),
    'PagedAdEMAMix8bit': dict(
        module='ademamix', base='Optimizer2State', built=(8, True, 'ademamix'),
        doc='PagedAdEMAMix8bit.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-08, weight_decay=0.01, min_8bit_size=4096)',
        call="('Optimizer2State', ('ademamix', 'P', 0.001, (0.9, 0.999, 0.9999), 1e-08, 0.01, 8, None, 4096), (('alpha', 5.0), ('is_paged', True), ('t_alpha', None), ('t_beta3', None)))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982, 0.9991)', 'eps': 'a4=1.5e-07',
               'weight_decay': 'a5=0.031', 'min_8bit_size': 'a8=777', 'alpha': 'kalpha=0.95',
               't_alpha': 'kt_alpha=100', 't_beta3': 'kt_beta3=200', 'negative_lr': 'a2=-1.0'}),
    'PagedAdam': dict(
        module='adam', base='Optimizer2State', built=(32, True, 'adam'),
        doc='PagedAdam: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': '=', 'is_paged_false': '=', 'amsgrad+optim_bits': 'a6=8',
               'negative_lr': 'a2=-1.0'}),
    'PagedAdam32bit': dict(
        module='adam', base='Optimizer2State', built=(32, True, 'adam'),
        doc='PagedAdam32bit: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': '=', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'is_paged': '=', 'is_paged_false': '=', 'amsgrad+optim_bits': '=',
               'negative_lr': 'a2=-1.0'}),
    'PagedAdam8bit': dict(
        module='adam', base='Optimizer2State', built=(8, True, 'adam'),
        doc='PagedAdam8bit: always 8-bit state.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0, 8, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '!ValueError: PagedAdam8bit does not support amsgrad=True',
               'optim_bits': '!ValueError: PagedAdam8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got 8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'is_paged': '=',
               'is_paged_false': '=',
               'amsgrad+optim_bits': '!ValueError: PagedAdam8bit does not support amsgrad=True',
               'negative_lr': 'a2=-1.0'}),
    'PagedAdamW': dict(
        module='adamw', base='Optimizer2State', built=(32, True, 'adam'),
        doc='PagedAdamW: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': 'a6=8', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'amsgrad+optim_bits': 'a6=8', 'negative_lr': 'a2=-1.0'}),
    'PagedAdamW32bit': dict(
        module='adamw', base='Optimizer2State', built=(32, True, 'adam'),
        doc='PagedAdamW32bit: amsgrad is accepted and ignored, as upstream.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '=', 'optim_bits': '=', 'optim_bits_32': '=', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'amsgrad+optim_bits': '=', 'negative_lr': 'a2=-1.0'}),
    'PagedAdamW8bit': dict(
        module='adamw', base='Optimizer2State', built=(8, True, 'adam'),
        doc='PagedAdamW8bit: always 8-bit state.',
        signature='(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer2State', ('adam', 'P', 0.001, (0.9, 0.999), 1e-08, 0.01, 8, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031',
               'amsgrad': '!ValueError: PagedAdamW8bit does not support amsgrad=True',
               'optim_bits': '!ValueError: PagedAdamW8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got 8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'amsgrad+optim_bits': '!ValueError: PagedAdamW8bit does not support amsgrad=True',
               'negative_lr': 'a2=-1.0'}),
    'PagedLion': dict(
        module='lion', base='Optimizer1State', built=(32, True, 'lion'),
        doc='PagedLion.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'negative_lr': 'a2=-1.0'}),
    'PagedLion32bit': dict(
        module='lion', base='Optimizer1State', built=(32, True, 'lion'),
        doc='PagedLion32bit.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 32, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'negative_lr': 'a2=-1.0'}),
    'PagedLion8bit': dict(
        module='lion', base='Optimizer1State', built=(8, True, 'lion'),
        doc='PagedLion8bit.',
        signature='(self, params, lr=0.0001, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('lion', 'P', 0.0001, (0.9, 0.99), 0.0, 0, 8, None, 4096), (('is_paged', True),))",
        probes={'lr': 'a2=0.0123', 'betas': 'a3=(0.81, 0.982)', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'negative_lr': 'a2=-1.0'}),
    'RMSprop': dict(
        module='rmsprop', base='Optimizer1State', built=(32, False, 'rmsprop'),
        doc='RMSprop.',
        signature='(self, params, lr=0.01, alpha=0.99, eps=1e-08, weight_decay=0, momentum=0, centered=False, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('rmsprop', 'P', 0.01, (0.99, 0), 1e-08, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8',
               'optim_bits_32': '=', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'alpha': 'a3=(0.95, 0)',
               'momentum': 'a3=(0.99, 0.85)', 'centered': '!NotImplementedError: Centered RMSprop is not supported!',
               'rmsprop_order': '!NotImplementedError: RMSprop with alpha==0.0 is not supported!',
               'centered+momentum': '!NotImplementedError: Centered RMSprop is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 1: -0.5 (RMSprop: `momentum` must be in [0, 1); upstream passes it to the update as betas[1])',
               'negative_lr': 'a2=-1.0'}),
    'RMSprop32bit': dict(
        module='rmsprop', base='Optimizer1State', built=(32, False, 'rmsprop'),
        doc='RMSprop32bit.',
        signature='(self, params, lr=0.01, alpha=0.99, eps=1e-08, weight_decay=0, momentum=0, centered=False, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('rmsprop', 'P', 0.01, (0.99, 0), 1e-08, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'alpha': 'a3=(0.95, 0)', 'momentum': 'a3=(0.99, 0.85)',
               'centered': '!NotImplementedError: Centered RMSprop is not supported!',
               'rmsprop_order': '!NotImplementedError: RMSprop with alpha==0.0 is not supported!',
               'centered+momentum': '!NotImplementedError: Centered RMSprop is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 1: -0.5 (RMSprop32bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[1])',
               'negative_lr': 'a2=-1.0'}),
    'RMSprop8bit': dict(
        module='rmsprop', base='Optimizer1State', built=(8, False, 'rmsprop'),
        doc='RMSprop8bit.',
        signature='(self, params, lr=0.01, alpha=0.99, eps=1e-08, weight_decay=0, momentum=0, centered=False, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('rmsprop', 'P', 0.01, (0.99, 0), 1e-08, 0, 8, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'eps': 'a4=1.5e-07', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'",
               'min_8bit_size': 'a8=777', 'alpha': 'a3=(0.95, 0)', 'momentum': 'a3=(0.99, 0.85)',
               'centered': '!NotImplementedError: Centered RMSprop is not supported!',
               'rmsprop_order': '!NotImplementedError: RMSprop with alpha==0.0 is not supported!',
               'centered+momentum': '!NotImplementedError: Centered RMSprop is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 1: -0.5 (RMSprop8bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[1])',
               'negative_lr': 'a2=-1.0'}),
    'SGD': dict(
        module='sgd', base='Optimizer1State', built=(32, False, 'momentum'),
        doc='SGD.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('momentum', 'P', 0.01, (0.9, 0), 0.0, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'optim_bits': 'a6=8', 'optim_bits_32': '=',
               'args': "a7='ARGS'", 'min_8bit_size': 'a8=777', 'momentum': 'a3=(0.85, 0)',
               'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=',
               'momentum0+dampening': '!NotImplementedError: SGD without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (SGD: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
    'SGD32bit': dict(
        module='sgd', base='Optimizer1State', built=(32, False, 'momentum'),
        doc='SGD32bit.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('momentum', 'P', 0.01, (0.9, 0), 0.0, 0, 32, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'momentum': 'a3=(0.85, 0)', 'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=',
               'momentum0+dampening': '!NotImplementedError: SGD without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (SGD32bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
    'SGD8bit': dict(
        module='sgd', base='Optimizer1State', built=(8, False, 'momentum'),
        doc='SGD8bit.',
        signature='(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096)',
        call="('Optimizer1State', ('momentum', 'P', 0.01, (0.9, 0), 0.0, 0, 8, None, 4096), ())",
        probes={'lr': 'a2=0.0123', 'weight_decay': 'a5=0.031', 'args': "a7='ARGS'", 'min_8bit_size': 'a8=777',
               'momentum': 'a3=(0.85, 0)', 'dampening': 'a3=(0.9, 0.1)', 'nesterov': '=',
               'momentum0+dampening': '!NotImplementedError: SGD without momentum is not supported!',
               'negative_momentum': '!ValueError: Invalid beta parameter at index 0: -0.5 (SGD8bit: `momentum` must be in [0, 1); upstream passes it to the update as betas[0])',
               'negative_lr': 'a2=-1.0'}),
}

CLASSES = sorted(_classes())


def test_snapshot_covers_every_class():
    assert CLASSES == sorted(SNAPSHOT)
    assert len(CLASSES) == 39


@pytest.mark.parametrize("name", CLASSES)
def test_class_identity(name):
    cls = getattr(bnb.optim, name)
    assert _static(cls) == {k: SNAPSHOT[name][k] for k in ("module", "base", "doc", "signature")}
    assert cls.__name__ == cls.__qualname__ == name
    mod = __import__(cls.__module__, fromlist=[name])
    assert getattr(mod, name) is cls
    assert cls.__mro__[1] in (Optimizer1State, Optimizer2State)
    # upstream's variants are siblings, not subclasses of the plain class (Adam8bit is not an Adam)
    assert all(b.__name__ not in CLASSES for b in cls.__mro__[1:])


@pytest.mark.parametrize("name", CLASSES)
def test_what_reaches_the_base_class(name, record_base):
    got = _probe(getattr(bnb.optim, name))
    want = dict(SNAPSHOT[name]["probes"], **{"()": SNAPSHOT[name]["call"]})
    assert got == want


@pytest.mark.parametrize("name", CLASSES)
def test_bits_and_paging_follow_the_name(name, record_base):
    # independent of the snapshot: the name says the state width and the paging
    cls = getattr(bnb.optim, name)
    _, args, kwargs = _call(cls, [PARAMS], **_required(cls))
    assert args[6] == (8 if "8bit" in name else 32)  # Optimizer{1,2}State's optim_bits
    assert dict(kwargs).get("is_paged", False) is name.startswith("Paged")


@pytest.mark.parametrize("name", CLASSES)
def test_python_type_errors(name):
    # the generated __init__ is a real function named <Class>.__init__: Python's own messages are unchanged
    cls = getattr(bnb.optim, name)
    sig = inspect.signature(cls.__init__).parameters.values()
    n, req = len(sig), sum(p.default is inspect.Parameter.empty for p in sig)
    missing = "1 required positional argument: 'params'" if req == 2 else \
        "2 required positional arguments: 'params' and 'lr'"
    assert _call(cls) == f"!TypeError: {name}.__init__() missing {missing}"
    assert _call(cls, [PARAMS], *range(1, 20)) == (f"!TypeError: {name}.__init__() takes from {req} to {n} "
                                                   f"positional arguments but 21 were given")


def test_user_subclasses():
    # messages from hand-written classes (taken before the refactor): the 8-bit refusals name the bnb class,
    # the value checks name type(self), Python's TypeErrors the function's qualname
    p = _params()[1:]

    class MyAdam8bit(bnb.optim.Adam8bit):
        pass

    class MySGD(bnb.optim.SGD8bit):
        def __init__(self, params, lr=0.1, momentum=-0.5):
            super().__init__(params, lr, momentum)

    class MyAdagrad(bnb.optim.Adagrad8bit):
        pass

    assert _call(MyAdam8bit, p, amsgrad=True) == "!ValueError: Adam8bit does not support amsgrad=True"
    assert _call(MySGD, p) == ("!ValueError: Invalid beta parameter at index 0: -0.5 (MySGD: `momentum` must be in "
                               "[0, 1); upstream passes it to the update as betas[0])")
    assert _call(MyAdagrad, p, lr=-1.0) == "!ValueError: Invalid learning rate: -1.0 (MyAdagrad: `lr` must be >= 0)"
    assert _call(MyAdam8bit, p, 1e-3, (0.9, 0.999), 1e-8, 0, False, 32, None, 4096, True, 5) == \
        "!TypeError: Adam8bit.__init__() takes from 2 to 11 positional arguments but 12 were given"
    o = MyAdam8bit(p, is_paged=True)
    assert (o.args.optim_bits, o.is_paged, o.optimizer_name) == (8, True, "adam")


@pytest.mark.parametrize("name", CLASSES)
def test_built_instance(name):
    cls = getattr(bnb.optim, name)
    assert _built(cls) == SNAPSHOT[name]["built"]


@pytest.mark.parametrize("name", CLASSES)
def test_step_pickle_deepcopy_state_dict(name):
    cls = getattr(bnb.optim, name)
    kw = _required(cls)
    ps = _params()
    opt = cls(ps, **kw)
    opt.step(grads=_grads(1))
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert type(clone) is cls
        assert clone.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    qs = [Parameter(Tensor(p.asnumpy().copy()), name=p.name) for p in ps]
    other = cls(qs, **kw)
    other.load_state_dict(opt.state_dict())
    opt.step(grads=_grads(2))
    other.step(grads=_grads(2))
    for p, q in zip(ps, qs):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())


if __name__ == "__main__":
    print("SNAPSHOT = {")
    for n, row in snapshot().items():
        probes = dict(row["probes"])
        call = probes.pop("()")
        print(f"    {n!r}: dict(")
        print(f"        module={row['module']!r}, base={row['base']!r}, built={row['built']!r},")
        print(f"        doc={row['doc']!r},")
        print(f"        signature={row['signature']!r},")
        print(f"        call={call!r},")
        lines, line = [], "        probes={"
        for k, v in probes.items():
            item = f"{k!r}: {v!r}, "
            if len(line) + len(item) > 118 and not line.endswith("{"):
                lines.append(line.rstrip())
                line = " " * 15
            line += item
        print("\n".join(lines + [line.rstrip(", ") + "}),"]))
    print("}")
