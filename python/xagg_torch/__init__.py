"""XAgg for PyTorch: the "xagg" torch.distributed backend and a DDP comm hook.

    import xagg_torch  # registers the backend
    torch.distributed.init_process_group("xagg")   # env XAGG_AGGREGATOR=198.18.0.1

Settings (environment): XAGG_AGGREGATOR (required: the job's aggregators,
IPv4[:port], comma-separated, the same order on every rank; the job's chunks
are spread over them), XAGG_AGGREGATOR_WEIGHTS (optional: each one's relative
share, comma-separated integers 1..1000), XAGG_JOB_ID (default 1,
one id per concurrent job), XAGG_MAX_ELEMENTS (default 4Mi: the elements the
aggregator holds for the job and the largest all-reduce sent at once; larger
tensors are split. Set it to the model's parameter count so that every
bucket of a step is in flight at once).
"""
import os

import torch
import torch.distributed as dist

from . import _C

ProcessGroupXagg = _C.ProcessGroupXagg


def _create_process_group(store, rank, world_size, timeout):
    aggregators = [entry.strip() for entry in os.environ.get("XAGG_AGGREGATOR", "").split(",") if entry.strip()]
    if not aggregators:
        raise RuntimeError("xagg backend: set XAGG_AGGREGATOR to the aggregators' IPv4 addresses (comma-separated)")
    weights_text = os.environ.get("XAGG_AGGREGATOR_WEIGHTS", "")
    try:
        weights = [int(entry) for entry in weights_text.split(",")] if weights_text.strip() else []
    except ValueError:
        raise RuntimeError(f"xagg backend: XAGG_AGGREGATOR_WEIGHTS '{weights_text}' is not a comma-separated list "
                           "of integers") from None
    return ProcessGroupXagg(
        store,
        rank,
        world_size,
        aggregators,
        weights,
        int(os.environ.get("XAGG_JOB_ID", "1")),
        int(os.environ.get("XAGG_MAX_ELEMENTS", str(4 << 20))),
        timeout,
    )


dist.Backend.register_backend("xagg", _create_process_group)


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


__all__ = ["ProcessGroupXagg", "allreduce_hook"]
