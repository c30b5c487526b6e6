"""Data-parallel training on MindSpore's own distributed runtime: the calls of mindtorch's
``torch.distributed`` that data-parallel training needs, routed to MindSpore's collectives.

mindtorch 0.5.1's ``torch.distributed`` does not run on the CPU: ``init_process_group("gloo")`` is
refused, and with ``"mccl"`` every collective fails (``'ProcessGroup' object has no attribute
'device'``; its ``dist_comm_*`` ops are Ascend-only pyboost ops). MindSpore itself has working CPU
collectives: ``mindspore.communication.init()`` picks the ``mccl`` backend under ``msrun`` and
``mindspore.mint.distributed``'s ``all_reduce`` / ``broadcast`` / ``barrier`` run on it, in place.

The patches below (registered with :data:`.patches.registry`, applied by
:func:`bitsandbytes_ms.register`) take over ``init_process_group`` when MindSpore's device target is
the CPU; once they have initialised the default group, ``is_initialized``, ``get_rank``,
``get_world_size``, ``all_reduce``, ``broadcast``, ``barrier`` and ``destroy_process_group`` run on
MindSpore's collectives. On another device target (mindtorch's own hccl path on Ascend), and before
initialisation, mindtorch's functions run unchanged. Only the default (world) group is supported.
No communication of our own: every byte moves through MindSpore's collectives.
"""

from __future__ import annotations

import os

from .patches import registry

_CPU_BACKENDS = (None, "gloo", "mccl", "cpu:gloo")
_REDUCE_OPS = ("sum", "prod", "min", "max")  # mindtorch's ReduceOp values, MindSpore's op names

_state = {"active": False}


def is_active() -> bool:
    """True when these patches initialised the default process group (and so run the collectives)."""
    return _state["active"]


def _ms():
    import mindspore

    return mindspore


def _world_only(group, fn):
    if group is not None:
        from mindtorch.distributed import GroupMember

        if group is not GroupMember.WORLD:
            raise ValueError(f"torch.distributed.{fn}: group must be None (the default group) on MindSpore's "
                             f"runtime (bitsandbytes_ms bridge), got {group!r}")


def _check_tensor(tensor, fn):
    if not isinstance(tensor, _ms().Tensor):
        raise TypeError(f"torch.distributed.{fn}: tensor must be a Tensor, got {type(tensor).__name__}")


def _init_process_group(wrapped, instance, args, kwargs):
    ms = _ms()
    if ms.get_context("device_target") != "CPU":
        return wrapped(*args, **kwargs)

    def _bind(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
              group_name="", pg_options=None, device_id=None):
        return backend, world_size, rank, store

    backend, world_size, rank, store = _bind(*args, **kwargs)
    if backend not in _CPU_BACKENDS:
        raise ValueError(f"torch.distributed.init_process_group: backend {backend!r} does not run on the CPU; "
                         f"use 'gloo', 'mccl' or None (MindSpore's mccl backend)")
    if store is not None:
        raise ValueError("torch.distributed.init_process_group: store must be None on MindSpore's runtime "
                         "(msrun's scheduler connects the ranks)")
    if _state["active"]:
        raise RuntimeError("torch.distributed.init_process_group: trying to initialize the default process "
                           "group twice")
    if "MS_ROLE" not in os.environ or "MS_WORKER_NUM" not in os.environ:
        raise RuntimeError("torch.distributed.init_process_group: no MindSpore cluster environment "
                           "(MS_ROLE, MS_WORKER_NUM); start the script with msrun, e.g. tools/launch_dp.sh")
    # msrun's numbers, checked before any communication
    size, me = int(os.environ["MS_WORKER_NUM"]), int(os.environ.get("RANK_ID", rank))
    if world_size not in (-1, size):
        raise ValueError(f"torch.distributed.init_process_group: world_size={world_size} but msrun started "
                         f"{size} workers")
    if rank not in (-1, me):
        raise ValueError(f"torch.distributed.init_process_group: rank={rank} but msrun gave this worker "
                         f"rank {me}")
    from mindspore import communication

    communication.init()
    _state["active"] = True


def _is_initialized(wrapped, instance, args, kwargs):
    return True if _state["active"] else wrapped(*args, **kwargs)


