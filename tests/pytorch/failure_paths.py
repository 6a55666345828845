#!/usr/bin/python3
"""One rank of the failure-path test (run by failure_paths_test.cpp in a testbed namespace).

Every rank creates one "xagg" group per path a caller can take (sync call,
wait(), wait(timeout), get_future(), barrier, DDP, the DDP comm hook), checks
that each works, then meets the fault: the last rank is SIGKILLed, or stalls
(joins late, then stays alive and joined but never calls), or the harness SIGKILLs the aggregator. Every
surviving rank then takes each path once and requires an exception naming the
cause within the group's timeout plus MARGIN_S. A path that returns normally
(the tensor would hold this rank's own input) fails the test: exit code 1.
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
# Beyond the group's timeout: the aggregator's report of a disconnect, thread
# wake-ups and Python's own overhead.
MARGIN_S = 3.0


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(64, 8)


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
    for path in PATHS:
        groups[path] = dist.new_group(backend="xagg", timeout=timeout)
    models["ddp"] = DistributedDataParallel(make_model(), process_group=groups["ddp"])
    models["hook"] = DistributedDataParallel(make_model())
    models["hook"].register_comm_hook(groups["hook"], xagg_torch.allreduce_hook)
    for path in PATHS:  # every path works before the fault
        check = torch.ones(4)
        dist.all_reduce(check, group=groups[path])
        if not torch.equal(check, torch.full((4,), float(args.world_size))):
            sys.exit(f"rank {args.rank}: {path} group's all-reduce gave {check.tolist()} before any fault")
    print(f"rank {args.rank}: READY", flush=True)

    if args.fault == "aggregator-killed":
        while not os.path.exists(args.go_file):
            time.sleep(0.05)
    elif args.rank == victim:
        if args.fault == "rank-killed":
            time.sleep(1.0)  # while the others' first collective is in flight
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # rank-stalled: the harness ends it

    expected = {
        "rank-killed": f"rank {victim} disconnected",
        "rank-stalled": f"did not contribute: {victim}",
        "aggregator-killed": f"aggregator {args.aggregator}",
    }[args.fault]
    failures = []
    for path in PATHS:
        start = time.monotonic()
        try:
            take_path(path, groups[path], models.get(path), args.timeout_s)
            failures.append(f"{path}: returned normally")
            continue
        except Exception as error:  # every path must raise, whatever the type
            message = str(error)
        elapsed = time.monotonic() - start
        print(f"rank {args.rank}: {path} raised after {elapsed:.1f} s: {message.splitlines()[0] if message else ''}",
              flush=True)
        if expected not in message:
            failures.append(f"{path}: the error does not say '{expected}': {message}")
        if elapsed > args.timeout_s + MARGIN_S:
            failures.append(f"{path}: raised after {elapsed:.1f} s, beyond the timeout {args.timeout_s} s + "
                            f"{MARGIN_S} s")
    testbed_rank.exit_with(args.rank, failures, "every path raised")


if __name__ == "__main__":
    main()
