"""XAgg for PyTorch: the "xagg" torch.distributed backend and a DDP comm hook.

    import xagg_torch  # registers the backend
    torch.distributed.init_process_group("xagg")   # env XAGG_AGGREGATOR=198.18.0.1
    # or, without the environment:
    torch.distributed.init_process_group(
        "xagg", pg_options=xagg_torch.Options(aggregators=["agg-host:9988"]))

Settings, from pg_options (an Options) or else the environment:
aggregators / XAGG_AGGREGATOR (required: the job's aggregators, host[:port],
comma-separated in the variable, the same order on every rank; the job's
chunks are spread over them), aggregator_weights / XAGG_AGGREGATOR_WEIGHTS
(optional: each one's relative share, integers 1..1000), job_id / XAGG_JOB_ID
(default 1: one per concurrent training run on the aggregators, below 65536;
each process group of the run is the job job_id * 65536 + the group's number,
so that new_group needs no other setting), max_elements / XAGG_MAX_ELEMENTS
(default 4Mi: the elements the aggregator holds for the group and the largest
all-reduce sent at once; larger tensors are split. Set it to the model's
parameter count so that every bucket of a step is in flight at once).
secret_file / XAGG_SECRET_FILE (optional: the cluster secret's file, when the
aggregators require one, docs/security.md). mtu / XAGG_MTU (optional, 1280..65535:
the MTU the job's packets must fit; default: the smallest path MTU to the aggregators,
docs/protocol.md section 1). aggregator_dead_after_ms / XAGG_AGGREGATOR_DEAD_AFTER_MS
(default 500, 50..60000: an aggregator silent this long is dead and its chunks fail over to
the others, docs/reliability.md). root_aggregator / XAGG_ROOT_AGGREGATOR and ranks_per_leaf /
XAGG_RANKS_PER_LEAF (optional, together: a group past 64 ranks in two levels, docs/design.md
"Hierarchy"; the aggregators are then the leaves, one per ranks_per_leaf consecutive ranks of
the group, and a group they do not fit is refused). wire_bits / XAGG_WIRE_BITS (default
32, or 16: the job's width on the wire, docs/protocol.md section 11: its packets' size and
float32 tensors' width; 16 halves the bytes of float32 all-reduces, within a bound of about
2^-13 of each block's largest element, and suits groups whose gradients are 16-bit).
half_wire_bits / XAGG_HALF_WIRE_BITS (default 16, or 32: the width of float16 and bfloat16
tensors; 16 moves 2 bytes per element each way, as float16 does, with the 16-bit wire's
bound; in a two-level group whose wire_bits is 32 the default is 32, as 16 needs wire_bits
16 there). XAGG_LOG_LEVEL (default warning: trace, debug, info, warning, error, critical
or off) sets libxagg's log level.

The group's timeout bounds joining and every collective; errors (a rank or
an aggregator gone, a timeout) are raised by the call, wait() and the future.
"""
import atexit
import os
import socket
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

ProcessGroupXagg = _C.ProcessGroupXagg
_C.set_log_level(os.environ.get("XAGG_LOG_LEVEL", "warning"))

# Live groups, shut down (queued work completed, jobs left) at interpreter exit.
_live_groups = weakref.WeakSet()


@atexit.register
def _shut_down_groups():
    for group in list(_live_groups):
        group.shutdown()


# Job ids of one run's groups: job_id * _GROUPS_PER_RUN + the group's number.
_GROUPS_PER_RUN = 1 << 16


class Options:
    """The xagg backend's settings for one process group (pg_options); a field
    left None is read from its environment variable."""

    def __init__(self, aggregators=None, aggregator_weights=None, job_id=None, max_elements=None,
                 secret_file=None, mtu=None, aggregator_dead_after_ms=None, root_aggregator=None,
                 ranks_per_leaf=None, wire_bits=None, half_wire_bits=None):
        self.aggregators = aggregators
        self.aggregator_weights = aggregator_weights
        self.job_id = job_id
        self.max_elements = max_elements
        self.secret_file = secret_file
        self.mtu = mtu
        self.aggregator_dead_after_ms = aggregator_dead_after_ms
        self.root_aggregator = root_aggregator
        self.ranks_per_leaf = ranks_per_leaf
        self.wire_bits = wire_bits
        self.half_wire_bits = half_wire_bits


def _setting(options, field, variable, parse, default=None):
    value = getattr(options, field, None) if options is not None else None
    if value is not None:
        return value
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        return parse(text)
    except ValueError:
        raise RuntimeError(f"xagg backend: {variable} '{text}' is not valid") from None


def _comma_list(text):
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def _resolve(aggregator):
    """host[:port] -> IPv4[:port]; libxagg speaks IPv4."""
    host, _, port = str(aggregator).partition(":")
    try:
        address = socket.gethostbyname(host)
    except OSError as error:
        raise RuntimeError(f"xagg backend: aggregator '{aggregator}' does not resolve to an IPv4 address: "
                           f"{error}") from None
    return f"{address}:{port}" if port else address


