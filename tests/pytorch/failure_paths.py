#!/usr/bin/python3
"""One rank of the failure-path test (run by failure_paths_test.cpp in a testbed namespace).

Every rank creates one "xagg" group per path a caller can take (sync call,
wait(), wait(timeout), get_future(), barrier, DDP, the DDP comm hook) and one
for the calls that go through the store (broadcast, all_gather, gather,
scatter, all_to_all, recv, irecv), then one more with torch's default timeout
(30 minutes), which must not stretch the others' waits; it checks that each
works, then meets the fault: the last rank is SIGKILLed, or stalls (joins late,
then stays alive and joined but never calls), or the harness SIGKILLs the
aggregator. Every surviving rank then takes each path once, the store's first
(but gather, last), the victim being the rank every store path waits for, and requires an
exception naming the cause: a killed rank within DEAD_PEER_S of its death, a
stalled one within the group's timeout plus MARGIN_S. A path that returns
normally (the tensor would hold this rank's own input) fails the test: exit
code 1. The store paths do not use the aggregator: a killed aggregator is met
by the others only.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import xagg_torch

import testbed_rank

PATHS = ["sync", "wait", "wait_timeout", "future", "barrier", "ddp", "hook"]
# gather waits at its root only, so the other survivors run ahead of the root
# after it: it goes last, where that skew cannot make a survivor look stalled.
STORE_PATHS = ["broadcast", "all_gather", "scatter", "all_to_all", "recv", "irecv", "gather"]
# Beyond the group's timeout: the aggregator's report of a disconnect, thread
# wake-ups and Python's own overhead.
MARGIN_S = 3.0
# The killed rank dies KILL_DELAY_S after it is ready, while the others' first
# path waits for it; each path must name it within DEAD_PEER_S of its death,
# give or take START_SKEW_S between the ranks' starts.
KILL_DELAY_S = 1.0
DEAD_PEER_S = 1.0
START_SKEW_S = 0.5


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(64, 8)


def take_store_path(path, group, rank, world_size, victim):
    """Runs one store-based call waiting for `victim` (a gather only at its
    root, rank 0); returns only if it claims success."""
    tensor = torch.ones(1 << 10)
    if path == "broadcast":
        dist.broadcast(tensor, src=victim, group=group)
    elif path == "all_gather":
        dist.all_gather([torch.zeros_like(tensor) for _ in range(world_size)], tensor, group=group)
    elif path == "gather":
        dist.gather(tensor, [torch.zeros_like(tensor) for _ in range(world_size)] if rank == 0 else None, dst=0,
                    group=group)
    elif path == "scatter":
        dist.scatter(tensor, None, src=victim, group=group)
    elif path == "all_to_all":
        dist.all_to_all([torch.zeros(4) for _ in range(world_size)], [torch.ones(4) for _ in range(world_size)],
                        group=group)
    elif path == "recv":
        dist.recv(tensor, victim, group=group)
    else:  # irecv
        dist.irecv(tensor, victim, group=group).wait()


def take_path(path, group, model, timeout_s):
    """Runs one collective along `path`; returns only if it claims success."""
    tensor = torch.ones(1 << 16)
    if path == "sync":
        dist.all_reduce(tensor, group=group)
    elif path == "wait":
        dist.all_reduce(tensor, group=group, async_op=True).wait()
    elif path == "wait_timeout":
        # Longer than the group's timeout: the collective's own error must come first.
        dist.all_reduce(tensor, group=group, async_op=True).wait(timeout=datetime.timedelta(seconds=2 * timeout_s))
    elif path == "future":
        dist.all_reduce(tensor, group=group, async_op=True).get_future().wait()
    elif path == "barrier":
        dist.barrier(group=group)
    else:  # ddp, hook: a training step's backward all-reduces the gradient
        model(torch.ones(4, 64)).sum().backward()


def main():
    def add_arguments(parser):
        parser.add_argument("--fault", choices=["rank-killed", "rank-stalled", "aggregator-killed"], required=True)
        parser.add_argument("--timeout-s", type=float, required=True, help="every group's timeout")
        parser.add_argument("--go-file", help="aggregator-killed: continue once the harness creates it")

    args = testbed_rank.parse_args(add_arguments)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    victim = args.world_size - 1

    # The default group (Gloo) carries the hook path's DDP; each path gets an xagg
    # group, and so a job of its own, with no setting changed in between.
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size, timeout=timeout)
    groups, models = {}, {}
    if args.fault == "rank-stalled" and args.rank == victim:
        time.sleep(2.0)  # late to join too: the others log whom they wait for
    for path in PATHS + ["store"]:
        groups[path] = dist.new_group(backend="xagg", timeout=timeout)
    dist.new_group(backend="xagg")  # torch's default timeout: the others keep theirs
    models["ddp"] = DistributedDataParallel(make_model(), process_group=groups["ddp"])
    models["hook"] = DistributedDataParallel(make_model())
    models["hook"].register_comm_hook(groups["hook"], xagg_torch.allreduce_hook)
    for path in PATHS + ["store"]:  # every path works before the fault
        check = torch.ones(4)
        dist.all_reduce(check, group=groups[path])
        if not torch.equal(check, torch.full((4,), float(args.world_size))):
            sys.exit(f"rank {args.rank}: {path} group's all-reduce gave {check.tolist()} before any fault")
    broadcast = torch.full((4,), float(args.rank))
    dist.broadcast(broadcast, src=victim, group=groups["store"])
    if not torch.equal(broadcast, torch.full((4,), float(victim))):
        sys.exit(f"rank {args.rank}: the store group's broadcast gave {broadcast.tolist()} before any fault")
    print(f"rank {args.rank}: READY", flush=True)

    if args.fault == "aggregator-killed":
        while not os.path.exists(args.go_file):
            time.sleep(0.05)
    elif args.rank == victim:
        if args.fault == "rank-killed":
            time.sleep(KILL_DELAY_S)  # while the others' first collective is in flight
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # rank-stalled: the harness ends it

    expected = {
        "rank-killed": f"rank {victim} disconnected",
        "rank-stalled": f"did not contribute: {victim}",
        "aggregator-killed": f"aggregator {args.aggregator}",
    }[args.fault]
    expected_from_store = {"rank-killed": expected, "rank-stalled": f"waiting for rank {victim}"}.get(args.fault)
    limit = args.timeout_s + MARGIN_S
    if args.fault == "rank-killed":
        limit = KILL_DELAY_S + DEAD_PEER_S + START_SKEW_S
    failures = []
    store_paths = STORE_PATHS if expected_from_store else []
    for path in store_paths[:-1] + PATHS + store_paths[-1:]:
        start = time.monotonic()
        try:
            if path in STORE_PATHS:
                take_store_path(path, groups["store"], args.rank, args.world_size, victim)
            else:
                take_path(path, groups[path], models.get(path), args.timeout_s)
            if path == "gather" and args.rank != 0:
                continue  # a gather waits at its root only
            failures.append(f"{path}: returned normally")
            continue
        except Exception as error:  # every path must raise, whatever the type
            message = str(error)
        elapsed = time.monotonic() - start
        print(f"rank {args.rank}: {path} raised after {elapsed:.2f} s: {message.splitlines()[0] if message else ''}",
              flush=True)
        needle = expected_from_store if path in STORE_PATHS else expected
        if needle not in message:
            failures.append(f"{path}: the error does not say '{needle}': {message}")
        if elapsed > limit:
            failures.append(f"{path}: raised after {elapsed:.2f} s, beyond {limit} s")
    testbed_rank.exit_with(args.rank, failures, "every path raised")


if __name__ == "__main__":
    main()