def _world_query(fn, attribute):
    """Wrapper for get_rank / get_world_size: mindspore.communication's ``attribute`` once active."""
    def wrapper(wrapped, instance, args, kwargs):
        if not _state["active"]:
            return wrapped(*args, **kwargs)

        def _bind(group=None):
            return group

        _world_only(_bind(*args, **kwargs), fn)
        from mindspore import communication

        return getattr(communication, attribute)()

    return wrapper


def _all_reduce(wrapped, instance, args, kwargs):
    if not _state["active"]:
        return wrapped(*args, **kwargs)
    from mindspore.mint import distributed as msdist
    from mindtorch.distributed import ReduceOp

    def _bind(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        return tensor, op, group, async_op

    tensor, op, group, async_op = _bind(*args, **kwargs)
    _check_tensor(tensor, "all_reduce")
    _world_only(group, "all_reduce")
    if op == ReduceOp.AVG:
        # the mean of the SUM, the same division on every rank (so every rank keeps the same bytes)
        from mindspore import communication, mint

        msdist.all_reduce(tensor, "sum")
        # MindSpore's division: tensors made by mindspore.value_and_grad carry no mindtorch device
        tensor.assign_value(mint.div(tensor, communication.get_group_size()))
        return None
    if not isinstance(op, str) or op not in _REDUCE_OPS:
        raise ValueError(f"torch.distributed.all_reduce: op must be ReduceOp.SUM, AVG, PRODUCT, MIN or MAX on "
                         f"MindSpore's runtime, got {op!r}")
    return msdist.all_reduce(tensor, op, async_op=bool(async_op))


def _broadcast(wrapped, instance, args, kwargs):
    if not _state["active"]:
        return wrapped(*args, **kwargs)
    from mindspore import communication
    from mindspore.mint import distributed as msdist

    def _bind(tensor, src=None, group=None, async_op=False, group_src=None):
        return tensor, src, group, async_op, group_src

    tensor, src, group, async_op, group_src = _bind(*args, **kwargs)
    _check_tensor(tensor, "broadcast")
    _world_only(group, "broadcast")
    if (src is None) == (group_src is None):
        raise ValueError("torch.distributed.broadcast: give exactly one of src and group_src")
    src = src if src is not None else group_src
    size = communication.get_group_size()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < size:
        raise ValueError(f"torch.distributed.broadcast: src must be a rank in [0, {size}), got {src!r}")
    return msdist.broadcast(tensor, src, async_op=bool(async_op))


def _barrier(wrapped, instance, args, kwargs):
    if not _state["active"]:
        return wrapped(*args, **kwargs)
    from mindspore.mint import distributed as msdist

    def _bind(group=None, async_op=False, device_ids=None):
        return group, async_op

    group, async_op = _bind(*args, **kwargs)
    _world_only(group, "barrier")
    return msdist.barrier(async_op=bool(async_op))


def _destroy_process_group(wrapped, instance, args, kwargs):
    if not _state["active"]:
        return wrapped(*args, **kwargs)
    from mindspore import communication

    communication.release()
    _state["active"] = False


_WHY_INIT = ("mindtorch's torch.distributed has no CPU path: init_process_group('gloo') is refused and with "
             "'mccl' every collective fails ('ProcessGroup' object has no attribute 'device'; its dist_comm "
             "ops are Ascend pyboost ops), so data-parallel training could not start; on the CPU it now runs "
             "mindspore.communication.init() (mccl, under msrun) and marks the default group as ours")
_WHY_CALL = ("after the CPU init_process_group of this bridge, the call runs on MindSpore's own collectives "
             "(mindspore.mint.distributed / mindspore.communication on the mccl world group) instead of "
             "mindtorch's ProcessGroup, which fails on the CPU; before it, or on another device target, "
             "mindtorch's function runs unchanged")

registry.register("mindtorch-distributed-init", "mindtorch.distributed", "init_process_group",
                  why=_WHY_INIT)(_init_process_group)
for _name, _wrapper in (("is_initialized", _is_initialized),
                        ("get_rank", _world_query("get_rank", "get_rank")),
                        ("get_world_size", _world_query("get_world_size", "get_group_size")),
                        ("all_reduce", _all_reduce), ("broadcast", _broadcast), ("barrier", _barrier),
                        ("destroy_process_group", _destroy_process_group)):
    registry.register(f"mindtorch-distributed-{_name.replace('_', '-')}", "mindtorch.distributed", _name,
                      why=f"torch.distributed.{_name}: " + _WHY_CALL)(_wrapper)
