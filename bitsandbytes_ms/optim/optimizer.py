"""Optimizer base classes and GlobalOptimManager (upstream ``bitsandbytes.optim.optimizer``, 0.50).

The optimizers work on mindspore / mindtorch (mindnlp's ``torch``) parameters and are mindtorch
``torch.optim.Optimizer`` instances. mindtorch's own ``loss.backward()`` fills no ``p.grad``; after
``bitsandbytes_ms.register()`` it does (``integrations/backward.py``), or gradients come from
``mindspore.value_and_grad`` / ``torch.autograd.value_and_grad``. So ``step()`` takes them two ways:

* ``p.grad`` (from ``loss.backward()`` or set by hand), then ``opt.step()`` (torch style), or
* ``opt.step(grads=grads)`` with ``grads`` a sequence in parameter order (all groups, in order;
  ``None`` entries skip a parameter) or a dict ``{param: grad}``.

Updates run in place in the parameters' buffers through the fused native kernels
(:func:`bitsandbytes_ms.functional.optimizer_update_32bit` / ``optimizer_update_8bit_blockwise``).
State is float32 (``optim_bits=32`` or tensors with fewer than ``min_8bit_size`` elements) or
blockwise 8-bit (uint8 + float32 absmax per 256 elements, signed dynamic code for the first and
unsigned dynamic code for the second state).

Paged optimizers (``is_paged=True``): there is no unified memory on CPU, so paged variants keep
their state in ordinary host memory and behave exactly as the unpaged ones.
"""

from __future__ import annotations

import math
import weakref
from collections import abc as container_abcs
from collections import defaultdict
from copy import deepcopy
from typing import Any, Dict, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor
# mindnlp's `torch.optim.Optimizer` (the same class once `import mindnlp` makes `torch` mindtorch); importing it
# does not import mindnlp or transformers (measured: +0.1 s over `import mindspore`)
from mindtorch.optim import Optimizer as _TorchOptimizer

from ..integrations import mindtorch_copies as _mindtorch_copies
from ..integrations import mindtorch_device as _mindtorch_device

_mindtorch_device.ensure()  # mindtorch took over mindspore.Tensor's operators: a clear error for plain MindSpore (that module)
_mindtorch_copies.ensure()  # a step writes each parameter in place: copies of it (deepcopy, copy_) own their memory

from .. import functional as F
from ..utils import ITEMSIZES, NP_DTYPES, Singleton
from .._ops import tag as tag_device


class MockArgs:
    def __init__(self, initial_data):
        for key in initial_data:
            setattr(self, key, initial_data[key])


class GlobalOptimManager(Singleton):
    """Per-parameter config overrides (e.g. 32-bit state for embeddings), a singleton.

    ``override_config`` may be called before or after ``register_parameters`` and before the first
    ``step``; each parameter gets its own copy of the override dict."""

    def initialize(self):
        self.pid2config = {}
        self.index2config = {}
        self.optimizer = None
        self.uses_config_override = False
        self.module_weight_config_triple = []

    def register_parameters(self, params):
        param_groups = list(params)
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group_index, group in enumerate(param_groups):
            for p_index, p in enumerate(group["params"]):
                if id(p) in self.pid2config:
                    self.index2config[(group_index, p_index)] = self.pid2config[id(p)]

    def override_config(self, parameters, key=None, value=None, key_value_dict=None):
        """Overrides optimizer hyper-parameters (e.g. ``optim_bits``, ``lr``, ``betas``) for the given
        parameter(s)."""
        self.uses_config_override = True
        if isinstance(parameters, Tensor):
            parameters = [parameters]
        if key is not None and value is not None:
            if key_value_dict is not None:
                raise ValueError("override_config: give either `key`/`value` or `key_value_dict`, not both")
            key_value_dict = {key: value}
        if key_value_dict is None:
            raise ValueError("override_config: `key`/`value` or `key_value_dict` is required")
        _check_hyper_values(key_value_dict, "override_config")
        for p in parameters:
            if id(p) in self.pid2config:
                self.pid2config[id(p)].update(key_value_dict)
            else:
                self.pid2config[id(p)] = dict(key_value_dict)  # own copy per parameter

    def register_module_override(self, module, param_name, config):
        self.module_weight_config_triple.append((module, param_name, config))


