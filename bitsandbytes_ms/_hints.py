"""One-line hints for the first mistakes a bitsandbytes user makes here (installed by ``import bitsandbytes_ms``).

Nothing here changes what works; it only rewords two errors that otherwise name no way out:

* ``import torch`` before ``import mindnlp``: ``torch`` exists only as mindtorch's redirect, which ``import
  mindnlp`` installs; Python's own error was ``No module named 'torch'``. :class:`TorchHint` (last on
  ``sys.meta_path``, so any real or redirected ``torch`` is found first) makes that import statement's error say to
  ``import mindnlp`` first. ``importlib.util.find_spec("torch")`` (transformers' availability check) still
  answers None.
* transformers' bitsandbytes path without ``bitsandbytes_ms.register()`` (opt-in): ``BitsAndBytesConfig(
  load_in_4bit=True)`` asks ``importlib.metadata.version("bitsandbytes")`` and failed with a bare
  ``PackageNotFoundError``; the quantizers' ``validate_environment`` raised ``ImportError: ... requires the
  latest version of bitsandbytes``. Both now name ``bitsandbytes_ms.register()``: :class:`RegisterHint` answers
  the metadata lookup last (a real ``bitsandbytes`` distribution is found first), and the two
  ``validate_environment`` methods get a wrapper (wrapt, when transformers' quantizer modules are imported) that
  adds the hint to their ``ImportError``. After ``register()`` neither hint is ever reached.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import sys

REGISTER_HINT = ("bitsandbytes_ms is imported but not registered as bitsandbytes: call bitsandbytes_ms.register() "
                 "before BitsAndBytesConfig / from_pretrained")
_QUANTIZERS = (("transformers.quantizers.quantizer_bnb_4bit", "Bnb4BitHfQuantizer"),
               ("transformers.quantizers.quantizer_bnb_8bit", "Bnb8BitHfQuantizer"))


def registered() -> bool:
    """Whether :func:`bitsandbytes_ms.register` is in effect (without importing the integrations)."""
    hf = sys.modules.get("bitsandbytes_ms.integrations.hf")
    return hf is not None and getattr(hf, "_finder", None) is not None


def torch_hint() -> str:
    extra = "" if importlib.util.find_spec("mindnlp") is not None else " (pip install mindnlp)"
    return (f"No module named 'torch': with bitsandbytes_ms, torch is MindSpore NLP's mindtorch: `import mindnlp` "
            f"before `import torch`{extra}")


class TorchHint(importlib.abc.MetaPathFinder):
    """Last finder on ``sys.meta_path``: an ``import torch`` statement that nothing else resolved fails with
    :func:`torch_hint`. Only the import statement (``importlib._bootstrap._find_and_load_unlocked``) is answered,
    so ``importlib.util.find_spec("torch")`` keeps returning None."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:  # this method <- importlib._bootstrap._find_spec <- _find_and_load_unlocked (an import statement)
            caller = sys._getframe(2).f_code.co_name
        except ValueError:  # pragma: no cover
            return None
        if caller != "_find_and_load_unlocked":
            return None
        raise ModuleNotFoundError(torch_hint(), name="torch")


class RegisterHint(importlib.abc.MetaPathFinder):
    """Last finder on ``sys.meta_path``: a metadata lookup of ``bitsandbytes`` that no installed distribution
    answered raises ``PackageNotFoundError`` naming :func:`bitsandbytes_ms.register`."""

    def find_spec(self, fullname, path=None, target=None):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        if name is not None and name.replace("-", "_").lower() == "bitsandbytes" and not registered():
            raise importlib.metadata.PackageNotFoundError(f"bitsandbytes ({REGISTER_HINT})")
        return iter(())


def _validate_with_hint(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    except ImportError as e:
        if registered() or "bitsandbytes" not in str(e) or "register()" in str(e):
            raise
        raise ImportError(f"{e} ({REGISTER_HINT})") from e


def _wrap_quantizer(cls_name):
    def hook(module):
        import wrapt

        cls = getattr(module, cls_name, None)
        if cls is not None and not isinstance(cls.__dict__.get("validate_environment"), wrapt.FunctionWrapper):
            wrapt.wrap_function_wrapper(cls, "validate_environment", _validate_with_hint)
    return hook


def install() -> None:
    """Appends the two finders to ``sys.meta_path`` and hooks transformers' bitsandbytes quantizers (when they are
    imported, or now if they are). Idempotent."""
    for cls in (TorchHint, RegisterHint):
        if not any(type(f).__name__ == cls.__name__ and type(f).__module__ == __name__ for f in sys.meta_path):
            sys.meta_path.append(cls())
    try:
        import wrapt
    except ImportError:  # pragma: no cover  (wrapt is a dependency)
        return
    for module, cls_name in _QUANTIZERS:
        wrapt.register_post_import_hook(_wrap_quantizer(cls_name), module)
