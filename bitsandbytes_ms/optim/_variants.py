"""One factory for upstream's stamped optimizer classes (Adam, Adam8bit, Adam32bit, PagedAdam, ...).

Each optimizer module writes its family once, as a function ``family(self, cls, bits, params, <upstream's full
signature>)`` that checks its arguments and calls ``super(cls, self).__init__`` (Optimizer1State / Optimizer2State)
with the rule name; ``bits`` is 8 / 32 for the ``*8bit`` / ``*32bit`` variants and None for the plain class (its
``optim_bits`` decides: it passes ``bits or optim_bits``), and the ``Paged*`` variants call it with
``is_paged=True``. :func:`stamp` derives the classes.

Why generated source rather than a wrapper with ``__signature__``: users and upstream's tests introspect these
classes, so each one must stay what the hand-written class was -- a direct subclass of the base (Adam8bit is not an
Adam, as upstream), with ``__module__``, ``__qualname__`` and docstring of its own, and an ``__init__`` that is a
real function with exactly upstream's parameters (tests/test_optim_signatures.py) named ``<Class>.__init__``, so
Python's own TypeErrors (unexpected keyword, too many positionals) read as before. tests/test_optim_variants.py
holds a snapshot of the hand-written classes and compares every one."""

import inspect
import linecache


def stamp(module, base, family, prefix, *, paged=False, keep=(), pin_bits=False, defaults=None, doc="{name}.",
          doc8=None):
    """The classes ``prefix``, ``prefix8bit``, ``prefix32bit`` (and, with ``paged``, ``Paged<prefix>``, ...),
    in that order, as module ``module``'s classes.

    Their signatures are ``family``'s after ``bits``, with ``defaults`` overriding its defaults. The ``*8bit`` /
    ``*32bit`` variants drop ``optim_bits`` (their width is in the name) and the ``Paged*`` ones ``is_paged``, as
    upstream -- except the names in ``keep``; ``pin_bits``: a kept ``optim_bits`` defaults to the variant's width
    (Adagrad8bit's ``optim_bits=8``). ``doc`` / ``doc8`` (8-bit variants): docstrings, ``{name}`` the class's."""
    sig = list(inspect.signature(family).parameters.values())[3:]  # after self, cls, bits
    sig = [p.replace(default=defaults[p.name]) if p.name in (defaults or {}) else p for p in sig]
    out = []
    for is_paged in (False, True) if paged else (False,):
        for bits in (None, 8, 32):
            name = ("Paged" if is_paged else "") + prefix + (f"{bits}bit" if bits else "")
            dropped = {n for n, on in (("optim_bits", bits), ("is_paged", is_paged)) if on} - set(keep)
            params = [p.replace(default=bits) if pin_bits and bits and p.name == "optim_bits" else p
                      for p in sig if p.name not in dropped]
            out.append(_make_class(module, base, family, name, bits, is_paged, params,
                                   (doc8 if bits == 8 and doc8 else doc).format(name=name)))
    return tuple(out)


def _make_class(module, base, family, name, bits, is_paged, params, doc):
    # a class statement, so that Python sets __module__ (from the globals' __name__), __qualname__, the
    # __init__'s qualname and the __class__ cell exactly as for a hand-written class; the defaults are literals
    # (numbers, tuples, None), so the signature's text is their source (and inspect.getsource shows them)
    sig = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
    passed = ", ".join(f"{p.name}={p.name}" for p in params if not (is_paged and p.name == "is_paged"))
    src = (f"class {name}(_base):\n"
           f"    def __init__{sig}:\n"
           f"        _family(self, __class__, {bits}, {passed}{', is_paged=True' if is_paged else ''})\n")
    filename = f"<stamped {module}.{name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks show the line
    ns = {"__name__": module, "_base": base, "_family": family}
    exec(compile(src, filename, "exec"), ns)  # noqa: S102 - our own source, built from a signature
    ns[name].__doc__ = doc
    return ns[name]
