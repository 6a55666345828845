#!/usr/bin/python3
"""One rank of the collectives test (run by collectives_test.cpp in a testbed namespace).

Every collective the "xagg" backend offers, against Gloo's result on the same
ranks and inputs: all_reduce with SUM, AVG, MAX and MIN on float32 (within the
quantization bound of docs/pytorch.md) and int32 (exact, extremes included),
tensors smaller and larger than a chunk, float16 and bfloat16, reduce,
reduce_scatter and reduce_scatter_tensor (against torch's own reduction: Gloo
has none; each rank receiving about 1/N of the bytes an all_reduce brings),
all_reduce_coalesced, all_gather_into_tensor, send/recv, gather, scatter,
all_to_all_single, all_to_all (against its rule: Gloo lacks it), broadcast,
all_gather and barrier; receives posted before their sends (a ring of irecv,
send, wait; batch_isend_irecv with the receives listed first; a receive's
future); the reductions through the store (float64 under SUM, AVG, MAX, MIN and
PRODUCT, PRODUCT of float32 and the integers, BAND, BOR and BXOR of the
integers and bool) exactly as each rank's reduction in rank order and against
Gloo's, and uint8, int8 and int16 through the aggregators exactly (against
Gloo's too for uint8 and int8);
NaN and Inf element-exact under every op (against torch's own reduction of
every rank's input); and tensors of different sizes on different ranks
refused on every rank with an error naming the sizes;
and the reduce ops and dtypes it refuses, refused with an error. Exits non-zero on any
difference.
"""

import math
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import xagg_torch  # registers the backend

import testbed_rank

# Within a float32 element: the sum of N quantized values errs by at most
# N * 2^(e + ceil(log2 N) - 31) for max|x| < 2^e, and a predicted exponent
# may give up 4 more bits (docs/pytorch.md); MAX and MIN err by less.
def float_bound(world_size, largest):
    bits = (world_size - 1).bit_length()
    return world_size * 2.0 ** (bits + 4 - 31) * 2 * largest + 1e-30


# On the 16-bit wire (float16 and bfloat16 by default): 2^(u - 15) * (N + 2^ceil(log2 N))
# for the exponent u its values use, up to 4 above the block's (docs/protocol.md section 11).
def narrow_bound(world_size, largest):
    exponent = math.frexp(largest)[1] + 4
    return 2.0 ** (exponent - 15) * (world_size + 2 ** (world_size - 1).bit_length()) + 1e-30


def half_bound(dtype, wire_bits, world_size, largest, result_largest):
    """A float16 or bfloat16 all-reduce's bound: its wire's plus one rounding to the dtype."""
    epsilon = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    wire = narrow_bound(world_size, largest) if wire_bits == 16 else float_bound(world_size, largest)
    return result_largest * epsilon + wire


def inputs(rank, count, dtype):
    generator = torch.Generator().manual_seed(1000 * count + rank)
    if dtype == torch.int32:
        values = torch.randint(-(1 << 20), 1 << 20, (count,), generator=generator, dtype=torch.int32)
        # MAX and MIN must hold at the extremes, where a negation would overflow.
        values[0] = torch.iinfo(torch.int32).min if rank == 0 else 5
        values[-1] = torch.iinfo(torch.int32).max if rank == 1 else -5
        return values
    return torch.randn(count, generator=generator) * (10.0 ** rank)


def non_finite_inputs(rank, world_size, count):
    values = inputs(rank, count, torch.float32)
    inf = float("inf")
    if rank == 0:
        values[3] = float("nan")
        values[2101] = inf  # +Inf here and -Inf on the last rank: NaN in a sum
    if rank == 1:
        values[2100] = inf
        values[4501] = -inf
    if rank == world_size - 1:
        values[2101] = -inf
    values[4500] = -inf  # on every rank: -Inf even under MAX
    return values


def received_bytes():
    """What this rank's link has received (its namespace's eth0)."""
    with open("/sys/class/net/eth0/statistics/rx_bytes") as counter:
        return int(counter.read())


def fewest_bytes_received(run, group, tries=3):
    """The fewest bytes this rank's link received over a few runs of run():
    the protocol's own bytes, without the resends a loaded machine's drops add
    to one run (they only ever add)."""
    counts = []
    for _ in range(tries):
        dist.barrier()
        before = received_bytes()
        run()
        dist.barrier(group=group)
        counts.append(received_bytes() - before)
    return min(counts)


