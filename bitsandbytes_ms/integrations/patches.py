"""One registry of the non-invasive patches bitsandbytes_ms applies to foreign code (transformers,
mindtorch) when the user opts in with :func:`bitsandbytes_ms.register`.

Each patch is a :class:`Patch`: a dotted target, a wrapt wrapper, and one line saying why. Nothing is
patched at import time except the few marked ``on_import`` (what ``torch.save``/``torch.load`` of quantized
layers needs, so that saving them is safe with or without ``register()``): ``bitsandbytes_ms.nn`` applies
those when it is imported (:meth:`PatchRegistry.apply_on_import`). ``apply`` is idempotent and ``remove``
restores the originals (tests use it; ``remove()`` without names keeps the ``on_import`` ones).
Modelled on MindSpeed's feature patches: the foreign library's files are never edited.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List

import wrapt


_NO_VALUE = object()


@dataclass
class Patch:
    name: str
    module: str          # module that owns the attribute, e.g. "transformers.integrations.bitsandbytes"
    attribute: str       # dotted attribute path inside it, e.g. "replace_with_bnb_linear" or "Class.method"
    wrapper: Callable    # wrapt-style wrapper(wrapped, instance, args, kwargs), or None for a value patch
    why: str
    value: object = _NO_VALUE  # for a value patch: the value the attribute is set to
    only_if_imported: bool = False  # skip (not import) the module when nothing imported it yet
    on_import: bool = False  # applied when bitsandbytes_ms.nn is imported, not only by register()


class PatchRegistry:
    def __init__(self):
        self._patches: Dict[str, Patch] = {}
        self._originals: Dict[str, tuple] = {}

    def register(self, name: str, module: str, attribute: str, why: str, on_import: bool = False):
        """Decorator: registers ``wrapper`` as patch ``name`` on ``module.attribute``."""
        def deco(wrapper):
            if name in self._patches:
                raise ValueError(f"patch {name!r} registered twice")
            self._patches[name] = Patch(name, module, attribute, wrapper, why, on_import=on_import)
            return wrapper
        return deco

    def register_value(self, name: str, module: str, attribute: str, value, why: str,
                       only_if_imported: bool = True, on_import: bool = False) -> None:
        """Registers a patch that sets ``module.attribute = value`` (for module-level constants that
        were computed at import time)."""
        if name in self._patches:
            raise ValueError(f"patch {name!r} registered twice")
        self._patches[name] = Patch(name, module, attribute, None, why, value, only_if_imported, on_import)

    def patches(self) -> List[Patch]:
        return list(self._patches.values())

    def is_applied(self, name: str) -> bool:
        return name in self._originals

    def apply(self, names=None) -> List[str]:
        """Applies the named patches (default: all) whose target module can be imported."""
        done = []
        for p in self._patches.values():
            if (names is not None and p.name not in names) or p.name in self._originals:
                continue
            owner_path, _, attr = p.attribute.rpartition(".")
            if p.only_if_imported and p.module not in sys.modules:
                continue
            mod = _import_target(p.module)
            owner = mod
            for part in filter(None, owner_path.split(".")):
                owner = getattr(owner, part)
            # a value patch may add an attribute the owner lacks (e.g. a missing CPU kernel); remove() deletes it again
            original = getattr(owner, attr) if p.value is _NO_VALUE else owner.__dict__.get(attr, _NO_VALUE)
            if p.value is not _NO_VALUE:
                setattr(owner, attr, p.value)
            else:
                wrapt.wrap_function_wrapper(owner, attr, p.wrapper)
            self._originals[p.name] = (owner, attr, original)
            done.append(p.name)
        return done

    def apply_on_import(self) -> List[str]:
        """Applies the patches marked ``on_import``."""
        return self.apply([p.name for p in self._patches.values() if p.on_import])

    def remove(self, names=None) -> None:
        """Restores the originals of the named patches; without names, of every applied patch not marked
        ``on_import``."""
        for name in list(self._originals):
            if (name in names) if names is not None else not self._patches[name].on_import:
                owner, attr, original = self._originals.pop(name)
                if original is _NO_VALUE:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)


def _import_target(module: str):
    """Imports a patch's target module; transformers only after mindnlp where mindnlp is installed: mindnlp
    patches transformers when it is imported (its attention masks among them) and makes ``torch`` mindtorch, and a
    modeling module imported first keeps the unpatched functions (measured: ``bnb.register()`` before
    ``import mindnlp`` made every Llama forward with an attention mask fail in MindSpore's jit with
    ``No module named 'mindtorch._'``)."""
    if module.split(".")[0] == "transformers" and "mindnlp" not in sys.modules and importlib.util.find_spec("mindnlp"):
        importlib.import_module("mindnlp")
    return importlib.import_module(module)


registry = PatchRegistry()
