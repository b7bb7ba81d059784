"""`jaxphylo sample --dry-run` against what the run then uses, and a request too large to start.

Simulates TAXA x SITES under HKY+G4 (random tree, short branches so nearly
every column is its own pattern), then, as a user would, runs

    jaxphylo sample ALN TREE --chains 1 --dry-run          -> the estimate
    jaxphylo sample ALN TREE --chains 1 --warmup W ...     -> "peak memory while sampling"
    jaxphylo sample ALN TREE --chains C --dry-run          -> must stop: does not fit

and prints and saves the figures side by side (GiB, ratio estimate/measured).
On a GPU the measured figure is the allocator's peak (`peak_bytes_in_use`); on
a CPU the process's peak resident memory while sampling.

    python benchmarks/dry_run_memory.py --taxa 1000 --sites 112000 --data .devdata/sim1000

`--data DIR` keeps the simulated files there (and reuses them), so that the
steps (`--steps dry,run,big`) can be spread over several calls.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = dict(os.environ)  # the runs get JAX's defaults: on a GPU, a pool of 75% of its memory allocated at start
os.environ["JAX_PLATFORMS"] = "cpu"  # this process only simulates: it must not take the GPU's pool itself

import jaxphylo as jp  # noqa: E402
from _common import save  # noqa: E402


def gib(text: str, pattern: str) -> float | None:
    match = re.search(pattern + r"\s*([0-9.]+) (GiB|MiB)", text)
    if match is None:
        return None
    return float(match.group(1)) * (1 if match.group(2) == "GiB" else 1 / 1024)


LOGS: list[tuple[str, str]] = []


def cli(*args: str, timeout: float = 400) -> tuple[int, str, float]:
    began = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True,
                                timeout=timeout, env=ENV)
        code, stderr = result.returncode, result.stderr
    except subprocess.TimeoutExpired as err:
        code, stderr = 124, (err.stderr or b"").decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
    LOGS.append((" ".join(args), stderr))
    return code, stderr, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--taxa", type=int, default=1000)
    parser.add_argument("--sites", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--too-many-chains", type=int, default=8)
    parser.add_argument("--precision", choices=("float64", "float32"), default="float64")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--data", help="folder for the simulated alignment and tree (reused when present)")
    parser.add_argument("--steps", default="dry,run,big", help="which of dry (estimate), run, big (too large) to run")
    args = parser.parse_args()
    record = {"benchmark": "dry_run_memory", "platform": "gpu" if "GPU" in os.popen("nvidia-smi -L 2>/dev/null").read()
              else "cpu", "device": os.popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null").read().strip()
              or "cpu", "rows": []}
    work = Path(tempfile.mkdtemp())
    data = Path(args.data) if args.data else work
    if not (data / "aln.fasta").exists():
        data.mkdir(parents=True, exist_ok=True)
        tree = jp.random_topology_tree([f"t{i}" for i in range(args.taxa)], seed=1, mean_branch_length=0.02)
        alignment = jp.simulate(tree, jp.parse_model("HKY{3}+G4{0.5}"), args.sites, seed=2)
        (data / "aln.fasta").write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
        jp.write_tree(tree, data / "tree.nwk")
    base = [str(data / "aln.fasta"), str(data / "tree.nwk"), "-m", "HKY+G4", "--no-progress",
            "--precision", args.precision]
    steps = set(args.steps.split(","))
    skipped = (None, "", None)

    code, dry, dry_seconds = cli("sample", *base, "--chains", "1", "--dry-run", "--out", str(work / "unused")) \
        if "dry" in steps else skipped
    print(dry)
    estimate = gib(dry or "", r"\(outside XLA\) =")
    code_run, run, run_seconds = cli("sample", *base, "--chains", "1", "--warmup", str(args.warmup), "--samples", "1",
                                     "--block", "1", "--out", str(work / "run")) if "run" in steps else skipped
    print(run[-3000:])
    measured = gib(run, r"peak memory while sampling:") or gib(run, r"peak memory so far:")
    code_big, big, big_seconds = cli("sample", *base, "--chains", str(args.too_many_chains), "--out",
                                     str(work / "big")) if "big" in steps else skipped
    print(big)
    record["rows"].append({
        "taxa": args.taxa, "sites": args.sites, "precision": args.precision,
        "patterns": int(m.group(1)) if (m := re.search(r"(\d+) patterns", dry + big)) else None,
        "dry_run_estimate_gib": estimate, "dry_run_seconds": dry_seconds, "dry_run_exit": code,
        "run_peak_gib": measured, "run_seconds": run_seconds, "run_exit": code_run,
        "ratio_estimate_over_run": None if not (estimate and measured) else estimate / measured,
        "too_large_chains": args.too_many_chains, "too_large_exit": code_big, "too_large_seconds": big_seconds,
        "too_large_message": big.strip().splitlines()[-1] if big.strip() else "",
        "too_large_run_directory_created": (work / "big").exists(),
        "dry_run_report": dry.strip().splitlines(),
    })
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"dry_run_memory-{record['platform']}-{args.precision}-{args.steps.replace(',', '-')}.log").write_text(
        "\n\n".join(f"$ jaxphylo {command}\n{text}" for command, text in LOGS))
    row = record["rows"][-1]
    print(f"\n{'taxa':>6} {'patterns':>9} {'dry-run GiB':>12} {'run peak GiB':>13} {'ratio':>6}  too large: exit")
    ratio = row["ratio_estimate_over_run"]
    print(f"{args.taxa:>6} {row['patterns'] or 0:>9} {estimate or float('nan'):>12.2f} {measured or float('nan'):>13.2f} "
          f"{ratio or float('nan'):>6.2f}  {code_big} in {big_seconds or 0:.0f} s")
    save(record, args.out, f"dry_run_memory-{args.precision}-{args.steps.replace(',', '-')}")


if __name__ == "__main__":
    main()