def check_reduce_scatter(rank, N, xagg_group, failures):
    """reduce_scatter and reduce_scatter_tensor against torch's own reduction of
    every rank's shard (Gloo has no reduce_scatter), and their bytes."""
    reductions = {dist.ReduceOp.SUM: lambda t: t.sum(0), dist.ReduceOp.AVG: lambda t: t.sum(0) / N,
                  dist.ReduceOp.MAX: lambda t: t.amax(0), dist.ReduceOp.MIN: lambda t: t.amin(0)}
    for dtype in (torch.float32, torch.int32, torch.float16, torch.bfloat16):
        source = torch.int32 if dtype == torch.int32 else torch.float32
        for op, reduce in reductions.items():
            if op == dist.ReduceOp.AVG and dtype == torch.int32:
                continue
            name = f"reduce_scatter {dtype} {op}"
            # Rank r's shard s: its inputs rolled by s, 5000 elements (14 chunks of 360 at MTU 1500).
            shards = [inputs(rank, 5000, source).roll(s).to(dtype) for s in range(N)]
            everyone = torch.stack([inputs(r, 5000, source).roll(rank).to(dtype) for r in range(N)])
            # int32 SUM wraps modulo 2^32, as xagg's does.
            reference = reduce(everyone.long() if dtype == torch.int32 else everyone.float()).to(
                dtype if dtype == torch.int32 else torch.float32)
            output = torch.full((5000,), 3, dtype=dtype)
            dist.reduce_scatter(output, shards, op=op, group=xagg_group)
            tensor_output = torch.zeros(1000, dtype=dtype)
            dist.reduce_scatter_tensor(tensor_output, torch.cat([shard[:1000] for shard in shards]), op=op,
                                       group=xagg_group)
            if dtype == torch.int32:
                if not torch.equal(output, reference) or not torch.equal(tensor_output, reference[:1000]):
                    failures.append(f"{name}: differs from the exact reduction")
                continue
            largest = float(everyone.float().abs().max())
            allowed = (float_bound(N, largest) if dtype == torch.float32
                       else half_bound(dtype, 16, N, largest, float(reference.abs().max())))
            error = max(float((output.float() - reference).abs().max()),
                        float((tensor_output.float() - reference[:1000]).abs().max()))
            if output.dtype != dtype or error > allowed:
                failures.append(f"{name}: off by {error}, allowed {allowed}")

    # NaN and Inf element-exact through the owner-only results too.
    everyone = torch.stack([non_finite_inputs(r, N, 5000) for r in range(N)])
    output = torch.zeros(5000)
    dist.reduce_scatter_tensor(output, everyone[rank].repeat(N), group=xagg_group)
    expected = everyone.sum(0)
    if not torch.equal(output.nan_to_num(nan=7.0, posinf=8.0, neginf=9.0)[~torch.isfinite(expected)],
                       expected.nan_to_num(nan=7.0, posinf=8.0, neginf=9.0)[~torch.isfinite(expected)]):
        failures.append("reduce_scatter non-finite: NaN/Inf not carried")

    # Bytes: each rank receives its own shard's values and the others' headers,
    # about 1/N of an all_reduce of the whole input (broadcast: one copy each).
    count = 100_000 * N
    data = torch.randn(count)
    received = [fewest_bytes_received(run, xagg_group)
                for run in (lambda: dist.all_reduce(data.clone(), group=xagg_group),
                            lambda: dist.reduce_scatter_tensor(torch.zeros(count // N), data, group=xagg_group))]
    ratio = received[1] / received[0]
    print(f"rank {rank}: reduce_scatter_tensor received {received[1]} bytes, all_reduce {received[0]}: "
          f"{ratio:.3f} (1/N = {1 / N:.3f})", flush=True)
    if not ratio < 1 / N + 0.1:
        failures.append(f"reduce_scatter_tensor received {ratio:.3f} of an all_reduce's bytes, not about 1/{N}")

    for tensor in (torch.ones(4 * N, dtype=torch.int64), torch.ones(4 * N, dtype=torch.float64)):
        try:
            dist.reduce_scatter_tensor(torch.zeros(4, dtype=tensor.dtype), tensor, group=xagg_group)
            failures.append(f"reduce_scatter_tensor {tensor.dtype}: accepted")
        except RuntimeError as error:
            if "xagg" not in str(error):
                failures.append(f"reduce_scatter_tensor {tensor.dtype}: refused without naming xagg: {error}")


def check_point_to_point_orders(rank, N, group, failures):
    """Receives posted before their sends, which Gloo completes: each returns a
    pending Work at once."""
    right, left = (rank + 1) % N, (rank - 1) % N
    received = torch.zeros(5)
    work = dist.irecv(received, left, group=group)  # a ring: irecv, send, wait
    dist.send(torch.full((5,), float(rank)), right, group=group)
    work.wait()
    if not torch.equal(received, torch.full((5,), float(left))):
        failures.append(f"ring irecv before send: {received.tolist()}")

    from_left, from_right = torch.zeros(3), torch.zeros(3)
    operations = [dist.P2POp(dist.irecv, from_left, left, group), dist.P2POp(dist.irecv, from_right, right, group),
                  dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 1), right, group),
                  dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 2), left, group)]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    if not torch.equal(from_left, torch.full((3,), 10.0 * left + 1)) or \
            not torch.equal(from_right, torch.full((3,), 10.0 * right + 2)):
        failures.append(f"batch_isend_irecv, receives first: {from_left.tolist()}, {from_right.tolist()}")

    received = torch.zeros(2, dtype=torch.int64)
    future = dist.irecv(received, left, group=group, tag=7).get_future()
    dist.send(torch.full((2,), rank, dtype=torch.int64), right, group=group, tag=7)
    if not torch.equal(future.wait()[0], torch.full((2,), left, dtype=torch.int64)):
        failures.append(f"irecv future: {received.tolist()}")


