#!/usr/bin/python3
"""One rank of the two-level test (run by two_level_test.cpp in a testbed namespace).

The "xagg" backend on leaf aggregators and a root (docs/design.md, "Hierarchy"),
configured through pg_options: all_reduce of float32 (SUM, AVG, MAX, MIN within the
quantization bound), int32 (exact) and float16 against Gloo's result on the same ranks
and inputs, a tensor of several chunks among them, reduce_scatter_tensor of int32
(exact, against its sum; the leaves relay whole results, docs/protocol.md section 10), and the group's
rank and size the whole job's. Exits non-zero on any difference.
"""
import torch
import torch.distributed as dist

import xagg_torch

import testbed_rank


def main():
    args = testbed_rank.parse_args(lambda parser: (parser.add_argument("--root", required=True),
                                                   parser.add_argument("--ranks-per-leaf", type=int, required=True)))
    rank, world = args.rank, args.world_size
    dist.init_process_group("gloo", rank=rank, world_size=world)
    leaves = args.aggregator.split(",")[:-1]  # the testbed's last aggregator is the root
    group = dist.new_group(backend="xagg", pg_options=xagg_torch.Options(
        aggregators=leaves, root_aggregator=args.root, ranks_per_leaf=args.ranks_per_leaf, max_elements=1 << 20))
    failures = []
    if (dist.get_rank(group), dist.get_world_size(group)) != (rank, world):
        failures.append(f"group rank/size {dist.get_rank(group)}/{dist.get_world_size(group)}")
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    for count in (1, 5000, 300_000):
        generator = torch.Generator().manual_seed(count * 10 + rank)
        for dtype in (torch.float32, torch.int32, torch.float16):
            if dtype == torch.int32:
                data = torch.randint(-(1 << 20), 1 << 20, (count,), generator=generator, dtype=dtype)
            else:
                data = (torch.rand(count, generator=generator) * 2 - 1).to(dtype)
            for name, op in ops.items():
                expected = data.clone()
                dist.all_reduce(expected, op=op)  # Gloo
                got = data.clone()
                dist.all_reduce(got, op=op, group=group)
                if dtype == torch.int32:
                    ok = torch.equal(got, expected)
                else:
                    # world * 2^(ceil(log2 world) + 4 - 31) per unit of magnitude, and float16's own rounding.
                    bound = world * 2.0 ** ((world - 1).bit_length() + 4 - 31) * 2 * world
                    if dtype == torch.float16:
                        bound += 2.0 ** -10 * world
                    ok = (got.float() - expected.float()).abs().max().item() <= bound
                if not ok:
                    failures.append(f"{name} of {count} {dtype}: max difference "
                                    f"{(got.double() - expected.double()).abs().max().item()}")
    average = torch.full((1000,), float(rank))
    dist.all_reduce(average, op=dist.ReduceOp.AVG, group=group)
    if (average - (world - 1) / 2).abs().max().item() > 1e-5:
        failures.append(f"average {average[0].item()}, expected {(world - 1) / 2}")
    # Rank r's input: arange * (r + 1); shard `rank` of the sum is that slice times world (world + 1) / 2.
    got = torch.zeros(5000, dtype=torch.int32)
    dist.reduce_scatter_tensor(got, torch.arange(world * 5000, dtype=torch.int32) * (rank + 1), group=group)
    expected = torch.arange(rank * 5000, (rank + 1) * 5000, dtype=torch.int32) * (world * (world + 1) // 2)
    if not torch.equal(got, expected):
        failures.append(f"reduce_scatter_tensor: {(got != expected).sum().item()} elements differ")
    dist.destroy_process_group()
    testbed_rank.exit_with(rank, failures, "two-level all_reduce matches Gloo")


if __name__ == "__main__":
    main()
