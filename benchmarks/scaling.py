"""Scaling over devices: likelihood + gradient with patterns (or trees) split over a device mesh (issue #20).

    python benchmarks/scaling.py [--taxa 1000] [--patterns 100000] [--devices 1,2] [--mode strong|batch]
                                 [--trees-per-device 4] [--repeats 10] [--precision float64] [--out DIR]
    python benchmarks/scaling.py --mode mc3|bootstrap --alignment ALN [--model GTR+G4] [--per-device 2]
                                 [--generations 1000] [--sample-every 100] [--devices 1,2]
    ... [--profile] [--tag 4gpu-h100]      (strong/batch: where one step's time goes; the results file's name)

`mc3` and `bootstrap` (weak scaling of whole runs): `--per-device` MC3 runs
(4 chains, `--generations`) or bootstrap replicates per device on a real
alignment, the batch over the devices, each run made 1 + `--repeats` times (compile, then
timed). `--processes` (mc3, bootstrap): a count of n devices runs as n processes joined by
`jax.distributed`, one device each (what `jaxphylo --distributed mcmc|ml` does with
a process per GPU), instead of one process driving n devices.

`strong` (the default): one tree of TAXA x PATTERNS random patterns (HKY+G4, a
random topology), `jax.value_and_grad` of `sharded_log_likelihood` with
respect to every branch length and model leaf, the patterns split over 1, 2,
... devices (mesh batch=1 x patterns=n). `batch` (weak scaling): n x K random
topologies over the same data, the trees split over the devices (mesh
batch=n x patterns=1), as MC3 chains or bootstrap replicates would be.

Each device count runs in a fresh process that sees only the first n devices
(on GPUs `CUDA_VISIBLE_DEVICES` hides the others), so that a GPU's peak
memory (`memory_stats()["peak_bytes_in_use"]`) is that run's own. Columns:
compile seconds (lower + compile, apart), the median
seconds of the compiled value-and-gradient, XLA's own per-device account of
the program (arguments + outputs + temporaries), the measured peak on a GPU,
the time of one all-reduce of the cotangents alone (what crosses devices in
a gradient: branch lengths and model leaves, plus a scalar forward), and the
efficiency t1 / (n tn) (strong) or t1 / tn (batch). A strong row also gives
the schedule each device runs (its step width, the widest that the memory cap
allows for the device's columns, and the slots and level steps that follow;
`--step-width W` forces a width, for probes) and the forward pass alone;
`--profile` adds, per device, the kernels of one step traced with
`jax.profiler` (busy and idle time, kernels per step and how many are under
10 us, the largest kernels, the all-reduce kernels).

On a CPU, force host devices for a smoke test (they share the cores, so the
efficiency says nothing about speed there):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python benchmarks/scaling.py --taxa 16 --patterns 1001 --devices 1,2 --out /tmp/scaling
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_ENV = dict(os.environ)  # the runs get JAX's defaults (a GPU memory pool allocated at start)
if "--one" not in sys.argv:  # this parent only counts devices: it must not take the GPUs' pools itself
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

import jaxphylo as jp  # noqa: E402

from _common import device_record, save, time_call  # noqa: E402
from likelihood import make_case  # noqa: E402


def allreduce_seconds(mesh, size: int, repeats: int) -> float:
    """Median seconds of one all-reduce of `size` float64s over the whole mesh (the gradient's communication)."""
    total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, ("batch", "patterns")), mesh=mesh,
                                  in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False))
    values = jp.replicate(np.ones(size), mesh)
    return time_call(lambda: total(values), repeats)[1]