def in_rank_order(tensors, combine):
    result = tensors[0].clone()
    for tensor in tensors[1:]:
        result = combine(result, tensor)
    return result


def check_store_reductions(rank, N, group, failures):
    """Reductions through the store: exactly each rank's reduction in rank
    order (so the same on every rank), and Gloo's (exactly where the order
    cannot matter, within float rounding where it can)."""
    ordered = {dist.ReduceOp.SUM: torch.add, dist.ReduceOp.PRODUCT: torch.mul, dist.ReduceOp.MAX: torch.maximum,
               dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.BAND: torch.bitwise_and,
               dist.ReduceOp.BOR: torch.bitwise_or, dist.ReduceOp.BXOR: torch.bitwise_xor}

    def contribution(r, dtype, op):
        generator = torch.Generator().manual_seed(500 + r)
        if dtype == torch.bool:
            return torch.rand(3000, generator=generator) < 0.7
        if not dtype.is_floating_point:
            info = torch.iinfo(dtype)
            low, high = (-3, 4) if op == dist.ReduceOp.PRODUCT else (info.min, info.max)
            return torch.randint(low, high, (3000,), generator=generator, dtype=torch.int64).to(dtype)
        values = torch.randn(3000, generator=generator, dtype=torch.float64)
        return (1 + values / 10 if op == dist.ReduceOp.PRODUCT else values * 10.0 ** r).to(dtype)

    cases = [(torch.float64, op) for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX,
                                            dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT)]
    cases += [(dtype, dist.ReduceOp.PRODUCT) for dtype in (torch.float32, torch.int32, torch.int64, torch.uint8)]
    cases += [(dtype, op) for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool)
              for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)]
    for dtype, op in cases:
        name = f"all_reduce {dtype} {op}"
        everyone = [contribution(r, dtype, op) for r in range(N)]
        expected = in_rank_order(everyone, ordered[dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op])
        if op == dist.ReduceOp.AVG:
            expected = expected / N
        actual = everyone[rank].clone()
        dist.all_reduce(actual, op=op, group=group)
        if actual.dtype != dtype or not torch.equal(actual, expected):
            failures.append(f"{name}: differs from the reduction in rank order")
        if dtype == torch.bool:
            continue  # Gloo does not reduce bool
        gloo = everyone[rank].clone()
        dist.all_reduce(gloo, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op)
        if op == dist.ReduceOp.AVG:
            gloo /= N
        if dtype.is_floating_point:
            # Sums and products in another order: a few roundings apart.
            scale = torch.stack(everyone).abs().sum(0) if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) else \
                expected.abs()
            allowed = 4 * N * torch.finfo(dtype).eps * scale
            if not bool(((gloo - actual).abs() <= allowed).all()):
                failures.append(f"{name}: differs from Gloo's by {float((gloo - actual).abs().max())}")
        elif not torch.equal(gloo, actual):
            failures.append(f"{name}: differs from Gloo's in {int((gloo != actual).sum())} elements")


