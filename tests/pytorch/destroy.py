#!/usr/bin/python3
"""One rank of the destroy test (run by destroy_test.cpp in a testbed namespace).

torch.distributed.destroy_process_group() must return, in every state a
training script can leave an "xagg" group in, and the work queued before it
must end as it would have without it. Each round creates a default "xagg"
group (a job of its own), leaves it in one state and destroys it:
  sync     synchronous collectives (all_reduce, broadcast, all_gather, send/recv);
  async    all-reduces in flight, some with no handle left to Python (their
           tensors die on the group's thread), a pending irecv that no rank
           matches (it must fail, naming the shutdown);
  future   all-reduces whose futures carry Python callbacks, chained;
  failed   an all-reduce that fails (tensors of different sizes) while in flight.
With --peer-dies, a last round has the last rank SIGKILLed while the others
have all-reduces and a receive from it pending: destroy returns on the
survivors, and each pending work raises naming the dead rank.
A destroy that does not return within HANG_S dumps every thread's Python stack
and exits 1; any other difference exits 1 too.
"""
import datetime
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import xagg_torch

import testbed_rank

STATES = ["sync", "async", "future", "failed"]
TIMEOUT_S = 4.0
# destroy completes queued work: a failing all-reduce takes a quarter of the
# timeout to fail; anything beyond the timeout plus a margin is a hang.
HANG_S = TIMEOUT_S + 5.0
ELEMENTS = 1 << 16


def make_group(store, round_number, rank, world_size):
    dist.init_process_group("xagg", store=dist.PrefixStore(f"round{round_number}", store), rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            pg_options=xagg_torch.Options(job_id=round_number + 1))


def destroy(rank, what):
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    started = time.monotonic()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    return time.monotonic() - started


def expect_raise(failures, what, work, needle):
    try:
        work.wait()
        failures.append(f"{what}: returned normally")
    except Exception as error:  # any type, as long as it says why
        if needle not in str(error):
            failures.append(f"{what}: the error does not say '{needle}': {error}")


def run_round(state, rank, world_size, failures):
    """Leaves the group in `state`; returns a check to run after destroy."""
    total = float(world_size * (world_size - 1) // 2)
    if state == "sync":
        tensor = torch.full((ELEMENTS,), float(rank))
        dist.all_reduce(tensor)
        broadcast = torch.full((8,), float(rank))
        dist.broadcast(broadcast, src=world_size - 1)
        gathered = [torch.zeros(2) for _ in range(world_size)]
        dist.all_gather(gathered, torch.full((2,), float(rank)))
        dist.send(torch.full((3,), float(rank)), (rank + 1) % world_size)
        received = torch.zeros(3)
        dist.recv(received, (rank - 1) % world_size)
        ok = (torch.equal(tensor, torch.full((ELEMENTS,), total)) and
              torch.equal(broadcast, torch.full((8,), float(world_size - 1))) and
              [t.tolist() for t in gathered] == [[float(r)] * 2 for r in range(world_size)] and
              torch.equal(received, torch.full((3,), float((rank - 1) % world_size))))
        return lambda: ok or failures.append("sync: wrong results")
    if state == "async":
        kept = [torch.full((ELEMENTS,), float(rank)) for _ in range(4)]
        works = [dist.all_reduce(tensor, async_op=True) for tensor in kept]
        for _ in range(4):  # no handle left: the group's thread drops the last reference
            dist.all_reduce(torch.full((ELEMENTS,), float(rank)), async_op=True)
        unmatched = dist.irecv(torch.zeros(4), (rank + 1) % world_size, tag=99)

        def check():
            for work in works:
                work.wait()
            if any(not torch.equal(tensor, torch.full((ELEMENTS,), total)) for tensor in kept):
                failures.append("async: an all-reduce queued before destroy did not complete")
            expect_raise(failures, "async: the unmatched irecv", unmatched, "shut down")
        return check
    if state == "future":
        futures = []
        for index in range(4):
            tensor = torch.full((ELEMENTS,), float(rank + index))
            future = dist.all_reduce(tensor, async_op=True).get_future()
            futures.append(future.then(lambda f: f.value()[0] * 2).then(lambda f: f.value().sum()))

        def check():
            for index, future in enumerate(futures):
                expected = 2.0 * ELEMENTS * (total + world_size * index)
                if float(future.wait()) != expected:
                    failures.append(f"future {index}: {float(future.wait())}, expected {expected}")
        return check
    # failed: the ranks all-reduce different sizes, which fails on every rank.
    work = dist.all_reduce(torch.ones(1000 + 100 * rank), async_op=True)
    return lambda: expect_raise(failures, "failed: the mismatched all-reduce", work, "sizes differ")


def main():
    def add_arguments(parser):
        parser.add_argument("--rounds", type=int, required=True)
        parser.add_argument("--peer-dies", action="store_true")

    args = testbed_rank.parse_args(add_arguments)
    store = dist.TCPStore(args.master, 29500, args.world_size, args.rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    failures = []
    slowest = 0.0
    for round_number in range(args.rounds):
        state = STATES[round_number % len(STATES)]
        make_group(store, round_number, args.rank, args.world_size)
        check = run_round(state, args.rank, args.world_size, failures)
        slowest = max(slowest, destroy(args.rank, state))
        check()
    print(f"rank {args.rank}: {args.rounds} rounds destroyed, the slowest destroy took {slowest:.2f} s", flush=True)

    if args.peer_dies:
        victim = args.world_size - 1
        make_group(store, args.rounds, args.rank, args.world_size)
        dist.all_reduce(torch.ones(4))  # every rank has joined
        if args.rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        works = [dist.all_reduce(torch.ones(ELEMENTS), async_op=True) for _ in range(4)]
        receive = dist.irecv(torch.zeros(4), victim)
        time.sleep(1.0)  # the victim is gone by now
        took = destroy(args.rank, "peer died")
        print(f"rank {args.rank}: destroy after rank {victim} died took {took:.2f} s", flush=True)
        for index, work in enumerate(works):
            expect_raise(failures, f"peer died: all-reduce {index}", work, f"rank {victim} disconnected")
        expect_raise(failures, "peer died: irecv", receive, f"rank {victim} disconnected")
    testbed_rank.exit_with(args.rank, failures, "every destroy returned")


if __name__ == "__main__":
    main()