def one_application(args, count: int) -> dict:
    """Weak scaling of a whole MC3 run or bootstrap: `--per-device` runs (replicates) on each of `count` devices.

    The run is made `1 + --repeats` times with the same shapes: the first compiles, the others are timed
    (`median_s` is their median wall time, `compile_s` the first's surplus over it).
    """
    devices = jax.devices()[:count]
    alignment = jp.read_alignment(args.alignment)
    model = jp.parse_model(args.model)
    batch = args.per_device * count
    if args.mode == "mc3":
        mesh = jp.device_mesh(devices, batch=count, patterns=1)
        settings = jp.inference.MC3Settings(runs=batch, chains=4, generations=args.generations,
                                            sample_every=args.sample_every, block=50)
        run = lambda: jp.inference.mc3(alignment, model, settings=settings, seed=args.seed, mesh=mesh)  # noqa: E731
    else:
        mesh = jp.device_mesh(devices, trees=batch, num_patterns=alignment.site_patterns().weights.shape[0])
        start = jp.bionj(jp.distances(alignment, saturated=5.0), alignment.taxa)
        fitted = jp.ml.fit(alignment, start, model)
        run = lambda: jp.ml.bootstrap(alignment, fitted, replicates=batch, seed=args.seed, mesh=mesh)  # noqa: E731
    times = []
    for _ in range(1 + args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(jax.tree_util.tree_leaves(run()))
        times.append(time.perf_counter() - start)
    return {"devices": count, "mesh": dict(mesh.shape), "alignment": Path(args.alignment).parent.name,
            "model": args.model, "batch": batch, "generations": args.generations if args.mode == "mc3" else None,
            "sample_every": args.sample_every if args.mode == "mc3" else None,
            "patterns_per_device": int(alignment.site_patterns().weights.shape[0]),
            "compile_s": times[0] - float(np.median(times[1:])), "median_s": float(np.median(times[1:])),
            "timed_s": times[1:], "xla_bytes_per_device": None,
            "peak_bytes_per_device": _peak(devices), "allreduce_s": 0.0, "repeats": args.repeats}


def _peak(devices):
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices
             if d.platform != "cpu" and d.process_index == jax.process_index()]
    return max(peaks) if peaks and None not in peaks else None


def one_count(args, count: int) -> dict:
    """One device count, in this process: compile, time, memory."""
    if args.mode in ("mc3", "bootstrap"):
        return one_application(args, count)
    devices = jax.devices()[:count]
    tree, model, data = make_case("4", args.taxa, args.patterns, seed=args.seed)
    if args.mode == "strong":
        mesh = jp.device_mesh(devices, batch=1, patterns=count)
        batch = None
    else:
        mesh = jp.device_mesh(devices, batch=count, patterns=1)
        trees = [jp.random_topology_tree(tree.taxa, seed=args.seed + k, mean_branch_length=0.05)
                 for k in range(count * args.trees_per_device)]
        batch = jp.TreeBatch.from_trees(trees)  # the random data is in tree.taxa order, as the batch's
    sharded = jp.shard_pattern_data(data, mesh)
    model = jp.replicate(model, mesh)

    schedule = None
    if batch is None:
        schedule = _schedule_row(args.step_width, tree, model, sharded, mesh, args.precision)

        def objective(model, lengths, data):
            return jp.sharded_log_likelihood(data, tree.with_branch_lengths(lengths), model, mesh,
                                             precision=args.precision)
        lengths = jp.replicate(tree.branch_lengths, mesh)
    else:
        def objective(model, lengths, data):
            trees = jp.TreeBatch(batch.parents, lengths, batch.taxa)
            return jp.sharded_batch_log_likelihoods(data, trees, model, mesh, precision=args.precision).sum()
        lengths = batch.branch_lengths

    dynamic, static = eqx.partition((model, lengths, sharded), eqx.is_array)
    step = jax.jit(lambda d: jax.value_and_grad(objective, argnums=(0, 1))(*eqx.combine(d, static)))
    start = time.perf_counter()
    compiled = step.lower(dynamic).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    xla_bytes = None
    if memory is not None:
        xla_bytes = memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
    median = time_call(lambda: compiled(dynamic), args.repeats)[1]
    leaves = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(eqx.filter((model, lengths), eqx.is_array)))
    row = {"devices": count, "mesh": dict(mesh.shape), "taxa": args.taxa, "patterns": args.patterns,
           "trees": 1 if batch is None else len(batch), "precision": args.precision,
           "patterns_per_device": sharded.tip_codes.shape[1] // mesh.shape["patterns"],
           "compile_s": compile_s, "median_s": median, "xla_bytes_per_device": xla_bytes,
           "peak_bytes_per_device": _peak(devices),
           "allreduce_s": allreduce_seconds(mesh, leaves, args.repeats) if count > 1 else 0.0,
           "repeats": args.repeats}
    if schedule is not None:
        row["schedule_per_device"] = schedule
        forward = jax.jit(lambda d: objective(*eqx.combine(d, static)))
        row["forward_s"] = time_call(lambda: forward(dynamic), args.repeats)[1]
    if args.profile:
        row["profile"] = profile_step(lambda: compiled(dynamic), calls=3)
    return row