def check_narrow_integers(rank, N, group, failures):
    """uint8, int8 and int16 through the aggregators in int32: SUM wraps as the
    dtype's own does, MAX and MIN exact; against torch's reduction of every
    rank's input, and Gloo's for uint8 and int8 (it has no int16)."""
    reductions = {dist.ReduceOp.SUM: lambda t: t.sum(0), dist.ReduceOp.MAX: lambda t: t.amax(0),
                  dist.ReduceOp.MIN: lambda t: t.amin(0)}

    def contribution(r, dtype):
        info = torch.iinfo(dtype)
        generator = torch.Generator().manual_seed(900 + r)
        values = torch.randint(info.min, info.max + 1, (5000,), generator=generator, dtype=torch.int64)
        values[:2] = torch.tensor([info.min, info.max])
        return values.to(dtype)

    for dtype in (torch.uint8, torch.int8, torch.int16):
        everyone = torch.stack([contribution(r, dtype) for r in range(N)])
        for op, reduce in reductions.items():
            expected = reduce(everyone.long()).to(dtype)  # the cast wraps as the dtype's sum does
            actual = everyone[rank].clone()
            dist.all_reduce(actual, op=op, group=group)
            if actual.dtype != dtype or not torch.equal(expected, actual):
                failures.append(f"all_reduce {dtype} {op}: differs from the exact reduction in "
                                f"{int((expected != actual).sum())} elements")
            if dtype != torch.int16:
                gloo = everyone[rank].clone()
                dist.all_reduce(gloo, op=op)
                if not torch.equal(gloo, actual):
                    failures.append(f"all_reduce {dtype} {op}: differs from Gloo's in {int((gloo != actual).sum())} "
                                    "elements")


def time_reduction_paths(rank, N, group):
    """Prints how long an all_reduce of 1 Mi elements takes on each path (the
    figures of docs/pytorch.md): float32 through the aggregators, float64 and
    a PRODUCT through the store, Gloo's float64 beside them."""
    runs = {"float32 SUM, aggregators": (torch.float32, dist.ReduceOp.SUM, group),
            "float64 SUM, store": (torch.float64, dist.ReduceOp.SUM, group),
            "float32 PRODUCT, store": (torch.float32, dist.ReduceOp.PRODUCT, group),
            "float64 SUM, Gloo": (torch.float64, dist.ReduceOp.SUM, None)}
    figures = []
    for name, (dtype, op, on) in runs.items():
        tensor = torch.ones(1 << 20, dtype=dtype)
        dist.barrier()
        started = time.monotonic()
        for _ in range(3):
            dist.all_reduce(tensor, op=op, group=on)
        figures.append(f"{name} {(time.monotonic() - started) / 3 * 1000:.0f} ms")
    print(f"rank {rank}: all_reduce of 1 Mi elements, {N} ranks: {', '.join(figures)}", flush=True)


