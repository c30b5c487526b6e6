"""Opt-in registration that lets transformers' own bitsandbytes code run on bitsandbytes_ms.

``bitsandbytes_ms.register()`` makes ``import bitsandbytes`` (and ``bitsandbytes.nn`` etc.) resolve to
this package, makes ``importlib.metadata.version("bitsandbytes")`` answer with the upstream release
whose API we follow, and applies the registered mindtorch/transformers patches (see
:mod:`bitsandbytes_ms.integrations.patches`). Nothing happens without the call.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from typing import Optional

ALIAS = "bitsandbytes"
TARGET = "bitsandbytes_ms"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):  # the target module is already executed
        pass


class _AliasDistribution(importlib.metadata.Distribution):
    """Metadata for the alias: name ``bitsandbytes``, the upstream version we follow."""

    def __init__(self, version: str):
        self._version = version

    def read_text(self, filename: str) -> Optional[str]:
        if filename in ("METADATA", "PKG-INFO"):
            return (f"Metadata-Version: 2.1\nName: {ALIAS}\nVersion: {self._version}\n"
                    f"Summary: bitsandbytes API provided by bitsandbytes_ms (MindSpore)\n")
        return None

    def locate_file(self, path):
        import pathlib

        return pathlib.Path(importlib.import_module(TARGET).__file__).parent / path


class BitsandbytesAlias(importlib.abc.MetaPathFinder):
    """Resolves ``bitsandbytes[.x]`` to ``bitsandbytes_ms[.x]`` (the same module objects) and provides
    a distribution named ``bitsandbytes`` to ``importlib.metadata``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        try:
            real_spec = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            return None
        if real_spec is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=real_spec.submodule_search_locations is not None)
        return spec

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        if name is None or name.replace("-", "_").lower() == ALIAS:
            from bitsandbytes_ms import __upstream_version__

            yield _AliasDistribution(__upstream_version__)
        return


_finder: Optional[BitsandbytesAlias] = None


def register(patches: bool = True) -> None:
    """Makes ``bitsandbytes`` importable as this package (for transformers' bitsandbytes quantizers,
    peft and accelerate) and applies the registered compatibility patches. Idempotent.

    Raises:
        RuntimeError: a different ``bitsandbytes`` package is already imported.
    """
    global _finder
    existing = sys.modules.get(ALIAS)
    if existing is not None and not existing.__name__.startswith(TARGET):
        raise RuntimeError("register(): another `bitsandbytes` is already imported; call "
                           "bitsandbytes_ms.register() before anything imports bitsandbytes")
    if _finder is None:
        _finder = BitsandbytesAlias()
        sys.meta_path.insert(0, _finder)
    if patches:
        from . import mindtorch_patches  # noqa: F401  (registers the patches)
        from .patches import registry

        registry.apply()
    # transformers caches is_bitsandbytes_available(): an attempt made before register() (the hint's own case: a
    # notebook that tried first) would keep answering False
    import_utils = sys.modules.get("transformers.utils.import_utils")
    cache_clear = getattr(getattr(import_utils, "is_bitsandbytes_available", None), "cache_clear", None)
    if cache_clear is not None:
        cache_clear()


def unregister() -> None:
    """Undoes :func:`register` (used by tests)."""
    global _finder
    from .patches import registry

    registry.remove()
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        del sys.modules[name]