def _schedule_row(choice: str, tree, model, sharded, mesh, precision: str) -> dict:
    """The schedule one device runs: the library's (`auto`: the widest step the memory cap allows for the
    device's columns, `jaxphylo.likelihood.max_step_width`) or, for probes, a forced width."""
    from jaxphylo.likelihood import PRECISIONS, PatternData, max_step_width
    from jaxphylo.likelihood.kernels import exact_steps
    from jaxphylo.tree import build_schedule, phase_widths, trim_slots

    dtype = PRECISIONS[precision]
    columns = sharded.tip_codes.shape[1] // mesh.shape["patterns"]
    local = PatternData(jax.ShapeDtypeStruct((sharded.tip_codes.shape[0], columns), sharded.tip_codes.dtype),
                        sharded.tip_table, jax.ShapeDtypeStruct((columns,), dtype))
    cap = max_step_width(model, local, dtype)
    if choice != "auto":  # the probe's forced width, where the one-tree likelihood asks for the cap (a probe
        # reaches into the module that asks: no option of the library forces a width)
        from jaxphylo.likelihood import _single

        def forced(*_args, **_kwargs) -> int:
            return int(choice)

        _single.max_step_width = forced
    width = phase_widths(tree.num_tips, cap if choice == "auto" else int(choice))[0]
    schedule = trim_slots(build_schedule(tree.topology, width))
    return {"rule": choice, "width": width, "slots": schedule.num_slots, "steps": sum(exact_steps(schedule))}


def profile_step(call, calls: int = 3) -> dict:
    """`calls` calls of a compiled step traced by `jax.profiler`: per device, the kernel time per call (the union
    of its kernels' intervals on every stream), kernels per call, the largest kernels and the collectives."""
    folder = tempfile.mkdtemp(prefix="scaling-trace-")
    jax.block_until_ready(call())
    start = time.perf_counter()
    with jax.profiler.trace(folder):
        for _ in range(calls):
            jax.block_until_ready(call())
    wall = (time.perf_counter() - start) / calls
    paths = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        return {"error": f"no trace written under {folder}"}
    try:
        devices = _device_kernels(jax.profiler.ProfileData.from_file(paths[0]), calls)
    except Exception as error:  # noqa: BLE001 - a probe: report, don't lose the row
        return {"error": repr(error), "trace": paths[0]}
    return {"traced_wall_ms_per_call": wall * 1e3, "calls": calls, "devices": devices, "trace": paths[0]}