def check_half_precision(rank, N, xagg_group, failures):
    """float16 and bfloat16 go over the 16-bit wire by default, or the 32-bit one
    by option (half_wire_bits): each within its bound plus one rounding to the
    dtype, and the 16-bit wire moving about half the bytes; wire16_hook's float32
    bucket goes over the 16-bit wire too."""
    wide_group = dist.new_group(backend="xagg", pg_options=xagg_torch.Options(half_wire_bits=32))
    count = 200_000
    received = {}
    for wire_bits, group in ((16, xagg_group), (32, wide_group)):
        for dtype in (torch.float16, torch.bfloat16):
            everyone = torch.stack([inputs(r, 3000, torch.float32) / 10.0 ** r for r in range(N)]).to(dtype)
            largest = float(everyone.float().abs().max())
            expectations = {dist.ReduceOp.SUM: everyone.float().sum(0), dist.ReduceOp.AVG: everyone.float().sum(0) / N,
                            dist.ReduceOp.MAX: everyone.float().amax(0), dist.ReduceOp.MIN: everyone.float().amin(0)}
            for op, expected in expectations.items():
                tensor = everyone[rank].clone()
                dist.all_reduce(tensor, op=op, group=group)
                error = float((tensor.float() - expected).abs().max())
                allowed = half_bound(dtype, wire_bits, N, largest, float(expected.abs().max()))
                if tensor.dtype != dtype or error > allowed:
                    failures.append(f"all_reduce {dtype} {op} on the {wire_bits}-bit wire: off by {error}, "
                                    f"allowed {allowed}")
        data = torch.randn(count).to(torch.float16)
        received[wire_bits] = fewest_bytes_received(lambda: dist.all_reduce(data.clone(), group=group), group)
    ratio = received[16] / received[32]
    print(f"rank {rank}: float16 all_reduce of {count} elements received {received[16]} bytes on the 16-bit wire, "
          f"{received[32]} on the 32-bit one ({ratio:.3f})", flush=True)
    if not 0.45 < ratio < 0.6:
        failures.append(f"float16 all_reduce: the 16-bit wire received {ratio:.3f} of the 32-bit one's bytes")

    # The DDP hook's path: a float32 bucket quantized straight onto the 16-bit wire, averaged.
    everyone = torch.stack([inputs(r, 5000, torch.float32) for r in range(N)])
    bucket = everyone[rank].clone()
    reduced = xagg_group.allreduce_on_wire(bucket, dist.ReduceOp.AVG, 16).get_future().wait()[0]
    error = float((reduced - everyone.sum(0) / N).abs().max())
    allowed = narrow_bound(N, float(everyone.abs().max())) / N
    if reduced.dtype != torch.float32 or error > allowed or error <= float_bound(N, float(everyone.abs().max())):
        failures.append(f"allreduce_on_wire float32 over 16 bits: off by {error}, allowed {allowed} (and more "
                        "than the 32-bit wire's bound, as 16 bits give)")
    try:
        xagg_group.allreduce_on_wire(torch.ones(4, dtype=torch.int32), dist.ReduceOp.SUM, 16)
        failures.append("allreduce_on_wire of int32 was not refused")
    except RuntimeError as error:
        if "float32, float16 or bfloat16" not in str(error):
            failures.append(f"allreduce_on_wire of int32: unclear error: {error}")


