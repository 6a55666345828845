#!/usr/bin/python3
"""The planner against measurement (docs/results/planner.md).

For each scenario: `xagg plan --scenario` predicts every aggregator layout's
critical path; `xagg bench hetero` then measures the systems in each of those
layouts (the plan's hosts and rates) and Gloo's ring once. Prints, per
scenario, the predicted and the measured order of --system's layouts, how many
pairs of layouts the two order alike, and --system in the planned layout
against the best of the TCP PS (over all layouts) and Gloo. --system tcp-ps
checks the model on the TCP PS, whose links carry what XAgg's do in one level
(src/plan/link_bound.h), so two-level layouts are left out then. Needs root;
run it under the testbed lock, one at a time.

  scripts/plan_accuracy.py --xagg build/src/tools/xagg --iterations 5 --out /tmp/acc scenarios/a.json ...
"""
import argparse
import itertools
import json
import os
import subprocess
import sys


def run(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}")
    return result.stdout


def median(values):
    values = sorted(values)
    return values[(len(values) - 1) // 2] if values else float("nan")


def measure(xagg, scenario_file, variant, systems, iterations, out_dir, tag):
    """Median critical path (ms) of each system in this layout."""
    with open(scenario_file) as f:
        scenario = json.load(f)
    for key, value in variant.items():  # None: the field goes
        if value is None:
            scenario.pop(key, None)
        else:
            scenario[key] = value
    scenario["systems"] = systems
    scenario["name"] = f"{scenario.get('name', 'scenario')}-{tag}"
    # Beside the original, so that the bench finds the same traces/.
    path = os.path.join(os.path.dirname(os.path.abspath(scenario_file)), f".plan-accuracy-{os.getpid()}-{tag}.json")
    with open(path, "w") as f:
        json.dump(scenario, f)
    result_file = os.path.join(out_dir, f"{scenario['name']}.json")
    try:
        run([xagg, "bench", "hetero", "--scenario", path, "--iterations", str(iterations), "--json", result_file])
    finally:
        os.remove(path)
    with open(result_file) as f:
        result = json.load(f)
    return {s["system"]: s["median_critical_ms"] for s in result["systems"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xagg", default="build/src/tools/xagg")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--system", default="xagg", choices=["xagg", "tcp-ps"], help="whose order is compared")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tie", type=float, default=0.05, help="the planner's tie margin, fraction")
    parser.add_argument("--tie-ms", type=float, default=1.0)
    parser.add_argument("scenarios", nargs="+")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"# CPU: {cpu}; {args.iterations} timed iterations per system and layout; medians in ms")
    agreeing = compared = 0
    rows = []
    for scenario_file in args.scenarios:
        name = os.path.splitext(os.path.basename(scenario_file))[0]
        plan_file = os.path.join(args.out, f"{name}-plan.json")
        run([args.xagg, "plan", "--scenario", scenario_file, "--json", plan_file])
        with open(plan_file) as f:
            plan = json.load(f)
        measured = {}
        tcp_ps = {}
        gloo = None
        layouts = [l for l in plan["layouts"] if args.system == "xagg" or not l["aggregators"].startswith("two-level")]
        for layout in layouts:
            chosen = layout["aggregators"] == plan["choice"]["aggregators"]
            variant = {"aggregators": layout["aggregators"] if not layout["aggregators"].isdigit()
                       else int(layout["aggregators"])}
            variant["aggregator_gbit"] = layout["aggregator_gbit"] if layout["aggregators"] != "colocated" else None
            systems = sorted({args.system, "tcp-ps"}, reverse=True) + (["gloo"] if chosen else [])
            figures = measure(args.xagg, scenario_file, variant, systems, args.iterations, args.out,
                              layout["aggregators"].replace(":", "-"))
            measured[layout["aggregators"]] = figures[args.system]
            tcp_ps[layout["aggregators"]] = figures["tcp-ps"]
            if chosen:
                gloo = figures["gloo"]
        if gloo is None:  # the choice was left out: the ring beside the first layout measured
            gloo = measure(args.xagg, scenario_file, {}, ["gloo"], args.iterations, args.out, "ring")["gloo"]
        predicted = {l["aggregators"]: l["critical_ms"] for l in layouts}
        pairs = agree = ties = 0
        for a, b in itertools.combinations(predicted, 2):
            pa, pb = predicted[a], predicted[b]
            if pa <= pb * (1 + args.tie) + args.tie_ms and pb <= pa * (1 + args.tie) + args.tie_ms:
                ties += 1  # the model does not order them
                continue
            pairs += 1
            agree += (pa < pb) == (measured[a] < measured[b])
        agreeing += agree
        compared += pairs
        choice = plan["choice"]["aggregators"]
        best_baseline = min(min(tcp_ps.values()), gloo)
        planned = measured.get(choice, float("nan"))  # a two-level choice is not measured for the TCP PS
        rows.append((name, choice, sorted(predicted, key=predicted.get), sorted(measured, key=measured.get),
                     f"{agree}/{pairs}", ties, planned, min(tcp_ps.values()),
                     min(tcp_ps, key=tcp_ps.get), gloo, planned <= best_baseline * 1.05))
        print(f"# {name}: predicted " + ", ".join(f"{k} {v:.1f}" for k, v in predicted.items()) +
              f"; ring {plan['ring']['critical_ms']:.1f}")
        print(f"# {name}: measured {args.system} " + ", ".join(f"{k} {v:.1f}" for k, v in measured.items()) +
              "; TCP PS " + ", ".join(f"{k} {v:.1f}" for k, v in tcp_ps.items()) + f"; Gloo {gloo:.1f}")
        sys.stdout.flush()
    print(f"| scenario | planned | predicted order | measured order ({args.system}) | pairs agreeing | predicted ties "
          f"| {args.system} planned | TCP PS best (layout) | Gloo | within 5% of best baseline |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, choice, p, m, pairs, ties, xagg, tcp, tcp_layout, gloo, ok) in rows:
        print(f"| {name} | {choice} | {' < '.join(p)} | {' < '.join(m)} | {pairs} | {ties} | {xagg:.1f} "
              f"| {tcp:.1f} ({tcp_layout}) | {gloo:.1f} | {'yes' if ok else 'no'} |")
    if compared:
        print(f"# pairs ordered alike: {agreeing} of {compared} ({100 * agreeing / compared:.0f}%)")


if __name__ == "__main__":
    main()
