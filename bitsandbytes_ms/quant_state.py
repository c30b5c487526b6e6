"""``QuantState``: everything needed to undo a blockwise quantization (upstream's
``bitsandbytes.functional.QuantState``; :mod:`bitsandbytes_ms.functional` re-exports it under that name).

A module of its own, below the format code: it needs only the dtype names and the JSON packing of
:mod:`bitsandbytes_ms.utils`."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
from mindspore import Tensor

from .utils import dtype_from_name, dtype_name, pack_dict_to_tensor, unpack_tensor_to_dict


class QuantState:
    """Everything needed to undo a blockwise quantization (upstream's ``QuantState``).

    Attributes:
        absmax: fp32 [n_blocks] scales (uint8 codes of them when ``nested``).
        shape: shape of the original tensor.
        code: the code (quant_map), fp32 [256] for 8-bit or [16] for 4-bit.
        blocksize: elements per absmax block.
        quant_type: ``"nf4"``/``"fp4"`` for 4-bit, ``None`` for 8-bit.
        dtype: dtype of the original tensor.
        offset: fp32 scalar subtracted from absmax before the second quantization (nested only).
        state2: QuantState of the quantized absmax (nested only).
    """

    valid_quant_types = ("fp4", "nf4")
    valid_qs_type_keys = [f"bitsandbytes__{x}" for x in valid_quant_types]
    valid_qs_keys = ["absmax", "quant_map", "nested_absmax", "nested_quant_map", "quant_state", "quant_type",
                     "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset"]
    _FROM_DICT_KEYS = ("quant_type", "absmax", "quant_map", "blocksize", "dtype", "shape")
    _FROM_DICT_NESTED_KEYS = ("nested_absmax", "nested_quant_map", "nested_blocksize", "nested_dtype", "nested_offset")

    def __init__(self, absmax, shape=None, code=None, blocksize=None, quant_type=None, dtype=None, offset=None,
                 state2=None):
        self.absmax = absmax
        self.shape = tuple(shape) if shape is not None else None
        self.code = code
        self.dtype = dtype
        self.blocksize = blocksize
        self.quant_type = quant_type
        self.offset = offset
        self.state2 = state2
        self.nested = state2 is not None

    def __getattr__(self, name):
        if name.startswith("bitsandbytes__"):
            packed = self.as_dict(packed=True)
            key = "quant_state." + name
            if key in packed:
                return packed[key]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __getitem__(self, idx):
        """Upstream's legacy list layout: [absmax, shape, dtype, blocksize, [offset, state2] | None, quant_type].
        A string key reads :meth:`as_dict`'s entry (``state["absmax"]``), the form a quant state has inside
        ``mindspore.jit`` / GRAPH_MODE (see :mod:`bitsandbytes_ms._graph`), so the same code runs in both modes."""
        if isinstance(idx, str):
            return self.as_dict()[idx]
        nested = [self.offset, self.state2] if self.nested else None
        return [self.absmax, self.shape, self.dtype, self.blocksize, nested, self.quant_type][idx]

    @classmethod
    def from_dict(cls, qs_dict: Dict[str, Any], device=None) -> "QuantState":
        """Rebuilds a QuantState from ``as_dict()`` output (packed or not), prefixes allowed
        (e.g. ``weight.absmax``). ``device`` is accepted for upstream compatibility.

        Raises:
            ValueError: no or several ``quant_state.bitsandbytes__*`` entries, unknown or missing keys (named,
                with the keys a state needs), a packed entry that is not a packed dict, or a bad ``dtype`` name.
        """
        fn = "QuantState.from_dict"
        if not isinstance(qs_dict, dict):
            raise TypeError(f"{fn}: `qs_dict` must be a dict, got {type(qs_dict).__name__}")
        qs_dict = dict(qs_dict)
        qs_keys = [k for k, v in qs_dict.items() if "quant_state" in k and isinstance(v, (Tensor, np.ndarray))]
        if "quant_type" not in qs_dict:
            if not qs_keys:
                raise ValueError("Expected packed or unpacked quant_state items, found neither")
            if len(qs_keys) != 1 or qs_keys[0].split(".")[-1] not in cls.valid_qs_type_keys:
                raise ValueError(f"There should be exactly one `quant_state` item with ending from "
                                 f"{cls.valid_qs_type_keys}. Detected {qs_keys}.")
        if len(qs_keys) == 1:
            try:
                packed = unpack_tensor_to_dict(qs_dict.pop(qs_keys[0]))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{fn}: `{qs_keys[0]}` must hold the JSON-packed dict of as_dict(packed=True) "
                                 f"({e})") from None
            if not isinstance(packed, dict):
                raise ValueError(f"{fn}: `{qs_keys[0]}` must hold a packed dict; got {type(packed).__name__}")
            qs_dict.update(packed)
        qs_dict = {k.split(".")[-1]: v for k, v in qs_dict.items()}
        unknown = set(qs_dict) - set(cls.valid_qs_keys)
        if unknown:
            raise ValueError(f"QuantState.from_dict: unexpected keys {sorted(unknown)}")
        nested = any(k.startswith("nested_") for k in qs_dict)
        needed = cls._FROM_DICT_KEYS + (cls._FROM_DICT_NESTED_KEYS if nested else ())
        missing = [k for k in needed if k not in qs_dict]
        if missing:
            raise ValueError(f"{fn}: missing keys {missing}; a quant state needs {list(cls._FROM_DICT_KEYS)}"
                             f"{' and, nested, ' + str(list(cls._FROM_DICT_NESTED_KEYS)) if nested else ''}")

        def tensor(v):
            return v if isinstance(v, Tensor) else Tensor(np.asarray(v))

        def dtype(key):
            try:
                return dtype_from_name(str(qs_dict[key]))
            except ValueError:
                raise ValueError(f"{fn}: `{key}` must name a dtype (e.g. 'float32'); got {qs_dict[key]!r}") from None

        for key in ("blocksize", "nested_blocksize") if nested else ("blocksize",):
            if isinstance(qs_dict[key], bool) or not isinstance(qs_dict[key], (int, np.integer)):
                raise ValueError(f"{fn}: `{key}` must be an int; got {qs_dict[key]!r}")
        if nested:
            offset = Tensor(np.float32(qs_dict["nested_offset"]))
            state2 = cls(absmax=tensor(qs_dict["nested_absmax"]), blocksize=qs_dict["nested_blocksize"],
                         code=tensor(qs_dict["nested_quant_map"]), dtype=dtype("nested_dtype"))
        else:
            offset, state2 = None, None
        return cls(quant_type=qs_dict["quant_type"], absmax=tensor(qs_dict["absmax"]), blocksize=qs_dict["blocksize"],
                   code=tensor(qs_dict["quant_map"]), dtype=dtype("dtype"),
                   shape=tuple(qs_dict["shape"]) if qs_dict["shape"] is not None else None,
                   offset=offset, state2=state2)

    def as_dict(self, packed: bool = False) -> Dict[str, Any]:
        """The state as a dict with upstream's keys; ``packed=True`` gives only tensors (the
        non-tensor items JSON-packed under ``quant_state.bitsandbytes__<quant_type>``), ready for
        safetensors."""
        qs = {
            "quant_type": self.quant_type,
            "absmax": self.absmax,
            "blocksize": self.blocksize,
            "quant_map": self.code,
            "dtype": dtype_name(self.dtype),
            "shape": tuple(self.shape) if self.shape is not None else None,
        }
        if self.nested:
            qs.update({
                "nested_absmax": self.state2.absmax,
                "nested_blocksize": self.state2.blocksize,
                "nested_quant_map": self.state2.code.copy(),
                "nested_dtype": dtype_name(self.state2.dtype),
                "nested_offset": float(self.offset.asnumpy()) if isinstance(self.offset, Tensor) else float(self.offset),
            })
        if not packed or self.quant_type is None:
            return qs
        out = {k: v for k, v in qs.items() if isinstance(v, Tensor)}
        out["quant_state.bitsandbytes__" + self.quant_type] = pack_dict_to_tensor(
            {k: v for k, v in qs.items() if not isinstance(v, Tensor)})
        return out

    def to(self, device):
        """Upstream moves the tensors to ``device``; MindSpore places tensors by context, so this
        only exists for compatibility. Returns ``self``."""
        return self

    def __eq__(self, other):
        if not isinstance(other, QuantState):
            return False

        def close(a, b):
            if a is None or b is None:
                return a is b
            return np.allclose(np.asarray(a.asnumpy(), np.float32), np.asarray(b.asnumpy(), np.float32), atol=1e-6)

        def same_offset(a, b):
            if a is None or b is None:
                return a is b
            fa = float(a.asnumpy()) if isinstance(a, Tensor) else float(a)
            fb = float(b.asnumpy()) if isinstance(b, Tensor) else float(b)
            return fa == fb

        return (close(self.absmax, other.absmax) and self.shape == other.shape and close(self.code, other.code)
                and self.dtype == other.dtype and self.blocksize == other.blocksize
                and self.quant_type == other.quant_type and same_offset(self.offset, other.offset)
                and (self.state2 == other.state2 if self.state2 is not None and other.state2 is not None
                     else self.state2 is other.state2))