def main():
    args = testbed_rank.parse_args(lambda parser: None)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    xagg_group = dist.new_group(backend="xagg")
    failures = []
    N = args.world_size

    for dtype in (torch.float32, torch.int32):
        for count in (1, 1000, 5000):
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                if op == dist.ReduceOp.AVG and dtype == torch.int32:
                    continue  # Gloo has no AVG; int32 AVG's truncation is libxagg's own
                name = f"all_reduce {dtype} x{count} {op}"
                reference = inputs(args.rank, count, dtype)
                through_xagg = reference.clone()
                # Gloo has no AVG: the reference is its SUM divided here.
                dist.all_reduce(reference, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op)
                if op == dist.ReduceOp.AVG:
                    reference /= N
                dist.all_reduce(through_xagg, op=op, group=xagg_group)
                if dtype == torch.int32:
                    if not torch.equal(reference, through_xagg):
                        failures.append(f"{name}: differs from Gloo's in {(reference != through_xagg).sum()} elements")
                    continue
                largest = max(float(inputs(rank, count, dtype).abs().max()) for rank in range(N))
                error = float((reference - through_xagg).abs().max())
                if error > float_bound(N, largest):
                    failures.append(f"{name}: differs from Gloo's by {error}, bound {float_bound(N, largest)}")

    # NaN and Inf by IEEE rules (torch.sum, amax, amin), the other elements within the bound.
    everyone = torch.stack([non_finite_inputs(rank, N, 5000) for rank in range(N)])
    largest = float(everyone[torch.isfinite(everyone)].abs().max())
    expectations = {dist.ReduceOp.SUM: everyone.sum(0), dist.ReduceOp.AVG: everyone.sum(0) / N,
                    dist.ReduceOp.MAX: everyone.amax(0), dist.ReduceOp.MIN: everyone.amin(0)}
    for op, expected in expectations.items():
        tensor = everyone[args.rank].clone()
        dist.all_reduce(tensor, op=op, group=xagg_group)
        finite = torch.isfinite(expected)
        same_non_finite = torch.equal(tensor[~finite].nan_to_num(nan=7.0, posinf=8.0, neginf=9.0),
                                      expected[~finite].nan_to_num(nan=7.0, posinf=8.0, neginf=9.0))
        if not same_non_finite or not torch.isfinite(tensor[finite]).all():
            failures.append(f"all_reduce non-finite {op}: {tensor[~finite].tolist()}, expected "
                            f"{expected[~finite].tolist()}")
        error = float((tensor[finite] - expected[finite]).abs().max())
        if error > float_bound(N, largest):
            failures.append(f"all_reduce non-finite {op}: finite elements off by {error}")

    check_half_precision(args.rank, N, xagg_group, failures)

    # Integer AVG (it would truncate) and bitwise ops of floats are refused.
    for tensor, op in ((torch.ones(4, dtype=torch.int32), dist.ReduceOp.AVG),
                       (torch.ones(4, dtype=torch.uint8), dist.ReduceOp.AVG),
                       (torch.ones(4), dist.ReduceOp.BAND),
                       (torch.ones(4, dtype=torch.float64), dist.ReduceOp.BXOR)):
        try:
            dist.all_reduce(tensor, op=op, group=xagg_group)
            failures.append(f"all_reduce {tensor.dtype} {op}: accepted")
        except RuntimeError as error:
            if "xagg" not in str(error):
                failures.append(f"all_reduce {tensor.dtype} {op}: refused without naming xagg: {error}")

    # int64, exact under SUM (wrapping as int64 does), MAX and MIN, against Gloo's.
    generator = torch.Generator().manual_seed(77 + args.rank)
    longs = torch.randint(-(1 << 62), 1 << 62, (5000,), generator=generator, dtype=torch.int64)
    longs[:4] = torch.tensor([torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max, -1, args.rank])
    # The same high word on every rank: the low words decide MAX and MIN.
    longs[4:6] = torch.tensor([(5 << 32) + 7 * args.rank, -(5 << 32) + 0x7FFFFFFF + args.rank])
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        expected, actual = longs.clone(), longs.clone()
        dist.all_reduce(expected, op=op)
        dist.all_reduce(actual, op=op, group=xagg_group)
        if not torch.equal(expected, actual):
            wrong = (expected != actual).nonzero().flatten()[:5].tolist()
            failures.append(f"all_reduce int64 {op}: elements {wrong} differ from Gloo's")
    try:
        dist.all_reduce(longs.clone(), op=dist.ReduceOp.AVG, group=xagg_group)
        failures.append("all_reduce int64 AVG: accepted")
    except RuntimeError as error:
        if "truncate" not in str(error):
            failures.append(f"all_reduce int64 AVG: refused without saying why: {error}")

    # reduce, all_reduce_coalesced, all_gather_into_tensor, send and recv.
    tensor = torch.arange(5000, dtype=torch.int32) * (args.rank + 1)
    dist.reduce(tensor, dst=0, group=xagg_group)
    if args.rank == 0 and not torch.equal(tensor, torch.arange(5000, dtype=torch.int32) * (N * (N + 1) // 2)):
        failures.append("reduce: wrong sum at the root")
    pieces = [torch.full((7,), args.rank, dtype=torch.int32), torch.arange(3000, dtype=torch.int32) * args.rank]
    dist.all_reduce_coalesced(pieces, group=xagg_group)
    if not torch.equal(pieces[0], torch.full((7,), N * (N - 1) // 2, dtype=torch.int32)) or \
            not torch.equal(pieces[1], torch.arange(3000, dtype=torch.int32) * (N * (N - 1) // 2)):
        failures.append("all_reduce_coalesced: wrong sums")
    gathered = torch.zeros(N, 2, 3)
    dist.all_gather_into_tensor(gathered, torch.full((2, 3), float(args.rank)), group=xagg_group)
    if not torch.equal(gathered, torch.arange(N, dtype=torch.float32).view(N, 1, 1).expand(N, 2, 3)):
        failures.append(f"all_gather_into_tensor: {gathered.tolist()}")
    for tag in (0, 5):
        dist.send(torch.arange(4, dtype=torch.float32) + 10 * args.rank + tag, (args.rank + 1) % N, group=xagg_group,
                  tag=tag)
    for tag in (0, 5):
        received = torch.zeros(4)
        source = (args.rank - 1) % N
        dist.recv(received, source, group=xagg_group, tag=tag)
        if not torch.equal(received, torch.arange(4, dtype=torch.float32) + 10 * source + tag):
            failures.append(f"recv from {source} tag {tag}: {received.tolist()}")

    check_point_to_point_orders(args.rank, N, xagg_group, failures)
    check_store_reductions(args.rank, N, xagg_group, failures)
    check_narrow_integers(args.rank, N, xagg_group, failures)
    time_reduction_paths(args.rank, N, xagg_group)
    check_reduce_scatter(args.rank, N, xagg_group, failures)

    # gather, scatter, all_to_all and all_to_all_single, each against Gloo's (the default group).
    def both(run):
        return run(None), run(xagg_group)  # (Gloo's, xagg's)

    def gathered_at_root(group):
        outputs = [torch.zeros(2, 5) for _ in range(N)] if args.rank == 1 else None
        dist.gather(torch.arange(10.0).view(2, 5) * (args.rank + 1), outputs, dst=1, group=group)
        return outputs

    gloo, xagg = both(gathered_at_root)
    if args.rank == 1 and any(not torch.equal(a, b) for a, b in zip(gloo, xagg)):
        failures.append(f"gather: {[t.tolist() for t in xagg]} against Gloo's {[t.tolist() for t in gloo]}")

    def scattered(group):
        output = torch.zeros(6, dtype=torch.int32)
        inputs = [torch.arange(6, dtype=torch.int32) + 100 * r for r in range(N)] if args.rank == 0 else None
        dist.scatter(output, inputs, src=0, group=group)
        return output

    gloo, xagg = both(scattered)
    if not torch.equal(gloo, xagg):
        failures.append(f"scatter: {xagg.tolist()} against Gloo's {gloo.tolist()}")

    def exchanged_single(group):
        # Rank r sends d + 1 rows to rank d, so rank d receives d + 1 rows from every rank.
        output = torch.zeros((args.rank + 1) * N, 3)
        source = torch.cat([torch.full((d + 1, 3), 100.0 * args.rank + d) for d in range(N)])
        dist.all_to_all_single(output, source, [args.rank + 1] * N, [d + 1 for d in range(N)], group=group)
        return output

    gloo, xagg = both(exchanged_single)
    if not torch.equal(gloo, xagg):
        failures.append(f"all_to_all_single: {xagg.tolist()} against Gloo's {gloo.tolist()}")
    # Gloo has no list all_to_all: against the rule (rank s's tensor d arrives as rank d's output s).
    outputs = [torch.zeros(args.rank + 1) for _ in range(N)]
    dist.all_to_all(outputs, [torch.full((d + 1,), 10.0 * args.rank + d) for d in range(N)], group=xagg_group)
    if any(not torch.equal(outputs[s], torch.full((args.rank + 1,), 10.0 * s + args.rank)) for s in range(N)):
        failures.append(f"all_to_all: {[t.tolist() for t in outputs]}")

    tensor = torch.arange(10, dtype=torch.float32) + args.rank
    dist.broadcast(tensor, src=N - 1, group=xagg_group)
    if not torch.equal(tensor, torch.arange(10, dtype=torch.float32) + N - 1):
        failures.append(f"broadcast: {tensor.tolist()}")
    gathered = [torch.zeros(3) for _ in range(N)]
    dist.all_gather(gathered, torch.full((3,), float(args.rank)), group=xagg_group)
    if [t.tolist() for t in gathered] != [[float(r)] * 3 for r in range(N)]:
        failures.append(f"all_gather: {[t.tolist() for t in gathered]}")
    dist.barrier(group=xagg_group)

    # Last, since it leaves its group unusable: tensors of different sizes fail
    # on every rank, naming the sizes, well before the group's timeout.
    mismatched_group = dist.new_group(backend="xagg", timeout=timedelta(seconds=12))
    size = 3000 + 1000 * args.rank
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(size), group=mismatched_group)
        failures.append(f"all_reduce of {size} elements beside other sizes: returned")
    except RuntimeError as error:
        elapsed = time.monotonic() - started
        if "sizes differ" not in str(error) or str(size) not in str(error) or elapsed > 9:
            failures.append(f"mismatched sizes: after {elapsed:.1f} s: {error}")

    testbed_rank.exit_with(args.rank, failures, "every collective matched Gloo")


if __name__ == "__main__":
    main()
