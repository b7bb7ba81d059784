"""Reference figures from MrBayes 3.2 (Metropolis-coupled MCMC) for jaxphylo's MC^3.

    python validation/mc3/mrbayes_reference.py [--parts ds1_stoprule carnivores_fixed ds1_fixed]

Every run uses 2 runs x 4 chains, temp=0.1, MrBayes's default moves and priors
(uniform topology, branch lengths Exponential(10)), samplefreq=100, printfreq=1000,
diagnfreq=1000, 25% relative burn-in, `set seed=S swapseed=S` (--seed, default 1), and one thread.
Likelihood engine (--likelihood): `beagle` (default) = BEAGLE CPU, double precision,
beaglethreads=no (BEAGLE picks its SSE kernel); `native` = MrBayes's own code, which in
the Debian build is the non-SSE single-precision calculator (about 3x slower).

  ds1_stoprule      DS1 (27 taxa), JC69, ngen=1,000,000 with stoprule=yes stopval=0.01:
                    generations until ASDSF < 0.01, wall time, generations/s; its split
                    frequencies (pooled over both runs after 25% burn-in) against the
                    golden posterior in /work/shared/data/DS1/topology_posterior_pooled.tsv.
  carnivores_fixed  carnivores (62 taxa), HKY+G4, fixed ngen, stoprule=no: generations/s, ASDSF.
  ds1_fixed         DS1, JC69, fixed ngen, stoprule=no: generations/s.

The alignments are converted to NEXUS in a temporary folder, where MrBayes also writes.
Results are merged into validation/mc3/results/mrbayes_reference.json; the consensus
trees (.con.tre) and MrBayes's screen logs are copied next to it. The stored results came from

    python validation/mc3/mrbayes_reference.py
    python validation/mc3/mrbayes_reference.py --likelihood native --parts carnivores_fixed ds1_fixed --ngen 5000 100000
    python validation/mc3/mrbayes_reference.py --seed 2 --parts ds1_stoprule   # and --seed 3
    python validation/mc3/mrbayes_reference.py --likelihood native --parts ds1_stoprule
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from golden import golden_topology_probabilities, newick_splits, split_probabilities

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DATA = next((p for p in (HERE.parents[2] / "shared" / "data", HERE.parents[1] / ".devdata") if p.exists()),
            Path("/work/shared/data"))
GOLDEN = DATA / "DS1" / "topology_posterior_pooled.tsv"

MODELS = {
    "JC69": "lset nst=1 rates=equal;\n  prset statefreqpr=fixed(equal);",
    "HKY+G4": "lset nst=2 rates=gamma ngammacat=4;",
}
LIKELIHOOD = {
    "native": "usebeagle=no",
    "beagle": "usebeagle=yes beagledevice=cpu beagleprecision=double beaglethreads=no",
}
PARTS = {  # name: (data set, model, ngen, stoprule)
    "ds1_stoprule": ("DS1", "JC69", 1_000_000, True),
    "carnivores_fixed": ("carnivores", "HKY+G4", 20_000, False),
    "ds1_fixed": ("DS1", "JC69", 100_000, False),
}
BURNIN = 0.25


def write_nexus(fasta: Path, path: Path) -> list[str]:
    """Write a DNA FASTA alignment as a NEXUS data block (spaces in names -> '_'); return the names."""
    names, seqs = [], []
    for line in fasta.read_text().splitlines():
        if line.startswith(">"):
            names.append(re.sub(r"\W", "_", line[1:].strip()))
            seqs.append([])
        elif line.strip():
            seqs[-1].append(line.strip())
    seqs = ["".join(s) for s in seqs]
    width = max(map(len, names)) + 2
    rows = "\n".join(f"  {n.ljust(width)}{s}" for n, s in zip(names, seqs))
    path.write_text(
        f"#NEXUS\nbegin data;\n  dimensions ntax={len(names)} nchar={len(seqs[0])};\n"
        f"  format datatype=dna missing=? gap=-;\n  matrix\n{rows}\n  ;\nend;\n")
    return names


def mrbayes_block(name: str, model: str, ngen: int, stoprule: bool, seed: int, likelihood: str) -> str:
    stop = "stoprule=yes stopval=0.01" if stoprule else "stoprule=no"
    return (
        "begin mrbayes;\n"
        f"  set autoclose=yes nowarn=yes quitonerror=yes seed={seed} swapseed={seed} {LIKELIHOOD[likelihood]};\n"
        "  execute data.nex;\n"
        f"  {MODELS[model]}\n"
        f"  mcmcp nruns=2 nchains=4 temp=0.1 filename={name};\n"
        f"  mcmc ngen={ngen} samplefreq=100 printfreq=1000 diagnfreq=1000 {stop} "
        "burninfrac=0.25 relburnin=yes;\n"
        "  quit;\nend;\n")


def last_diagnostics(mcmc_file: Path) -> tuple[int, float]:
    """Generation and ASDSF of the last row of a MrBayes .mcmc file."""
    lines = [l.split("\t") for l in mcmc_file.read_text().splitlines() if l and not l.startswith("[")]
    header, last = lines[0], lines[-1]
    return int(last[0]), float(last[header.index("AvgStdDev(s)")])


def sampled_topologies(tree_file: Path) -> list[frozenset]:
    """Split sets of the trees in a MrBayes .t file after dropping the first 25% of samples."""
    text = tree_file.read_text()
    block = re.search(r"translate(.*?);", text, re.S | re.I).group(1)
    translate = dict(pair.strip().split() for pair in block.split(",") if pair.strip())
    trees = re.findall(r"^\s*tree\s+\S+\s*=\s*(?:\[&[UR]\]\s*)?(.*;)", text, re.M | re.I)
    return [newick_splits(t, translate) for t in trees[int(len(trees) * BURNIN):]]


def run_part(part: str, seed: int, likelihood: str, ngen: int, workdir: Path, data_root: Path = DATA,
             results: Path = RESULTS, golden: bool = True, stoprule: bool | None = None) -> tuple[str, dict]:
    """Run one MrBayes analysis in `workdir`; return its name and its record for the JSON (screen log and
    consensus tree copied to `results`). `stoprule` overrides the part's."""
    data, model, _, own_rule = PARTS[part]
    stoprule = own_rule if stoprule is None else stoprule
    name = f"{part}_{likelihood}" + (f"_seed{seed}" if seed != 1 else "")
    folder = workdir / name
    folder.mkdir()
    taxa = write_nexus(data_root / data / "alignment.fasta", folder / "data.nex")
    block = mrbayes_block(name, model, ngen, stoprule, seed, likelihood)
    (folder / "run.nex").write_text("#NEXUS\n" + block)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run(["mb", "run.nex"], cwd=folder, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    (results / f"{name}.log").write_text(log)
    if proc.returncode != 0 or "Analysis completed" not in log:
        raise RuntimeError(f"MrBayes failed in {folder}; see {results / (name + '.log')}")
    gens, asdsf = last_diagnostics(folder / f"{name}.mcmc")
    (folder / "sumt.nex").write_text(
        f"#NEXUS\nbegin mrbayes;\n  set autoclose=yes nowarn=yes;\n  execute data.nex;\n"
        f"  sumt filename={name} nruns=2 relburnin=yes burninfrac=0.25;\n  quit;\nend;\n")
    subprocess.run(["mb", "sumt.nex"], cwd=folder, stdin=subprocess.DEVNULL, capture_output=True)
    shutil.copy(folder / f"{name}.con.tre", results / f"{name}.con.tre")
    result = {
        "data": str(data_root / data / "alignment.fasta"), "ntax": len(taxa), "model": model,
        "likelihood": likelihood, "command": f"mb run.nex  # run.nex:\n{block}",
        "stoprule": stoprule, "ngen_requested": ngen, "generations": gens,
        "stopped_by_rule": "convergence diagnostic hit stop value" in log,
        "final_asdsf": asdsf, "wall_seconds": round(wall, 3),
        "generations_per_second": round(gens / wall, 2),
        "seconds_per_generation": wall / gens,
        "mrbayes_cpu_seconds": float(re.search(r"used ([\d.]+) seconds of CPU", log).group(1)),
        "mrbayes_version": re.search(r"MrBayes\s+(\S+)", log).group(1),
        "consensus_tree": f"results/{name}.con.tre",
    }
    if data == "DS1" and golden:
        result["golden_comparison"] = compare_to_golden(folder, name)
    return name, result


def compare_to_golden(folder: Path, name: str) -> dict:
    """MrBayes split and topology frequencies (both runs pooled) against the golden DS1 posterior."""
    samples = [t for run in (1, 2) for t in sampled_topologies(folder / f"{name}.run{run}.t")]
    mb_topologies = {t: c / len(samples) for t, c in Counter(samples).items()}
    golden_topologies = golden_topology_probabilities(GOLDEN)
    mb, golden = split_probabilities(mb_topologies), split_probabilities(golden_topologies)
    rows = sorted(({"split": sorted(s), "golden": round(golden.get(s, 0.0), 6),
                    "mrbayes": round(mb.get(s, 0.0), 6)} for s in set(mb) | set(golden)),
                  key=lambda r: -max(r["golden"], r["mrbayes"]))
    major = [r for r in rows if max(r["golden"], r["mrbayes"]) >= 0.05]
    mb_top = max(mb_topologies, key=mb_topologies.get)
    golden_top = max(golden_topologies, key=golden_topologies.get)
    return {
        "samples_after_burnin": len(samples),
        "max_abs_split_difference": max(abs(r["golden"] - r["mrbayes"]) for r in major),
        "n_splits_compared": len(major),
        "top_topology_equal": mb_top == golden_top,
        "mrbayes_top_topology_freq": mb_topologies[mb_top],
        "golden_top_topology_prob": golden_topologies[golden_top],
        "mrbayes_freq_of_golden_top": mb_topologies.get(golden_top, 0.0),
        "splits": [r for r in rows if max(r["golden"], r["mrbayes"]) >= 0.01],
        "splits_note": "splits as taxa on the side without the alphabetically first taxon; "
                       "table lists splits with golden or MrBayes frequency >= 0.01; "
                       "max_abs_split_difference over those >= 0.05",
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def print_table(results: dict) -> None:
    print(f"\n{'part':<26}{'gens':>10}{'wall s':>10}{'gens/s':>10}{'ASDSF':>10}  stop")
    for part, r in results.items():
        if part.startswith(tuple(PARTS)):
            print(f"{part:<26}{r['generations']:>10}{r['wall_seconds']:>10.1f}"
                  f"{r['generations_per_second']:>10.1f}{r['final_asdsf']:>10.4f}  {r['stopped_by_rule']}")
    for part, r in results.items():
        g = r.get("golden_comparison") if isinstance(r, dict) else None
        if g and r["stoprule"]:
            print(f"\n{part} vs golden: max |split diff| (freq >= 0.05) = {g['max_abs_split_difference']:.4f}"
                  f" over {g['n_splits_compared']} splits; top topology equal: {g['top_topology_equal']}"
                  f" (MrBayes {g['mrbayes_top_topology_freq']:.3f}, golden {g['golden_top_topology_prob']:.3f})")
            print(f"  {'golden':>8}{'MrBayes':>9}{'diff':>8}  size  split")
            for s in g["splits"]:
                if max(s["golden"], s["mrbayes"]) >= 0.05 and min(s["golden"], s["mrbayes"]) < 0.99:
                    print(f"  {s['golden']:>8.4f}{s['mrbayes']:>9.4f}{s['mrbayes'] - s['golden']:>8.4f}"
                          f"  {len(s['split']):>4}  {','.join(s['split'][:3])}{',...' * (len(s['split']) > 3)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--ngen", type=int, nargs="+", default=None,
                        help="ngen for each of --parts (default: 1000000, 20000, 100000)")
    parser.add_argument("--likelihood", choices=list(LIKELIHOOD), default="beagle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "mrbayes_reference.json")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(machine={"cpu": cpu_model(), "cores": os.cpu_count(), "mb": shutil.which("mb")})
    ngens = args.ngen or [PARTS[p][2] for p in args.parts]
    with tempfile.TemporaryDirectory() as tmp:
        for part, ngen in zip(args.parts, ngens):
            print(f"running {part} ({args.likelihood}, seed {args.seed}, ngen={ngen}) ...", flush=True)
            name, results[name] = run_part(part, args.seed, args.likelihood, ngen, Path(tmp))
            args.out.write_text(json.dumps(results, indent=1))
    print_table(results)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