def _zeros(shape, dtype) -> Tensor:
    if dtype == ms.bfloat16:  # made in float32 and cast
        t = Tensor(np.zeros(tuple(shape), dtype=np.float32)).astype(dtype)
    else:
        t = Tensor(np.zeros(tuple(shape), dtype=NP_DTYPES[dtype]))
    tag_device(t)
    return t


def _clone(t: Tensor) -> Tensor:
    if t.dtype == ms.bfloat16:
        c = Tensor(t.astype(ms.float32).asnumpy()).astype(ms.bfloat16)
    else:
        c = Tensor(t.asnumpy().copy())
    tag_device(c, like=(t,))
    return c


def _numel(t) -> int:
    return int(math.prod(t.shape))


#: every live optimizer of ours: the `loss.backward()` patch (integrations/backward.py) records a forward only for
#: a module whose trainable parameters one of them holds
LIVE_OPTIMIZERS: "weakref.WeakSet[Optimizer8bit]" = weakref.WeakSet()


class Optimizer8bit(_TorchOptimizer):
    """Base class: param groups, state, ``zero_grad``, ``step``, ``state_dict`` / ``load_state_dict``.

    A ``torch.optim.Optimizer`` (mindtorch's, as upstream's subclasses torch's), so LR schedulers
    (``torch.optim.lr_scheduler.*``, transformers' ``get_*_schedule_*``), step hooks and HF Trainer accept it;
    state handling and stepping are ours (fused native kernels, 8-bit state, checked ``load_state_dict``)."""

    def __init__(self, params, defaults, optim_bits=32, is_paged=False):
        self.defaults = defaults
        self.state: Dict[Any, Dict[str, Any]] = defaultdict(dict)
        self.param_groups = []
        self.initialized = False
        self.name2qmap: Dict[str, Tensor] = {}
        self.is_paged = is_paged  # no unified memory on CPU: state stays in host memory
        self.page_mng = None
        self.mng = GlobalOptimManager.get_instance()
        self.non_castable_tensor_keys = {"qmap1", "qmap2", "max1", "max2", "new_max1", "new_max2", "state1",
                                         "state2", "gnorm_vec", "absmax1", "absmax2", "unorm_vec"}
        if optim_bits == 8:
            self.fill_qmap()
        if isinstance(params, Tensor):  # torch's check (mindtorch's own message fails to name the type)
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, but "
                            f"got a {type(params).__name__} of shape {tuple(params.shape)}: pass [tensor]")
        # torch's init: step hooks, then add_param_group (ours) for each group; it sets `state`,
        # `param_groups` and `defaults` as above
        _TorchOptimizer.__init__(self, params, defaults)
        LIVE_OPTIMIZERS.add(self)

    # -- torch.optim.Optimizer interface ------------------------------------------------------------
    def add_param_group(self, param_group):
        """torch's ``add_param_group``: the group's ``params`` a tensor or an ordered collection of tensors or of
        ``(name, tensor)`` pairs (``model.named_parameters()``: the names kept as ``param_names``), each a leaf
        tensor in no other group; the optimizer's defaults fill the group's missing hyper-parameters."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                            "tensors in sets will change between runs. Please use a list instead.")
        params = [params] if isinstance(params, Tensor) else list(params)
        named = [isinstance(p, tuple) and len(p) == 2 for p in params]
        if any(named):
            if not all(named):
                raise ValueError("all optimizer params should be with/without names. Some param names are missing")
            param_group["param_names"] = [n for n, _ in params]
            params = [p for _, p in params]
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not (getattr(p, "is_leaf", True) or getattr(p, "retains_grad", False)):
                raise ValueError("can't optimize a non-leaf Tensor")
        if any(("param_names" in g) != ("param_names" in param_group) for g in self.param_groups):
            raise ValueError("all optimizer param groups should be with/without names (model.named_parameters() in "
                             "every group, or in none)")
        param_group["params"] = params
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        _check_hyper_values(param_group, type(self).__name__)
        ids = [id(p) for p in param_group["params"]]
        if len(set(ids)) != len(ids):
            first = next(i for i, x in enumerate(ids) if ids.index(x) != i)
            raise ValueError(f"optimizer: parameter group {len(self.param_groups)} lists a parameter twice (index "
                             f"{ids.index(ids[first])} and {first}); it would be stepped twice per step (torch warns "
                             "that this will become an error): pass each parameter once")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        _TorchOptimizer.__setstate__(self, state)  # also restores torch's hook dicts

    def zero_grad(self, set_to_none: bool = True):
        """Gradients to None, or (``set_to_none=False``) to zeros of their shape and dtype, as torch's."""
        for group in self.param_groups:
            for p in group["params"]:
                g = getattr(p, "grad", None)
                if g is None:
                    continue
                try:
                    p.grad = None if set_to_none else _zeros(g.shape, g.dtype)
                except AttributeError:  # pragma: no cover
                    pass

    def fill_qmap(self):
        self.name2qmap["dynamic"] = F.create_dynamic_map(signed=True)
        self.name2qmap["udynamic"] = F.create_dynamic_map(signed=False)

    def state_dict(self):
        """``{"state": {index: {...}}, "param_groups": [...]}`` with parameters replaced by indices;
        tensors are copies (later steps do not change a saved dict)."""
        index_of, start = {}, 0
        groups = []
        for g in self.param_groups:
            index_of.update({id(p): i for i, p in enumerate(g["params"], start) if id(p) not in index_of})
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index_of[id(p)] for p in g["params"]]
            start += len(g["params"])
            groups.append(packed)
        state = {}
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) in self._state_ids():
                    st = self.state[p]
                    state[index_of[id(p)]] = {k: (_clone(v) if isinstance(v, Tensor) else deepcopy(v))
                                              for k, v in st.items()}
        return {"state": state, "param_groups": groups}

    def _state_ids(self):
        return {id(k) for k in self.state}

    def load_state_dict(self, state_dict, move_to_device=True):
        """Restores a :meth:`state_dict`. Tensors keep their dtypes (qmaps, absmax and 8-bit states are
        never cast to the parameter dtype; upstream's cast produced NaN for AdEMAMix). ``move_to_device``
        is accepted as upstream's (everything stays in host memory on CPU). Upstream 0.50's format (each
        parameter's quantization tensors nested under ``"__bnb_optimizer_quant_state__"``) loads as well, and a
        state dict saved by bitsandbytes < 0.44 (groups without ``alpha``/``t_alpha``/``t_beta3``) gets upstream's
        defaults for them (alpha 0, no warm-up).

        Raises ValueError naming the key for a dict that is not an optimizer state dict, a group without
        one of this optimizer's hyper-parameters, or a parameter state this optimizer cannot step (e.g.
        the state dict of another optimizer: a missing ``state2``, an 8-bit state without ``absmax1``)."""
        if not isinstance(state_dict, container_abcs.Mapping):
            raise TypeError(f"load_state_dict: `state_dict` must be a dict; got {type(state_dict).__name__}")
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"load_state_dict: `state_dict` has no {key!r} key (keys: {sorted(map(str, state_dict))}); "
                                 "expected the dict returned by an optimizer's state_dict()")
        state_dict = deepcopy({"param_groups": state_dict["param_groups"]}) | {"state": _unwrap_quant_state(state_dict["state"])}
        groups = self.param_groups
        saved_groups = state_dict["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError(f"loaded state dict has a different number of parameter groups: `param_groups` holds "
                             f"{len(saved_groups)}, the optimizer has {len(groups)} (load_state_dict expects the same)")
        legacy = None  # the error for a group without the keys added in 0.44, if its state turns out not to fit either
        for gi, s in enumerate(saved_groups):
            if "params" not in s:
                raise ValueError(f"load_state_dict: param_groups[{gi}] has no 'params' key")
            missing = [k for k in self.defaults if k not in s]
            if missing:
                err = (f"load_state_dict: param_groups[{gi}] lacks {missing[0]!r} (a hyper-parameter of "
                       f"{type(self).__name__}: {sorted(self.defaults)}); is it the state dict of another optimizer?")
                if any(k not in _PRE_044_GROUP_KEYS for k in missing):
                    raise ValueError(err)
                legacy = legacy or err
        for gi, (g, s) in enumerate(zip(groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"loaded state dict contains a parameter group that doesn't match the size of "
                                 f"optimizer's group: `param_groups[{gi}]['params']` lists {len(s['params'])}, the "
                                 f"optimizer's group {gi} has {len(g['params'])} (load_state_dict expects the same)")
        id_map = {old: p for s, g in zip(saved_groups, groups) for old, p in zip(s["params"], g["params"])}
        try:
            for k, v in state_dict["state"].items():
                if k in id_map:
                    self._check_loaded_state(k, id_map[k], v)
        except ValueError as e:
            if legacy is None:
                raise
            raise ValueError(f"{legacy} ({e})") from None
        if legacy is not None:
            # a state dict saved by bitsandbytes < 0.44 (no AdEMAMix keys) whose state fits: upstream steps it with
            # alpha 0 and no warm-up (its get_config defaults, PR #1647); the groups get those values
            for s in saved_groups:
                for k, v in _PRE_044_GROUP_KEYS.items():
                    if k in self.defaults and k not in s:
                        s[k] = v
        self.state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                p = id_map[k]
                self.state[p] = {kk: (_clone(vv) if isinstance(vv, Tensor) else deepcopy(vv)) for kk, vv in v.items()}
        new_groups = []
        for g, s in zip(groups, saved_groups):
            s = dict(s)
            s["params"] = g["params"]
            new_groups.append(s)
        self.param_groups = new_groups

    def _state_layout(self, p):
        """(state1 shape, whether the optimizer has a second state) for parameter p."""
        name = getattr(self, "optimizer_name", None)
        s1 = (2, *p.shape) if name == "ademamix" else tuple(p.shape)
        return s1, isinstance(self, Optimizer2State)

    def _check_loaded_state(self, index, p, st) -> None:
        where = f"load_state_dict: state[{index!r}]"
        if not isinstance(st, container_abcs.Mapping):
            raise ValueError(f"{where} must be a dict of state tensors; got {type(st).__name__}")
        if not hasattr(self, "optimizer_name"):
            return  # PytorchLARS: its own state layout
        s1_shape, two = self._state_layout(p)
        need = ["step", "state1"] + (["state2"] if two else [])
        for key in need:
            if key not in st:
                raise ValueError(f"{where} has no {key!r} key (found {sorted(map(str, st))}); "
                                 f"{type(self).__name__} needs {need}: is it the state dict of another optimizer?")
        for key, shape in (("state1", s1_shape), ("state2", tuple(p.shape))):
            if key not in need:
                continue
            t = st[key]
            if not isinstance(t, Tensor) or t.dtype not in (ms.float32, ms.uint8):
                raise ValueError(f"{where}[{key!r}] must be a float32 or uint8 tensor; got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}")
            if tuple(t.shape) != shape:
                raise ValueError(f"{where}[{key!r}] must have shape {shape} for a parameter of shape {tuple(p.shape)}; "
                                 f"got {tuple(t.shape)}: is it the state dict of another optimizer?")
        if st["state1"].dtype == ms.uint8:
            for key in ("qmap1", "absmax1") + (("qmap2", "absmax2") if two else ()):
                if key not in st:
                    raise ValueError(f"{where} holds 8-bit state but no {key!r} key (found {sorted(map(str, st))})")

    # -- upstream's paging helpers: there is no unified memory on CPU ---------------------------------
    def get_state_buffer(self, p, dtype=ms.float32):
        """A zero-filled state buffer shaped like p (paged or not: host memory on CPU)."""
        return _zeros(p.shape, dtype)

    def prefetch_state(self, p):
        """Upstream prefetches paged state to the GPU; on CPU there is nothing to move."""
        return None

    def to_gpu(self):
        """Upstream moves non-paged state to the parameters' device; on CPU it already is there."""
        return None

    # -- stepping ------------------------------------------------------------------------------------
    def check_overrides(self):
        for module, attr, config in self.mng.module_weight_config_triple:
            pmodule = getattr(module, attr)
            assert pmodule is not None
            for gindex, group in enumerate(self.param_groups):
                for pindex, p in enumerate(group["params"]):
                    if id(p) == id(pmodule):
                        self.mng.pid2config[id(p)] = config
                        self.mng.index2config[(gindex, pindex)] = self.mng.pid2config[id(p)]

    def _grads_by_id(self, grads):
        if grads is None:
            return None
        if isinstance(grads, dict):
            return {id(k): v for k, v in grads.items()}
        params = [p for g in self.param_groups for p in g["params"]]
        grads = list(grads)
        if len(grads) != len(params):
            raise ValueError(f"step: `grads` has {len(grads)} entries but the optimizer has {len(params)} parameters")
        return {id(p): g for p, g in zip(params, grads)}

    def step(self, closure=None, grads=None):
        """Performs one optimization step. ``grads``: optional gradients (sequence in parameter
        order or ``{param: grad}``); otherwise ``p.grad`` is used. Parameters without a gradient are
        skipped (as upstream); a step in which no parameter has one raises RuntimeError (:func:`_no_grad_error`)
        instead of returning without an update."""
        loss = None
        if closure is not None:
            loss = closure()
        if not self.initialized:
            self.check_overrides()
            self.initialized = True
        by_id = self._grads_by_id(grads)
        stepped = 0
        for gindex, group in enumerate(self.param_groups):
            for pindex, p in enumerate(group["params"]):
                g = by_id.get(id(p)) if by_id is not None else getattr(p, "grad", None)
                if g is None:
                    continue
                stepped += 1
                if not isinstance(g, Tensor):
                    g = Tensor(np.asarray(g))
                if g.dtype != p.dtype:
                    g = g.astype(p.dtype)
                state = self.state[p]
                if len(state) == 0:
                    self.init_state(group, p, gindex, pindex)
                self.prefetch_state(p)
                self.update_step(group, p, gindex, pindex, g)
        if stepped == 0:
            raise _no_grad_error(type(self).__name__, grads is not None)
        return loss

    def get_config(self, gindex, pindex, group):
        config = {
            "betas": group["betas"], "eps": group["eps"], "weight_decay": group["weight_decay"], "lr": group["lr"],
            "alpha": group.get("alpha", 0.0), "t_alpha": group.get("t_alpha"), "t_beta3": group.get("t_beta3"),
            "optim_bits": self.args.optim_bits, "min_8bit_size": self.args.min_8bit_size,
            "max_unorm": self.args.max_unorm, "skip_zeros": self.args.skip_zeros,
        }
        if (gindex, pindex) in self.mng.index2config:
            config.update(self.mng.index2config[(gindex, pindex)])
        p = self.param_groups[gindex]["params"][pindex]
        if id(p) in self.mng.pid2config:  # override_config after registration
            config.update(self.mng.pid2config[id(p)])
        return config

    def _use_32bit(self, config, p) -> bool:
        bits = config["optim_bits"]
        if bits not in (8, 32):  # upstream's init_state raises this at the first step, for any tensor size
            raise NotImplementedError(f"Amount of optimizer bits not supported: {bits} (`optim_bits` must be 8 or 32)")
        return bits == 32 or _numel(p) < config["min_8bit_size"]

    def init_state(self, group, p, gindex, pindex):
        raise NotImplementedError

    def update_step(self, group, p, gindex, pindex, g):
        raise NotImplementedError


#: upstream 0.50's Optimizer8bit.state_dict() nests each parameter's quantization tensors (state1, state2, qmap1,
#: absmax1, ...) under this key (for FSDP, PR #1840); its load_state_dict unwraps them, and so does ours
_WRAPPED_QUANT_STATE_KEY = "__bnb_optimizer_quant_state__"

#: the param-group keys added in bitsandbytes 0.44 (AdEMAMix), with the values upstream's get_config uses where a
#: loaded group lacks them (alpha 0, no warm-up: t_alpha / t_beta3 None here mean what 0 means there)
_PRE_044_GROUP_KEYS = {"alpha": 0.0, "t_alpha": None, "t_beta3": None}


def _unwrap_quant_state(state):
    """``state_dict["state"]`` with upstream's wrapped quantization tensors merged back into each parameter's state
    (the caller's dicts are not changed); anything else as given."""
    if not isinstance(state, container_abcs.Mapping):
        return state
    out = {}
    for k, v in state.items():
        if isinstance(v, container_abcs.Mapping) and isinstance(v.get(_WRAPPED_QUANT_STATE_KEY), container_abcs.Mapping):
            v = dict(v)
            v.update(v.pop(_WRAPPED_QUANT_STATE_KEY))
        out[k] = v
    return out


def _no_grad_error(owner: str, grads_given: bool) -> RuntimeError:
    """The error of a step that would update nothing (the silent no-op of issue 33)."""
    if grads_given:
        what = "every entry of `grads` is None"
    else:
        what = ("no parameter has a gradient (every .grad is None) and no `grads=` was given; mindtorch's own "
                "loss.backward() fills no .grad")
    return RuntimeError(
        f"{owner}.step(): {what}, so this step would update nothing. On MindSpore either call "
        "bitsandbytes_ms.register() before the forward and run it with the model in training mode (model.train()) so "
        "that loss.backward() fills .grad, or compute gradients with torch.autograd.value_and_grad(loss_fn, params, "
        "attach_grads=False) (or mindspore.value_and_grad) and call opt.step(grads=grads).")


#: upstream's words for each hyper-parameter in its "Invalid ..." errors
_HYPER_WORDS = {"lr": "learning rate", "eps": "epsilon value", "weight_decay": "weight_decay value",
                "momentum": "momentum value"}


def _check_nonnegative(owner: str, **values) -> None:
    """Upstream's checks of the hyper-parameters that must be >= 0 (its messages, ``Invalid learning rate: -1``),
    with the argument named; a value that is not a number is a TypeError naming it (not a failed comparison)."""
    for arg, v in values.items():
        try:
            # torch compares `0.0 <= lr`, a TypeError for a string: float("0.1") must not let one through
            ok = 0.0 <= float(v) and not isinstance(v, (str, bytes))
        except (TypeError, ValueError):
            ok = None
        if ok is None or isinstance(v, (str, bytes)):
            raise TypeError(f"{owner}: `{arg}` must be a number; got {type(v).__name__} {v!r}") from None
        if not ok:
            raise ValueError(f"Invalid {_HYPER_WORDS[arg]}: {v} ({owner}: `{arg}` must be >= 0)")


def _check_betas(betas, count: int, owner: str) -> tuple:
    """``betas`` as a tuple of ``count`` numbers in [0, 1) (upstream's "Invalid beta parameter at index i" error);
    a string in upstream's format ``"(beta1, beta2)"`` is parsed as upstream does. Anything else is a ValueError
    naming ``betas`` and saying what was expected."""
    what = "(beta1, beta2, beta3)" if count == 3 else "(beta1, beta2)"
    bad = ValueError(f"{owner}: `betas` must be a sequence of {count} floats {what}; got {betas!r}")
    if isinstance(betas, str):
        try:
            betas = tuple(float(b) for b in betas.replace("(", "").replace(")", "").strip().split(","))
        except ValueError:
            raise bad from None
    try:
        ok = len(betas) >= count and all(isinstance(b, (int, float, np.floating, np.integer)) for b in betas)
    except TypeError:
        ok = False
    if not ok:
        raise bad
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b} ({owner}: `betas` must be in [0, 1))")
    return betas