def _device_kernels(data, calls: int) -> dict:
    devices = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:") or plane.name.startswith("/device:CUSTOM"):
            continue
        intervals, kernels, lines = [], {}, {}
        small = [0, 0.0]  # kernels under 10 us: count, time
        for line in plane.lines:
            events = list(line.events)
            lines[line.name] = len(events)
            if not line.name.lower().startswith("stream"):
                continue
            for event in events:
                if event.name.lower().startswith("memcpy"):
                    continue
                intervals.append((event.start_ns, event.start_ns + event.duration_ns))
                stats = dict(event.stats)
                key = f"{event.name[:40]} | {str(stats.get('hlo_op', ''))[:40]}"
                total, number = kernels.get(key, (0.0, 0))
                kernels[key] = (total + event.duration_ns, number + 1)
                if event.duration_ns < 10_000:
                    small[0] += 1
                    small[1] += event.duration_ns
        if not intervals:
            sample = [(e.name[:60], sorted(dict(e.stats))[:8]) for line in plane.lines for e in list(line.events)[:2]]
            devices[plane.name] = {"lines": lines, "sample_events": sample[:6]}
            continue
        intervals.sort()
        busy, (low, high) = 0, intervals[0]
        for a, b in intervals[1:]:
            if a > high:
                busy, low, high = busy + high - low, a, b
            else:
                high = max(high, b)
        busy += high - low
        top = sorted(kernels.items(), key=lambda item: -item[1][0])
        collective = {k: v for k, v in kernels.items() if any(w in k.lower() for w in ("all-reduce", "all_reduce",
                                                                                        "nccl", "allreduce"))}
        devices[plane.name] = {
            "busy_ms_per_call": busy / calls / 1e6, "span_ms_per_call": (intervals[-1][1] - intervals[0][0]) / calls / 1e6,
            "kernels_per_call": len(intervals) / calls, "distinct_kernels": len(kernels), "lines": lines,
            "idle_ms_per_call": ((intervals[-1][1] - intervals[0][0]) - busy) / calls / 1e6,
            "kernels_under_10us_per_call": small[0] / calls, "under_10us_ms_per_call": small[1] / calls / 1e6,
            "most_launched_per_call": [(k, t / calls / 1e6, n // calls)
                                       for k, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:8]],
            "top_kernels_ms_per_call": [(k, t / calls / 1e6, n // calls) for k, (t, n) in top[:12]],
            "collectives_ms_per_call": {k: t / calls / 1e6 for k, (t, n) in collective.items()}}
    return devices


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def _in_processes(command, count: int, gpu_ids, cwd):
    """One device count as `count` processes joined by `jax.distributed` on this host, process i seeing GPU i
    (on a CPU: one host device each); the result of process 0, whose row the run reports."""
    with socket.socket() as probe:  # a free port for the coordinator
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runs = []
    for i in range(count):
        env = dict(CHILD_ENV)
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = gpu_ids[i]
        else:
            env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                        if not f.startswith("--xla_force_host_platform_device_count"))
        runs.append(subprocess.Popen([*command, "--process", str(i), "--port", str(port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd, env=env))
    outputs = [run.communicate() for run in runs]
    failed = next((k for k, run in enumerate(runs) if run.returncode != 0), 0)  # else process 0, which reports
    return subprocess.CompletedProcess(command, runs[failed].returncode, outputs[0][0], outputs[failed][1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--taxa", type=int, default=1000)
    parser.add_argument("--patterns", type=int, default=100_000)
    parser.add_argument("--devices", help="device counts, comma-separated (default: 1, 2, 4, ... up to all visible)")
    parser.add_argument("--mode", choices=("strong", "batch", "mc3", "bootstrap"), default="strong")
    parser.add_argument("--trees-per-device", type=int, default=4, help="batch mode: trees per device")
    parser.add_argument("--alignment", help="mc3 and bootstrap modes: the alignment")
    parser.add_argument("--model", default="GTR+G4", help="mc3 and bootstrap modes: the model")
    parser.add_argument("--per-device", type=int, default=2, help="mc3: runs per device; bootstrap: replicates")
    parser.add_argument("--generations", type=int, default=1000, help="mc3: generations per chain")
    parser.add_argument("--sample-every", type=int, default=100, help="mc3: generations between samples")
    parser.add_argument("--profile", action="store_true", help="strong/batch: trace one step per device count")
    parser.add_argument("--step-width", default="auto", help="strong, probes: auto (the library's rule: the "
                        "widest step the memory cap allows) or a forced width")
    parser.add_argument("--tag", help="results file scaling-MODE-TAG.json (e.g. 4gpu-h100); default "
                        "scaling-MODE-PLATFORM.json")
    parser.add_argument("--precision", choices=("float64", "float32"), default="float64")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--processes", action="store_true", help="mc3, bootstrap: n devices as n processes, one device "
                        "each")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one count, print its row
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)  # internal: this process's index
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)  # internal: the coordinator's port
    args = parser.parse_args()
    if args.mode in ("mc3", "bootstrap") and not args.alignment:
        parser.error(f"--mode {args.mode} needs --alignment")
    if args.processes and args.mode not in ("mc3", "bootstrap"):
        parser.error("--processes is for --mode mc3 and bootstrap")
    if args.one is not None:
        if args.process is not None:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU runs; a GPU's are NCCL's
            jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.one,
                                       process_id=args.process, initialization_timeout=120)
        row = one_count(args, args.one)
        if jax.process_index() == 0:
            print("ROW " + json.dumps(row), flush=True)
        return

    visible = len(jax.devices())
    counts = ([int(c) for c in args.devices.split(",")] if args.devices
              else [1 << k for k in range(visible.bit_length()) if 1 << k <= visible])
    if any(c < 1 or c > visible for c in counts):
        raise SystemExit(f"--devices {args.devices}: {visible} devices are visible")
    record = device_record("scaling")
    record.update(mode=args.mode, visible_devices=visible, process_count=jax.process_count())
    here = Path(__file__).resolve()
    gpu_ids = None
    if jax.devices()[0].platform == "gpu":  # each run sees only its devices: the first `count` of those visible
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpu_ids = listed.split(",") if listed else [str(i) for i in range(visible)]
    for count in counts:
        command = [sys.executable, str(here), *sys.argv[1:], "--one", str(count)]
        if args.processes and count > 1:
            run = _in_processes(command, count, gpu_ids, here.parent)
        else:
            env = dict(CHILD_ENV, CUDA_VISIBLE_DEVICES=",".join(gpu_ids[:count])) if gpu_ids else CHILD_ENV
            run = subprocess.run(command, capture_output=True, text=True, cwd=here.parent, env=env)
        rows = [line[4:] for line in run.stdout.splitlines() if line.startswith("ROW ")]
        if run.returncode != 0 or not rows:
            print(f"{count} devices failed:\n{run.stderr[-2000:]}", file=sys.stderr)
            record["rows"].append({"devices": count, "error": run.stderr.strip().splitlines()[-1:] or ["?"]})
            continue
        record["rows"].append(json.loads(rows[-1]))
    good = [r for r in record["rows"] if "median_s" in r]
    base = next((r["median_s"] for r in good if r["devices"] == 1), None)
    for row in good:
        if base is not None:
            n = row["devices"]
            row["efficiency"] = base / (n * row["median_s"]) if args.mode == "strong" else base / row["median_s"]
    if args.mode in ("mc3", "bootstrap"):
        unit = "runs of 4 chains" if args.mode == "mc3" else "replicates"
        print(f"# {args.mode} weak scaling, {args.alignment} {args.model}, {args.per_device} {unit} per device, "
              f"{record['device']} ({record['platform']}), {visible} visible; median ms = one whole run")
    else:
        trees = f", {args.trees_per_device} trees per device" if args.mode == "batch" else ""
        print(f"# {args.mode} scaling, {args.taxa} taxa x {args.patterns} patterns{trees}, value + gradient, "
              f"{args.precision}, {record['device']} ({record['platform']}), {visible} visible")
    print(f"{'devices':>7} {'mesh':>10} {'P/device':>9} {'compile s':>9} {'median ms':>10} {'all-reduce ms':>13} "
          f"{'XLA/device':>11} {'peak/device':>11} {'efficiency':>10}")
    for row in good:
        mesh = f"{row['mesh']['batch']}x{row['mesh']['patterns']}"
        efficiency = f"{row['efficiency']:.2f}" if "efficiency" in row else "-"
        print(f"{row['devices']:>7} {mesh:>10} {row['patterns_per_device']:>9} {row['compile_s']:>9.2f} "
              f"{row['median_s'] * 1e3:>10.3f} {row['allreduce_s'] * 1e3:>13.3f} "
              f"{_gib(row['xla_bytes_per_device']):>11} {_gib(row['peak_bytes_per_device']):>11} {efficiency:>10}")
    for row in good:
        if "schedule_per_device" in row:
            sched = row["schedule_per_device"]
            print(f"# {row['devices']} devices: width {sched['width']} ({sched['rule']}), {sched['slots']} slots, "
                  f"{sched['steps']} steps per device; forward alone {row['forward_s'] * 1e3:.3f} ms")
        for name, device in row.get("profile", {}).get("devices", {}).items():
            if "busy_ms_per_call" in device:
                print(f"# {row['devices']} devices, {name}: kernels busy {device['busy_ms_per_call']:.3f} ms, idle "
                      f"{device['idle_ms_per_call']:.3f} ms of the span {device['span_ms_per_call']:.3f} ms per call; "
                      f"{device['kernels_per_call']:.0f} kernels ({device['kernels_under_10us_per_call']:.0f} under "
                      f"10 us: {device['under_10us_ms_per_call']:.3f} ms); collectives "
                      f"{ {k: round(v, 3) for k, v in device['collectives_ms_per_call'].items()} }")
                if name.endswith(":0"):
                    for key, ms, number in device["top_kernels_ms_per_call"][:8]:
                        print(f"#     {ms:8.3f} ms {number:5d}x  {key}")
    if record["platform"] == "cpu":
        print("# CPU: forced host devices share the same cores; efficiency here is a smoke test, not a speed-up")
    record.update(step_width=args.step_width, argv=sys.argv[1:])
    if args.tag:
        path = Path(args.out) / f"scaling-{args.mode}-{args.tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
    else:
        save(record, args.out, f"scaling-{args.mode}")


if __name__ == "__main__":
    main()
