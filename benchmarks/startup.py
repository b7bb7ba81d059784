"""The fixed costs of every command, in a fresh process: import, tracing, lowering, XLA compilation, cache loads
and the rest (running), with an empty compilation cache and with a warm one; IQ-TREE 2 / MrBayes beside.

Each command runs as `python benchmarks/startup.py --child OUT.json -- jaxphylo ARGS`: a fresh interpreter that
times its imports, listens to JAX's monitoring events while the command runs, and writes what it saw:

- tracing: the union of '/jax/core/compile/jaxpr_trace_duration' spans (a jit traced to a jaxpr; nested traces
  counted once), lowering: '/jax/core/compile/jaxpr_to_mlir_module_duration' (jaxpr to StableHLO),
- compilation: '/jax/core/compile/backend_compile_duration' (XLA, or a persistent-cache load inside it) less the
  cache loads: '/jax/compilation_cache/cache_retrieval_time_sec',
- counts of each, and of persistent-cache hits and misses,
- running: the wall time less all of the above and the imports (Python work, I/O, the computation itself),
- first sample (`mcmc`, `sample --topology free`): seconds from the process's start until its first sample
  row is in the run's log file, read by the parent as the child writes.

The parent runs each command twice: first with an empty cache folder (JAXPHYLO_CACHE_DIR, a fresh temporary
folder; before the cache existed, i.e. with an older checkout, this is simply no cache), then again with the
folder the first run filled. `--no-cache` measures both runs with the cache off (what every run cost before the
cache). Prints a table and writes JSON to benchmarks/results/startup-<platform>.json.

    python benchmarks/startup.py                      # every command, DS1 (27 x 1,949), GTR+G4, short settings
    python benchmarks/startup.py --commands loglik,ml --data DS2
    python benchmarks/startup.py --no-cache --out benchmarks/results/startup-nocache

On a GPU machine the same line runs on the GPU (JAX's default device); the file is then startup-gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

EVENTS = {"trace": "/jax/core/compile/jaxpr_trace_duration",
          "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "compile": "/jax/core/compile/backend_compile_duration"}
CACHE_LOAD = "/jax/compilation_cache/cache_retrieval_time_sec"
CACHE_HITS = "/jax/compilation_cache/cache_hits"
CACHE_MISSES = "/jax/compilation_cache/cache_misses"


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _minus(spans: list[tuple[float, float]], cut: list[tuple[float, float]]) -> float:
    """Seconds of `spans` (disjoint) outside `cut` (disjoint)."""
    total = 0.0
    for start, end in spans:
        inside = sum(max(0.0, min(end, b) - max(start, a)) for a, b in cut)
        total += end - start - inside
    return total


def _slowest(programs: list[tuple[str, float, float]], loads: list[tuple[float, float]], keep: int = 10):
    """The `keep` programs with the longest backend compilation (or cache load, which happens inside it):
    [name, seconds, of which loading]."""
    rows = []
    for name, begin, end in programs:
        loaded = sum(seconds for when, seconds in loads if begin <= when <= end + 1e-3)
        rows.append([name, round(end - begin, 4), round(loaded, 4)])
    return sorted(rows, key=lambda row: -row[1])[:keep]


def child(out: Path, argv: list[str]) -> None:
    """Run one command in this process and write the breakdown to `out`."""
    start = time.time()
    import jax
    from jax import monitoring

    spans = {name: [] for name in EVENTS}
    counts = {name: 0 for name in EVENTS} | {"cache_hits": 0, "cache_misses": 0}
    cache_load = [0.0]
    loads: list[tuple[float, float]] = []  # (when, seconds) of each cache load
    programs: list[tuple[str, float, float]] = []  # (name, begin, end) of each backend compilation
    building: dict[str, float] = {}  # name -> seconds of tracing and lowering (nested traces count in each)
    by_event = {event: name for name, event in EVENTS.items()}

    def on_span(event, begin, end, **kwargs):
        if event in by_event:
            spans[by_event[event]].append((begin, end))
            counts[by_event[event]] += 1
            if event == EVENTS["compile"]:
                programs.append((kwargs.get("fun_name", "?"), begin, end))
            else:
                name = kwargs.get("fun_name", "?")
                building[name] = building.get(name, 0.0) + end - begin

    def on_duration(event, seconds, **kwargs):
        if event == CACHE_LOAD:
            cache_load[0] += seconds
            loads.append((time.time(), seconds))

    def on_event(event, **kwargs):
        if event == CACHE_HITS:
            counts["cache_hits"] += 1
        elif event == CACHE_MISSES:
            counts["cache_misses"] += 1

    monitoring.register_event_time_span_listener(on_span)
    monitoring.register_event_duration_secs_listener(on_duration)
    monitoring.register_event_listener(on_event)
    from jaxphylo.cli import main

    imported = time.time()
    code = main(argv)
    end = time.time()
    compile_spans = _union(spans["compile"])
    lower_spans = _union(spans["lower"])
    trace_spans = _union(spans["trace"])
    compile_all = sum(b - a for a, b in compile_spans)
    lower = _minus(lower_spans, compile_spans)
    trace = _minus(trace_spans, _union(compile_spans + lower_spans))
    record = {"exit": code, "import_s": imported - start, "trace_s": trace, "lower_s": lower,
              "compile_s": max(0.0, compile_all - cache_load[0]), "cache_load_s": cache_load[0],
              "inside_s": end - start, "counts": counts,
              "cache_dir": jax.config.jax_compilation_cache_dir,
              "programs": _slowest(programs, loads),
              "building": sorted(([name, round(s, 4)] for name, s in building.items()), key=lambda r: -r[1])[:10]}
    record["running_s"] = record["inside_s"] - sum(record[k] for k in ("import_s", "trace_s", "lower_s", "compile_s",
                                                                          "cache_load_s"))
    out.write_text(json.dumps(record))


FIRST_SAMPLE = {"mcmc": "mcmc/run1.log", "sample --topology free": "free/chain1.log"}  # files a run appends to


def commands(data: Path, work: Path, quick: bool) -> dict[str, tuple[list[str], list[str] | None]]:
    """name -> (jaxphylo arguments, the reference program's command or None). `quickstart` is the README's
    first command after its `pip install`."""
    alignment, tree = str(data / "alignment.fasta"), str(data / "tree.nwk")
    # --quick: shorter searches (IQ-TREE's -nstop alike), the same programs: the fixed costs are unchanged.
    patience = ["3"] if quick else ["100"]
    iq = ["iqtree2", "-s", alignment, "-m", "GTR+G4", "-nt", "1", "-seed", "1", "-redo", "-quiet", "-nstop", *patience]
    ml = ["ml", alignment, "-m", "GTR+G4", "--seed", "1", "--patience", *patience]
    replicates = "4" if quick else "10"
    mb = work / "mb.nex"
    parts = str(work / "parts.txt")  # written by `partition_file`: the alignment in three contiguous thirds
    return {
        "loglik": (["loglik", alignment, tree, "-m", "GTR+G4"],
                   ["iqtree2", "-s", alignment, "-te", tree, "-blfix", "-m", "GTR+G4", "-nt", "1", "-redo", "-quiet",
                    "-pre", str(work / "iq-loglik")]),
        "ml": (ml + ["--out", str(work / "ml")], iq + ["-pre", str(work / "iq-ml")]),
        "ml -b": (ml + ["-b", replicates, "--out", str(work / "mlb")],
                  iq + ["-b", replicates, "-pre", str(work / "iq-mlb")]),
        "ml -B": (ml + ["-B", "1000", "--out", str(work / "mlB")], iq + ["-B", "1000", "-pre", str(work / "iq-mlB")]),
        "ml -p": (ml + ["-p", parts, "--out", str(work / "mlp")], iq + ["-p", parts, "-pre", str(work / "iq-mlp")]),
        "ml --alrt": (ml + ["--alrt", "1000", "--out", str(work / "mla")],
                      iq + ["-alrt", "1000", "-pre", str(work / "iq-mla")]),
        "models": (["models", alignment, "--mset", "HKY,GTR", "--mrate", "E,G", "--quiet", "--out",
                    str(work / "models")],
                   ["iqtree2", "-s", alignment, "-m", "MF", "-mset", "HKY,GTR", "-mrate", "E,G", "-nt", "1", "-redo",
                    "-quiet", "-pre", str(work / "iq-models")]),
        "sample": (["sample", alignment, tree, "-m", "GTR+G4", "--chains", "1", "--warmup", "50", "--samples", "50",
                    "--no-progress", "--out", str(work / "sample")], None),
        "mcmc": (["mcmc", alignment, "-m", "GTR+G4", "--runs", "2", "--chains", "2", "--generations", "2000",
                  "--sample-every", "100", "--out", str(work / "mcmc")], ["mb", str(mb)]),
        "quickstart": (["sample", "--example", "--chains", "2", "--warmup", "300", "--samples", "400", "--out",
                        str(work / "quickstart")], None),
        "sample --topology free": (["sample", alignment, "-m", "HKY+G4", "--clock", "strict", "--topology",
                                    "free", "--samples", "20", "--sample-every", "20", "--warmup", "0",
                                    "--no-progress", "--out", str(work / "free")], None),
    }


def mrbayes_script(data: Path, work: Path, generations: int) -> None:
    """A NEXUS copy of the alignment with a MrBayes block: GTR+G4, 2 runs x 2 chains, `generations`."""
    from Bio import SeqIO

    records = list(SeqIO.parse(str(data / "alignment.fasta"), "fasta"))
    width = len(records[0].seq)
    rows = "\n".join(f"  {r.id} {str(r.seq).upper()}" for r in records)  # MrBayes reads no quoted names
    (work / "mb.nex").write_text(
        f"#NEXUS\nbegin data;\n dimensions ntax={len(records)} nchar={width};\n format datatype=dna gap=- missing=?;\n"
        f" matrix\n{rows}\n ;\nend;\nbegin mrbayes;\n set autoclose=yes nowarn=yes seed=1 swapseed=1;\n"
        f" lset nst=6 rates=gamma ngammacat=4;\n mcmc ngen={generations} nruns=2 nchains=2 samplefreq=100"
        f" printfreq=1000 diagnfreq=1000 file={work / 'mb'};\nend;\n")


def partition_file(data: Path, work: Path) -> None:
    """`parts.txt`: the alignment's sites in three contiguous thirds, RAxML-style (every part GTR+G4 from -m,
    linked lengths times a rate per part: `-p`, for jaxphylo and IQ-TREE alike)."""
    from Bio import SeqIO

    width = len(next(SeqIO.parse(str(data / "alignment.fasta"), "fasta")).seq)
    cuts = [0, width // 3, 2 * width // 3, width]
    (work / "parts.txt").write_text("".join(f"DNA, part{k + 1} = {cuts[k] + 1}-{cuts[k + 1]}\n" for k in range(3)))


def run_child(argv: list[str], env: dict, out: Path, first: Path | None = None) -> dict:
    """One command in a fresh interpreter; with `first` (a sample file the command appends to), also the
    seconds until its first sample row is there (what a user waits before the run shows it has started)."""
    begin = time.time()
    child = subprocess.Popen([sys.executable, __file__, "--child", str(out), "--", *argv], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_sample = None
    if first is not None:
        while child.poll() is None and first_sample is None:
            if _rows(first) >= 2:  # the header, then a sample
                first_sample = time.time() - begin
            time.sleep(0.02)
    _, stderr = child.communicate()
    done = subprocess.CompletedProcess(child.args, child.returncode, "", stderr)
    wall = time.time() - begin
    if first is not None and first_sample is None and _rows(first) >= 2:
        first_sample = wall  # written in the command's last moments
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"jaxphylo {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    record = json.loads(out.read_text())
    record["wall_s"] = wall
    record["interpreter_s"] = wall - record["inside_s"]
    record["first_sample_s"] = first_sample
    return record


def _rows(path: Path) -> int:
    try:
        return path.read_text().count("\n")
    except (FileNotFoundError, UnicodeDecodeError):
        return 0


def reference_time(command: list[str] | None, cwd: Path) -> float | None:
    if command is None or shutil.which(command[0]) is None:
        return None
    begin = time.time()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:  # the reference is beside the point: say so, keep the row
        print(f"{command[0]} failed: {(done.stdout + done.stderr)[-500:]}", file=sys.stderr)
        return None
    return time.time() - begin


COLUMNS = ("wall_s", "interpreter_s", "import_s", "trace_s", "lower_s", "compile_s", "cache_load_s", "running_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--commands", default="all", help="comma-separated names from the table (default all)")
    parser.add_argument("--data", default="DS1", help="a folder with alignment.fasta and tree.nwk, or its name in ../shared/data")
    parser.add_argument("--no-cache", action="store_true", help="both runs with JAXPHYLO_CACHE_DIR=off")
    parser.add_argument("--quick", action="store_true",
                        help="searches stop after 3 unsuccessful perturbations (default: 100, as IQ-TREE), 4 bootstrap "
                             "replicates (default 10)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup"))
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child), args.rest)

    os.environ.setdefault("JAXPHYLO_CACHE_DIR", "off")  # this process compiles nothing: it leaves no folder behind
    from _common import SHARED_DATA

    data = Path(args.data) if Path(args.data).is_dir() else SHARED_DATA / args.data
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    table = []
    with tempfile.TemporaryDirectory(prefix="jaxphylo-startup-") as tmp:
        tmp = Path(tmp)
        mrbayes_script(data, tmp, 2000)
        partition_file(data, tmp)
        chosen = commands(data, tmp, args.quick)
        names = list(chosen) if args.commands == "all" else args.commands.split(",")
        for name in names:
            argv, reference = chosen[name]
            cache = tmp / f"cache-{len(table)}"
            env["JAXPHYLO_CACHE_DIR"] = "off" if args.no_cache else str(cache)
            row = {"command": name, "argv": argv}
            for state in ("empty", "warm"):
                shutil.rmtree(tmp / "outputs", ignore_errors=True)
                for stale in tmp.glob("ml*"):  # a second search with the same prefix would refuse without --redo
                    shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
                for folder in ("sample", "mcmc", "free", "quickstart"):
                    shutil.rmtree(tmp / folder, ignore_errors=True)
                first = tmp / FIRST_SAMPLE[name] if name in FIRST_SAMPLE else None
                row[state] = run_child(argv, env, tmp / f"record-{len(table)}-{state}.json", first)
            if cache.is_dir():  # what the warm run read: the largest entries, in MB
                sizes = sorted((f.stat().st_size for f in cache.rglob("*") if f.is_file()), reverse=True)
                row["cache_mb"] = {"entries": len(sizes), "total": round(sum(sizes) / 2**20, 2),
                                   "largest": [round(size / 2**20, 2) for size in sizes[:8]]}
            row["reference"] = reference and reference[0]
            row["reference_s"] = reference_time(reference, tmp)
            table.append(row)
            print_row(row)
            print("  slowest to trace and lower, warm (s):",
                  ", ".join(f"{n} {t:.2f}" for n, t in row["warm"]["building"][:6]))
            print("  slowest programs, warm (name, s, of it loading):",
                  ", ".join(f"{n} {t:.2f}/{lo:.2f}" for n, t, lo in row["warm"]["programs"][:6]),
                  "| cache:", row.get("cache_mb"), flush=True)
            path = write(args, table)  # after every command: a long run stopped early keeps what it measured
    print(f"wrote {path}")


def write(args, table: list[dict]) -> Path:
    import jax

    device = jax.devices()[0]
    record = {"benchmark": "startup", "device": device.device_kind, "platform": device.platform,
              "jax": jax.__version__, "python": platform.python_version(), "data": args.data,
              "cache": "off" if args.no_cache else "on", "quick": args.quick, "host": platform.node(),
              "cpus": os.cpu_count(), "load_average": os.getloadavg(), "rows": table}
    path = Path(f"{args.out}-{device.platform}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return path


def print_row(row: dict) -> None:
    if not hasattr(print_row, "header"):
        print_row.header = True
        print(f"{'command':24s} {'cache':5s} " + " ".join(f"{c[:-2]:>9s}" for c in COLUMNS)
              + f" {'compiles':>8s} {'hits':>5s} {'reference':>10s} {'ratio':>6s} {'first sample':>12s}")
    for state in ("empty", "warm"):
        r = row[state]
        ref = row["reference_s"]
        print(f"{row['command']:24s} {state:5s} " + " ".join(f"{r[c]:9.2f}" for c in COLUMNS)
              + f" {r['counts']['compile']:8d} {r['counts']['cache_hits']:5d}"
              + (f" {row['reference']:>4s} {ref:5.2f} {r['wall_s'] / ref:6.1f}" if ref else f" {'-':>10s} {'-':>6s}")
              + (f" {r['first_sample_s']:12.2f}" if r.get("first_sample_s") is not None else f" {'-':>12s}"),
              flush=True)


if __name__ == "__main__":
    main()