def _check_beta_args(owner: str, **values) -> None:
    """Hyper-parameters that upstream's 1-state optimizers pass on as ``betas`` (SGD/LARS: momentum, dampening;
    RMSprop: alpha, momentum): numbers in [0, 1), as upstream's beta check, with the error naming the argument
    the caller gave rather than ``betas`` (issue 34)."""
    for i, (arg, v) in enumerate(values.items()):
        try:
            ok = 0.0 <= float(v) < 1.0 and not isinstance(v, str)  # (a string would fail as a beta)
        except (TypeError, ValueError):
            ok = None
        if ok is None or isinstance(v, str):
            raise TypeError(f"{owner}: `{arg}` must be a number; got {type(v).__name__} {v!r}")
        if not ok:
            raise ValueError(f"Invalid beta parameter at index {i}: {v} ({owner}: `{arg}` must be in [0, 1); upstream "
                             f"passes it to the update as betas[{i}])")


def _check_schedule(owner: str, **values) -> None:
    """AdEMAMix's warm-up lengths ``t_alpha`` / ``t_beta3``: None (no warm-up) or a number of steps > 0 (the
    update divides by them)."""
    for arg, v in values.items():
        if v is None:
            continue
        try:
            ok = float(v) > 0 and not isinstance(v, (bool, str))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{owner}: `{arg}` must be None or a number of steps > 0; got {v!r}")


