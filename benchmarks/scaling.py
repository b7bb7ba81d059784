"""Scaling over devices: likelihood + gradient with patterns (or trees) split over a device mesh (issue #20).

    python benchmarks/scaling.py [--taxa 1000] [--patterns 100000] [--devices 1,2] [--mode strong|batch]
                                 [--trees-per-device 4] [--repeats 10] [--precision float64] [--out DIR]
    python benchmarks/scaling.py --mode mc3|bootstrap --alignment ALN [--model GTR+G4] [--per-device 2]
                                 [--generations 1000] [--devices 1,2]

`mc3` and `bootstrap` (weak scaling of whole runs): `--per-device` MC3 runs
(4 chains, `--generations`) or bootstrap replicates per device on a real
alignment, the batch over the devices, each run made twice (compile, then
timed).

`strong` (the default): one tree of TAXA x PATTERNS random patterns (HKY+G4, a
random topology), `jax.value_and_grad` of `sharded_log_likelihood` with
respect to every branch length and model leaf, the patterns split over 1, 2,
... devices (mesh batch=1 x patterns=n). `batch` (weak scaling): n x K random
topologies over the same data, the trees split over the devices (mesh
batch=n x patterns=1), as MC3 chains or bootstrap replicates would be.

Each device count runs in a fresh process that sees only its first n devices'
work, so that a GPU's peak memory (`memory_stats()["peak_bytes_in_use"]`) is
that run's own. Columns: compile seconds (lower + compile, apart), the median
seconds of the compiled value-and-gradient, XLA's own per-device account of
the program (arguments + outputs + temporaries), the measured peak on a GPU,
the time of one all-reduce of the cotangents alone (what crosses devices in
a gradient: branch lengths and model leaves, plus a scalar forward), and the
efficiency t1 / (n tn) (strong) or t1 / tn (batch).

On a CPU, force host devices for a smoke test (they share the cores, so the
efficiency says nothing about speed there):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python benchmarks/scaling.py --taxa 16 --patterns 1001 --devices 1,2 --out /tmp/scaling
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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

    The run is made twice with the same shapes: the first compiles, the second is timed (`median_s` is its
    wall time, `compile_s` the first's surplus).
    """
    devices = jax.devices()[:count]
    alignment = jp.read_alignment(args.alignment)
    model = jp.parse_model(args.model)
    batch = args.per_device * count
    if args.mode == "mc3":
        mesh = jp.device_mesh(devices, batch=count, patterns=1)
        settings = jp.inference.MC3Settings(runs=batch, chains=4, generations=args.generations, sample_every=10,
                                            block=50)
        run = lambda: jp.inference.mc3(alignment, model, settings=settings, seed=args.seed, mesh=mesh)  # noqa: E731
    else:
        mesh = jp.device_mesh(devices, trees=batch, num_patterns=alignment.site_patterns().weights.shape[0])
        start = jp.bionj(jp.distances(alignment, saturated=5.0), alignment.taxa)
        fitted = jp.ml.fit(alignment, start, model)
        run = lambda: jp.ml.bootstrap(alignment, fitted, replicates=batch, seed=args.seed, mesh=mesh)  # noqa: E731
    times = []
    for _ in range(2):
        start = time.perf_counter()
        jax.block_until_ready(jax.tree_util.tree_leaves(run()))
        times.append(time.perf_counter() - start)
    return {"devices": count, "mesh": dict(mesh.shape), "alignment": Path(args.alignment).parent.name,
            "model": args.model, "batch": batch, "generations": args.generations if args.mode == "mc3" else None,
            "patterns_per_device": int(alignment.site_patterns().weights.shape[0]),
            "compile_s": times[0] - times[1], "median_s": times[1], "xla_bytes_per_device": None,
            "peak_bytes_per_device": _peak(devices), "allreduce_s": 0.0, "repeats": 1}


def _peak(devices):
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices if d.platform != "cpu"]
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

    if batch is None:
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
    return {"devices": count, "mesh": dict(mesh.shape), "taxa": args.taxa, "patterns": args.patterns,
            "trees": 1 if batch is None else len(batch), "precision": args.precision,
            "patterns_per_device": sharded.tip_codes.shape[1] // mesh.shape["patterns"],
            "compile_s": compile_s, "median_s": median, "xla_bytes_per_device": xla_bytes,
            "peak_bytes_per_device": _peak(devices),
            "allreduce_s": allreduce_seconds(mesh, leaves, args.repeats) if count > 1 else 0.0,
            "repeats": args.repeats}


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


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
    parser.add_argument("--precision", choices=("float64", "float32"), default="float64")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one count, print its row
    args = parser.parse_args()
    if args.mode in ("mc3", "bootstrap") and not args.alignment:
        parser.error(f"--mode {args.mode} needs --alignment")
    if args.one is not None:
        print("ROW " + json.dumps(one_count(args, args.one)), flush=True)
        return

    visible = len(jax.devices())
    counts = ([int(c) for c in args.devices.split(",")] if args.devices
              else [1 << k for k in range(visible.bit_length()) if 1 << k <= visible])
    if any(c < 1 or c > visible for c in counts):
        raise SystemExit(f"--devices {args.devices}: {visible} devices are visible")
    record = device_record("scaling")
    record.update(mode=args.mode, visible_devices=visible, process_count=jax.process_count())
    here = Path(__file__).resolve()
    for count in counts:
        command = [sys.executable, str(here), *sys.argv[1:], "--one", str(count)]
        run = subprocess.run(command, capture_output=True, text=True, cwd=here.parent, env=CHILD_ENV)
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
    if record["platform"] == "cpu":
        print("# CPU: forced host devices share the same cores; efficiency here is a smoke test, not a speed-up")
    save(record, args.out, f"scaling-{args.mode}")


if __name__ == "__main__":
    main()
