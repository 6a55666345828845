#!/usr/bin/python3
"""One rank of the DDP parity test (run by ddp_parity_test.cpp in a testbed namespace).

Trains four copies of the same model for a few SGD steps on the same data:
DDP over Gloo (the reference), DDP over the "xagg" backend, DDP over Gloo
with xagg_torch.allreduce_hook and with xagg_torch.wire16_hook (the 16-bit
wire's bound, docs/protocol.md section 11); then the first two on uneven inputs inside
DDP's join(). Exits non-zero when an XAgg copy's parameters
differ from the reference by more than the bound of docs/pytorch.md.
"""
import copy
import math
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import xagg_torch

import testbed_rank

LEARNING_RATE = 0.05
# Safety factor on the summed per-step error: an early gradient error also
# slightly changes the later gradients (docs/pytorch.md).
SAFETY = 4.0
# Bits of precision a predicted exponent may give up (kMaxExponentExcess, include/xagg/quantize.h).
MAX_EXPONENT_EXCESS = 4


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(8 * 13 * 13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def main():
    args = testbed_rank.parse_args(lambda parser: parser.add_argument("--steps", type=int, default=5))

    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    xagg_group = dist.new_group(backend="xagg")
    torch.manual_seed(0)
    reference_model = make_model()
    xagg_model = copy.deepcopy(reference_model)
    hooked_model = copy.deepcopy(reference_model)
    reference = DistributedDataParallel(reference_model)
    through_xagg = DistributedDataParallel(xagg_model, process_group=xagg_group)
    hooked = DistributedDataParallel(hooked_model)
    hooked.register_comm_hook(xagg_group, xagg_torch.allreduce_hook)
    narrow_hooked = DistributedDataParallel(copy.deepcopy(reference_model))
    narrow_hooked.register_comm_hook(xagg_group, xagg_torch.wire16_hook)
    models = [reference, through_xagg, hooked, narrow_hooked]
    optimizers = [torch.optim.SGD(model.parameters(), lr=LEARNING_RATE) for model in models]

    # Per step, the documented bound on one averaged gradient element's error:
    # quantization 2^(B-30) with a predicted exponent's excess plus two float32
    # roundings, times the largest gradient magnitude; then the update itself
    # may round the parameter to the neighbouring float: one ulp of the largest.
    bits = math.ceil(math.log2(args.world_size)) + MAX_EXPONENT_EXCESS
    relative = 2.0 ** (bits - 30) + 2.0 ** -23
    # The 16-bit wire: 2^(u - 15) * (N + 2^ceil(log2 N)) / N, u up to 4 above the block's
    # exponent e, of a largest magnitude of at least 2^(e - 1).
    narrow_relative = 2.0 ** (MAX_EXPONENT_EXCESS - 14) * (
        args.world_size + 2 ** math.ceil(math.log2(args.world_size))) / args.world_size + 2.0 ** -23
    allowed = 0.0
    narrow_allowed = 0.0
    generator = torch.Generator().manual_seed(1000 + args.rank)  # each rank its own data
    for _ in range(args.steps):
        images = torch.randn(16, 1, 28, 28, generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        largest = max(p.grad.abs().max().item() for p in reference.parameters())
        largest_parameter = max(p.abs().max().item() for p in reference.parameters())
        allowed += SAFETY * LEARNING_RATE * relative * largest + 2.0 ** -23 * largest_parameter
        narrow_allowed += SAFETY * LEARNING_RATE * narrow_relative * largest + 2.0 ** -23 * largest_parameter

    failed = False
    for name, model, bound in [("xagg backend", through_xagg, allowed), ("xagg comm hook", hooked, allowed),
                               ("xagg 16-bit wire hook", narrow_hooked, narrow_allowed)]:
        difference = max((a - b).abs().max().item()
                         for a, b in zip(model.parameters(), reference.parameters()))
        print(f"rank {args.rank}: {name}: max parameter difference {difference:.3e} (bound {bound:.3e})")
        failed |= not difference <= bound

    # Uneven inputs: rank r trains r more batches than rank 0, inside DDP's join(),
    # which shadows the finished ranks' all-reduces (int64 MAX among them) until
    # every rank is done; the xagg backend against Gloo again.
    for model, optimizer in [(reference, optimizers[0]), (through_xagg, optimizers[1])]:
        uneven = torch.Generator().manual_seed(2000 + args.rank)
        with model.join():
            for _ in range(2 + args.rank):
                images = torch.randn(16, 1, 28, 28, generator=uneven)
                labels = torch.randint(0, 10, (16,), generator=uneven)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(images), labels).backward()
                optimizer.step()
    largest = max(p.grad.abs().max().item() for p in reference.parameters())
    largest_parameter = max(p.abs().max().item() for p in reference.parameters())
    for _ in range(2 + args.world_size - 1):
        allowed += SAFETY * LEARNING_RATE * relative * largest + 2.0 ** -23 * largest_parameter
    difference = max((a - b).abs().max().item() for a, b in zip(through_xagg.parameters(), reference.parameters()))
    print(f"rank {args.rank}: xagg backend after join() with uneven inputs: max parameter difference "
          f"{difference:.3e} (bound {allowed:.3e})")
    failed |= not difference <= allowed
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