def _check_hyper_values(values: dict, owner: str) -> None:
    """The checks the constructors make, for hyper-parameters given per parameter group (or by override_config):
    lr, eps, weight_decay, momentum >= 0 and betas in [0, 1), with torch's messages (issue 34)."""
    _check_nonnegative(owner, **{k: values[k] for k in _HYPER_WORDS if k in values})
    b = values.get("betas")
    if b is not None:
        values["betas"] = _check_betas(b, len(b) if isinstance(b, (tuple, list)) else 2, owner)


def _blocks(n: int) -> int:
    return -(-n // F.OPTIM_BLOCKSIZE)


class Optimizer2State(Optimizer8bit):
    """Two-state optimizers (adam, lamb, ademamix)."""

    def __init__(self, optimizer_name, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False, alpha=0.0,
                 t_alpha: Optional[int] = None, t_beta3: Optional[int] = None):
        _check_nonnegative(type(self).__name__, lr=lr, eps=eps)
        betas = _check_betas(betas, 3 if optimizer_name == "ademamix" else 2, type(self).__name__)
        _check_nonnegative(type(self).__name__, weight_decay=weight_decay)
        _check_schedule(type(self).__name__, t_alpha=t_alpha, t_beta3=t_beta3)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, alpha=alpha, t_alpha=t_alpha,
                        t_beta3=t_beta3)
        super().__init__(params, defaults, optim_bits, is_paged)
        if args is None:
            args = MockArgs(dict(optim_bits=optim_bits, min_8bit_size=min_8bit_size, max_unorm=max_unorm,
                                 skip_zeros=skip_zeros))
        self.args = args
        self.optimizer_name = optimizer_name

    def init_state(self, group, p, gindex, pindex):
        config = self.get_config(gindex, pindex, group)
        state = self.state[p]
        state["step"] = 0
        n = _numel(p)
        s1_shape = (2, *p.shape) if self.optimizer_name == "ademamix" else tuple(p.shape)
        if self._use_32bit(config, p):
            state["state1"] = _zeros(s1_shape, ms.float32)
            state["state2"] = _zeros(p.shape, ms.float32)
        else:
            if "dynamic" not in self.name2qmap:
                self.fill_qmap()
            state["state1"] = _zeros(s1_shape, ms.uint8)
            state["qmap1"] = self.name2qmap["dynamic"]
            state["state2"] = _zeros(p.shape, ms.uint8)
            state["qmap2"] = self.name2qmap["udynamic"]
            nb = _blocks(n)
            state["absmax1"] = _zeros((2, nb) if self.optimizer_name == "ademamix" else (nb,), ms.float32)
            state["absmax2"] = _zeros((nb,), ms.float32)
        if config["max_unorm"] > 0.0:
            state["unorm_vec"] = _zeros((1,), ms.float32)

    def _schedules(self, config, step):
        betas = config["betas"]
        beta3 = betas[2] if len(betas) >= 3 else 0.0
        alpha = config["alpha"]
        if self.optimizer_name == "ademamix":
            t_alpha, t_beta3 = config["t_alpha"], config["t_beta3"]
            if t_alpha is not None:
                alpha = min(step * alpha / t_alpha, alpha)
            if t_beta3 is not None:
                ln_b1, ln_b3 = math.log(betas[0]), math.log(beta3)
                s = step / t_beta3
                beta3 = min(math.exp((ln_b1 * ln_b3) / ((1 - s) * ln_b3 + s * ln_b1)), beta3)
        return beta3, alpha

    def update_step(self, group, p, gindex, pindex, g):
        state = self.state[p]
        config = self.get_config(gindex, pindex, group)
        state["step"] += 1
        step = state["step"]
        beta3, alpha = self._schedules(config, step)
        b = config["betas"]
        if state["state1"].dtype == ms.float32:
            F.optimizer_update_32bit(self.optimizer_name, g, p, state["state1"], b[0], config["eps"], step,
                                     config["lr"], state["state2"], b[1], beta3, alpha, config["weight_decay"], 1.0,
                                     state["unorm_vec"] if config["max_unorm"] > 0.0 else None,
                                     max_unorm=config["max_unorm"], skip_zeros=config["skip_zeros"])
        else:
            F.optimizer_update_8bit_blockwise(self.optimizer_name, g, p, state["state1"], state["state2"], b[0], b[1],
                                              beta3, alpha, config["eps"], step, config["lr"], state["qmap1"],
                                              state["qmap2"], state["absmax1"], state["absmax2"],
                                              config["weight_decay"], gnorm_scale=1.0,
                                              skip_zeros=config["skip_zeros"])