def _group_number(group_id):
    try:
        return int(group_id)
    except ValueError:
        raise RuntimeError(f"xagg backend: group name '{group_id}' is not a number; the xagg backend derives "
                           "each group's job id from torch's own group numbering, so leave group_name unset") from None


def _create_process_group(backend_options, pg_options):
    if pg_options is not None and not isinstance(pg_options, Options):
        raise RuntimeError(f"xagg backend: pg_options must be an xagg_torch.Options, not {type(pg_options).__name__}")
    aggregators = _setting(pg_options, "aggregators", "XAGG_AGGREGATOR", _comma_list, [])
    if not aggregators:
        raise RuntimeError("xagg backend: no aggregator: set XAGG_AGGREGATOR to the aggregators' addresses "
                           "(comma-separated) or pass pg_options=xagg_torch.Options(aggregators=[...])")
    weights = _setting(pg_options, "aggregator_weights", "XAGG_AGGREGATOR_WEIGHTS",
                       lambda text: [int(entry) for entry in _comma_list(text)], [])
    run = _setting(pg_options, "job_id", "XAGG_JOB_ID", int, 1)
    if not 0 <= run < _GROUPS_PER_RUN:
        raise RuntimeError(f"xagg backend: job id {run} is out of range: 0 to {_GROUPS_PER_RUN - 1}")
    root = _setting(pg_options, "root_aggregator", "XAGG_ROOT_AGGREGATOR", str, "")
    root = _resolve(root) if root else ""
    wire_bits = _setting(pg_options, "wire_bits", "XAGG_WIRE_BITS", int, 32)
    half_wire_bits = _setting(pg_options, "half_wire_bits", "XAGG_HALF_WIRE_BITS", int,
                              32 if root and wire_bits == 32 else 16)
    for name, value in (("wire_bits", wire_bits), ("half_wire_bits", half_wire_bits)):
        if value not in (16, 32):
            raise RuntimeError(f"xagg backend: {name} {value} is not 16 or 32")
    if root and half_wire_bits < wire_bits:
        raise RuntimeError("xagg backend: half_wire_bits 16 in a two-level group needs wire_bits 16 (its leaves "
                           "then sum on one scale)")
    number = _group_number(backend_options.group_id)
    if number >= _GROUPS_PER_RUN:
        raise RuntimeError(f"xagg backend: more than {_GROUPS_PER_RUN} process groups in one run")
    group = ProcessGroupXagg(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        [_resolve(aggregator) for aggregator in aggregators],
        weights,
        run * _GROUPS_PER_RUN + number,
        _setting(pg_options, "max_elements", "XAGG_MAX_ELEMENTS", int, 4 << 20),
        backend_options.timeout,
        _setting(pg_options, "secret_file", "XAGG_SECRET_FILE", str, ""),
        _setting(pg_options, "mtu", "XAGG_MTU", int, 0),
        timedelta(milliseconds=_setting(pg_options, "aggregator_dead_after_ms", "XAGG_AGGREGATOR_DEAD_AFTER_MS", int, 500)),
        root,
        _setting(pg_options, "ranks_per_leaf", "XAGG_RANKS_PER_LEAF", int, 0),
        wire_bits,
        half_wire_bits,
    )
    _live_groups.add(group)
    return group


dist.Backend.register_backend("xagg", _create_process_group, extended_api=True)


def allreduce_hook(process_group, bucket):
    """DDP comm hook averaging each gradient bucket through XAgg, for models
    whose DDP process group stays Gloo:

        xagg_group = torch.distributed.new_group(backend="xagg")
        ddp_model.register_comm_hook(xagg_group, xagg_torch.allreduce_hook)
    """
    if bucket.index() == 0:
        # A new step: its buckets take side-by-side chunks at the aggregator.
        process_group.begin_step()
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.AVG
    work = process_group.allreduce([bucket.buffer()], options)
    return work.get_future().then(lambda future: future.value()[0])


def wire16_hook(process_group, bucket):
    """allreduce_hook over the 16-bit wire whatever the bucket's dtype: a
    float32 bucket goes as 2 bytes per element each way, as DDP's
    fp16_compress_hook sends it, but quantized straight from float32 with the
    16-bit wire's bound (docs/protocol.md section 11: about 2^-13 of each
    block's largest element) instead of float16's rounding and range:

        ddp_model.register_comm_hook(xagg_group, xagg_torch.wire16_hook)
    """
    if bucket.index() == 0:
        process_group.begin_step()
    work = process_group.allreduce_on_wire(bucket.buffer(), dist.ReduceOp.AVG, 16)
    return work.get_future().then(lambda future: future.value()[0])


__all__ = ["Options", "ProcessGroupXagg", "allreduce_hook", "wire16_hook"]