class Optimizer1State(Optimizer8bit):
    """One-state optimizers (momentum, lars, rmsprop, adagrad, lion)."""

    def __init__(self, optimizer_name, params, lr=1e-3, betas=(0.9, 0.0), eps=1e-8, weight_decay=0.0, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        _check_nonnegative(type(self).__name__, lr=lr, eps=eps)
        betas = _check_betas(betas, 2, type(self).__name__)
        _check_nonnegative(type(self).__name__, weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, optim_bits, is_paged)
        if args is None:
            args = MockArgs(dict(optim_bits=optim_bits, min_8bit_size=min_8bit_size, max_unorm=max_unorm,
                                 skip_zeros=skip_zeros))
        self.args = args
        self.optimizer_name = optimizer_name

    def init_state(self, group, p, gindex, pindex):
        config = self.get_config(gindex, pindex, group)
        state = self.state[p]
        state["step"] = 0
        if self._use_32bit(config, p):
            state["state1"] = _zeros(p.shape, ms.float32)
        else:
            if "dynamic" not in self.name2qmap:
                self.fill_qmap()
            state["state1"] = _zeros(p.shape, ms.uint8)
            state["qmap1"] = self.name2qmap["dynamic"]
            state["absmax1"] = _zeros((_blocks(_numel(p)),), ms.float32)
        if config["max_unorm"] > 0.0:
            state["unorm_vec"] = _zeros((1,), ms.float32)

    def update_step(self, group, p, gindex, pindex, g):
        state = self.state[p]
        config = self.get_config(gindex, pindex, group)
        state["step"] += 1
        step = state["step"]
        b = config["betas"]
        if state["state1"].dtype == ms.float32:
            F.optimizer_update_32bit(self.optimizer_name, g, p, state["state1"], b[0], config["eps"], step,
                                     config["lr"], None, b[1], 0.0, 0.0, config["weight_decay"], 1.0,
                                     state["unorm_vec"] if config["max_unorm"] > 0.0 else None,
                                     max_unorm=config["max_unorm"], skip_zeros=config["skip_zeros"])
        else:
            F.optimizer_update_8bit_blockwise(self.optimizer_name, g, p, state["state1"], None, b[0], b[1], 0.0, 0.0,
                                              config["eps"], step, config["lr"], state["qmap1"], None,
                                              state["absmax1"], None, config["weight_decay"], gnorm_scale=1.0,
                                              skip_zeros=config["skip_zeros"])


def optimizer_state_bytes(optimizer: Optimizer8bit) -> int:
    """Bytes held by the optimizer's per-parameter state tensors (states, absmax; shared qmaps once)."""
    total, seen = 0, set()
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, Tensor) and id(v) not in seen:
                seen.add(id(v))
                total += _numel(v) * ITEMSIZES.get(v.dtype, 4)
    return total


class PytorchLARS(Optimizer8bit):
    """LARS in plain float32 arithmetic (upstream's ``PytorchLARS``, a torch.optim.Optimizer there): SGD
    with momentum whose step is scaled to at most ``max_unorm * ||p||`` (float32 parameters)."""

    def __init__(self, params, lr=0.01, momentum=0, dampening=0, weight_decay=0, nesterov=False, max_unorm=0.02):
        _check_nonnegative(type(self).__name__, lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        max_unorm=max_unorm)
        super().__init__(params, defaults)

    def init_state(self, group, p, gindex, pindex):
        self.state[p]["step"] = 0

    def update_step(self, group, p, gindex, pindex, g):
        state = self.state[p]
        state["step"] += 1
        f32 = np.float32
        pv = p.asnumpy().astype(f32)
        d_p = g.asnumpy().astype(f32)
        if group["weight_decay"] != 0:
            d_p = d_p + pv * f32(group["weight_decay"])
        update = d_p
        if group["momentum"] != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = d_p.copy()
            else:
                buf = buf.asnumpy() * f32(group["momentum"]) + d_p * f32(1 - group["dampening"])
            state["momentum_buffer"] = _host_tensor(buf)
            update = d_p + buf * f32(group["momentum"]) if group["nesterov"] else buf
        scale = 1.0
        if group["max_unorm"] > 0.0:
            if p.dtype != ms.float32:
                raise TypeError(f"PytorchLARS: max_unorm needs float32 parameters; got {p.dtype}")
            pnorm = float(np.sqrt(np.sum(pv.astype(np.float64) ** 2)))
            unorm = float(np.sqrt(np.sum(update.astype(np.float64) ** 2)))
            if unorm > group["max_unorm"] * pnorm:
                scale = group["max_unorm"] * pnorm / unorm
        new = (pv + update * f32(-group["lr"] * scale)).astype(f32)
        p.copy_(_host_tensor(new).astype(p.dtype))


def _host_tensor(a: np.ndarray) -> Tensor:
    t = Tensor(np.ascontiguousarray(a, dtype=np.float32))
    tag_device(t)
    return t
