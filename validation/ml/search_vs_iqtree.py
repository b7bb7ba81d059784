"""Our default ML search next to IQ-TREE 2's full search, and `--fast` next to FastTree 2, same machine, same run.

    python validation/ml/search_vs_iqtree.py --sets DS1,DS2,DS3,carnivores,primates_mtDNA,rsv2
    python validation/ml/search_vs_iqtree.py --sets DS1 --fast
    python validation/ml/search_vs_iqtree.py --sets dengue352_hmc_clock,sim200

On a GPU machine without IQ-TREE, ours alone, then the references here (IQ-TREE's runs kept in `--workdir`
and reused, so a long one can run beforehand with `--iqtree-only`):

    python validation/ml/search_vs_iqtree.py --sets dengue352_hmc_clock --ours-only ours.json \
        --checkpoints ck --max-seconds 540     # again with the same arguments: goes on from ck/
    python validation/ml/search_vs_iqtree.py --sets rsv2 --ours-only ours.json --repeat   # + warm_seconds
    python validation/ml/search_vs_iqtree.py --references-for ours.json --workdir iqwork

`sim200` is simulated here (`simulated_set`: 200 taxa, 2,000 sites, GTR+G4,
fixed seeds) into `validation/ml/simulated/` (git-ignored; the same bytes on
every machine); its rows also give the true tree's log L after fitting and
our RF distance to the true tree.

For each set (GTR+G4, one fixed seed for every set, no per-set tuning):

- ours: `jaxphylo.ml.search(alignment, "GTR+G4", seed=SEED)` with the default
  `SearchSettings` (IQ-TREE's regime: 100 starts, 20 climbed, candidate set
  of 5, 100 unsuccessful perturbed trees; SPR radius 5, 10, ... while a widened radius gains), in this
  process; its wall time includes compilation (the fixed-cost issue removes
  that), which is reported apart as `first_round_seconds` (the start stage,
  almost all compilation on a small set).
- IQ-TREE: `iqtree2 -s ALN -m GTR+G4 -nt 1 -seed SEED`.
- the check that our log L is IQ-TREE-comparable: `iqtree2 -te OURS -m
  MODEL{fitted} -blfix` on our tree and fitted model must print our log L
  (to 0.01: IQ-TREE prints 4 decimals and our final fit stops at 1e-4).
- with `--fast`: our `SearchSettings.fast()` and `fasttree -gtr -gamma -nt`,
  FastTree's tree then scored by IQ-TREE under GTR+G4 (`-te`, lengths and
  model fitted), since FastTree's own log L is under its CAT approximation.

Prints log L differences (ours − reference), RF distances to the reference
tree, both wall times; writes `search_vs_iqtree.json` next to this file
(merged by set). Timings on a shared machine are disturbed by other jobs: the
JSON keeps the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import jaxphylo as jp
from jaxphylo import ml
from jaxphylo.runtime import Interrupted, StopRequests

HERE = Path(__file__).resolve().parent
SIMULATED = HERE / "simulated"
TRUE_MODEL = "GTR{1.2,3.5,0.8,1.1,4.2,1}+F{0.3,0.2,0.22,0.28}+G4{0.6}"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
OUT = HERE / "search_vs_iqtree.json"
MODEL = "GTR+G4"
SEED = 1
NUM = r"(-?[\d.]+(?:[eE][-+]?\d+)?)"


def iqtree(args: list[str], prefix: Path, timeout: float = 3 * 3600) -> dict:
    """One IQ-TREE run; its row is kept in `prefix.row.json`, and a later call with the same command (a
    persistent `--workdir`) reads it instead of running again (IQ-TREE's search on a large set takes hours)."""
    command = ["iqtree2", *args, "-pre", str(prefix), "-redo", "-quiet", "-keep-ident"]
    kept = Path(f"{prefix}.row.json")
    if kept.exists() and (row := json.loads(kept.read_text()))["argv"] == command:
        return {**row, "reused": True}
    load = os.getloadavg()[0]
    began = time.perf_counter()
    subprocess.run(command, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - began
    report = Path(f"{prefix}.iqtree").read_text()
    row = {"command": " ".join(command).replace(str(prefix.parent), "<tmp>"), "seconds": round(seconds, 2),
           "load_before": round(load, 2),
           "log_likelihood": float(re.search(r"Log-likelihood of the tree: " + NUM, report).group(1)),
           "tree": Path(f"{prefix}.treefile").read_text().strip()}
    kept.write_text(json.dumps({**row, "argv": command}) + "\n")
    return row


def with_alignment_names(tree: jp.Tree, alignment) -> jp.Tree:
    """IQ-TREE's and FastTree's trees use '_' for spaces in names: back to the alignment's names."""
    renamed = {name.replace(" ", "_"): name for name in alignment.taxa}
    return jp.Tree(tree.branch_lengths, jp.Topology(tree.topology.parent,
                                                    tuple(renamed.get(t, t) for t in tree.taxa), False))


def write_newick(tree: jp.Tree, path: Path) -> Path:
    """Our tree with IQ-TREE's names and lengths at full precision."""
    text = jp.io.to_dendropy(tree).as_string(schema="newick", suppress_rooting=True, real_value_format_specifier=".17g")
    path.write_text(text.replace("'", "").replace(" ", "_"))
    return path


def iqtree_model(model_string: str) -> str:
    """Our fitted model string as IQ-TREE reads it (every value in braces: nothing left to fit)."""
    return model_string.replace("HKY85", "HKY")


def simulated_set(name: str) -> Path:
    """`sim<N>`: N taxa on a random tree (mean branch length 0.03), 2,000 sites under `TRUE_MODEL`, written once
    to `SIMULATED/name` with its true tree."""
    folder = SIMULATED / name
    if not (folder / "alignment.fasta").exists():
        taxa = [f"s{k:04d}" for k in range(int(name[3:]))]
        truth = jp.random_topology_tree(taxa, seed=200, mean_branch_length=0.03)
        alignment = jp.simulate(truth, jp.parse_model(TRUE_MODEL), 2000, seed=201)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "alignment.fasta").write_text("".join(f">{t}\n{q}\n" for t, q in zip(alignment.taxa,
                                                                                         alignment.sequences)))
        jp.write_tree(truth, folder / "true.nwk")
    return folder / "alignment.fasta"


def alignment_path(name: str) -> Path:
    return simulated_set(name) if name.startswith("sim") else DATA / name / "alignment.fasta"


def against_truth(name: str, tree: jp.Tree, alignment) -> dict:
    """For a simulated set: the true tree's log L with lengths and model fitted, and our RF distance to it."""
    if not name.startswith("sim"):
        return {}
    truth = jp.read_tree(SIMULATED / name / "true.nwk")
    fitted = ml.fit(alignment, truth, MODEL)
    return {"true_tree_fitted_log_likelihood": fitted.log_likelihood,
            "rf_ours_to_true": ml.robinson_foulds(tree, truth)}


def our_search(name: str, fast: bool, checkpoints: Path | None = None, max_seconds: float | None = None,
               repeat: bool = False) -> dict | None:
    """Our search alone (`--ours-only`: on a machine without IQ-TREE, e.g. the GPU), with its tree and model.

    With `checkpoints` the search saves `checkpoints/name.ckpt` and goes on from it when it exists; after
    `max_seconds` it stops, saved, and this returns None (a set longer than one device call takes several;
    `seconds` sums the calls', each with its own compilation). With `repeat` the same search runs a second
    time in the process: `warm_seconds` is the search itself, its programs compiled by the first."""
    alignment = jp.read_alignment(alignment_path(name))
    settings = ml.SearchSettings.fast() if fast else ml.SearchSettings()
    ckpt = spent_file = None
    spent = 0.0
    if checkpoints is not None:
        checkpoints.mkdir(parents=True, exist_ok=True)
        ckpt, spent_file = checkpoints / f"{name}.ckpt", checkpoints / f"{name}.seconds"
        spent = float(spent_file.read_text()) if spent_file.exists() else 0.0
    load, began = os.getloadavg()[0], time.perf_counter()
    try:
        with StopRequests(max_seconds) as stop:
            result = ml.search(alignment, MODEL, seed=SEED, settings=settings, checkpoint=ckpt,
                               resume=ckpt is not None and ckpt.exists(), stop=stop)
    except Interrupted as stopped:
        spent_file.write_text(f"{spent + time.perf_counter() - began:.2f}\n")
        print(f"{name}: stopped, saved ({stopped})", flush=True)
        return None
    seconds = spent + time.perf_counter() - began
    import jax

    calls = {"seconds_before_this_call": round(spent, 2)} if spent else {}
    if repeat:
        again = time.perf_counter()
        warm = ml.search(alignment, MODEL, seed=SEED, settings=settings)
        calls.update(warm_seconds=round(time.perf_counter() - again, 2), warm_log_likelihood=warm.log_likelihood)
    return {"seconds": round(seconds, 2), "load_before": round(load, 2), **calls,
            "log_likelihood": result.log_likelihood, "model": result.model_string, "rounds": result.search_rounds,
            "device": jax.devices()[0].device_kind, "settings": vars(settings),
            "tree": jp.io.to_dendropy(result.tree).as_string(schema="newick", suppress_rooting=True,
                                                             real_value_format_specifier=".17g").strip()}


def fasttree(name: str, alignment, workdir: Path) -> dict:
    """FastTree 2 (`-gtr -gamma`) on this machine, its tree then scored by IQ-TREE under GTR+G4 (`-te`: lengths
    and model fitted), since FastTree's own log L is under its CAT approximation."""
    load = os.getloadavg()[0]
    began = time.perf_counter()
    # FastTree cuts names at spaces (carnivores' would collide): its copy of the alignment has '_' for them.
    renamed = workdir / f"{name}_fasttree.fasta"
    renamed.write_text("".join(f">{t.replace(' ', '_')}\n{q}\n" for t, q in zip(alignment.taxa, alignment.sequences)))
    newick = subprocess.run(["fasttree", "-gtr", "-gamma", "-nt", "-quiet", str(renamed)], check=True,
                            capture_output=True, text=True).stdout
    reference = {"seconds": round(time.perf_counter() - began, 2), "load_before": round(load, 2),
                 "command": "fasttree -gtr -gamma -nt -quiet ALN"}
    (workdir / f"{name}_fasttree.nwk").write_text(newick)
    scored = iqtree(["-s", str(alignment_path(name)), "-te", str(workdir / f"{name}_fasttree.nwk"), "-m", MODEL,
                     "-nt", "1"], workdir / f"{name}_fasttree_fit")
    return {**reference, "log_likelihood_iqtree_fit": scored["log_likelihood"], "tree": newick.strip()}


def references_for(name: str, ours: dict, workdir: Path, fast: bool = False) -> dict:
    """The reference on this machine (IQ-TREE's search; FastTree's with `fast`) and IQ-TREE's -blfix check of
    a tree and model our search wrote elsewhere."""
    path = alignment_path(name)
    alignment = jp.read_alignment(path)
    tree = with_alignment_names(jp.parse_newick(ours["tree"]), alignment)
    check = iqtree(["-s", str(path), "-te", str(write_newick(tree, workdir / f"{name}_ours.nwk")), "-m",
                    iqtree_model(ours["model"]), "-blfix", "-nt", "1"], workdir / f"{name}_blfix{'_fast' * fast}")
    if fast:
        reference = fasttree(name, alignment, workdir)
        other, label = reference["log_likelihood_iqtree_fit"], "FastTree (IQ-TREE fit)"
    else:
        reference = iqtree(["-s", str(path), "-m", MODEL, "-nt", "1", "-seed", str(SEED)], workdir / f"{name}_iq")
        other, label = reference["log_likelihood"], "IQ-TREE -nt 1"
    theirs = with_alignment_names(jp.parse_newick(reference["tree"]), alignment)
    tail = "_fast" if fast else ""
    row = {f"ours{tail}": {**ours, "iqtree_blfix_log_likelihood": check["log_likelihood"]},
           "fasttree" if fast else "iqtree": reference,
           f"rf_ours_to_reference{tail}": ml.robinson_foulds(tree, theirs),
           f"log_likelihood_difference{tail}": ours["log_likelihood"] - other,
           **({} if fast else against_truth(name, tree, alignment))}
    print(f"{name:15s} ours ({ours['device']}) {ours['log_likelihood']:.4f} ({ours['seconds']:.1f} s; -blfix "
          f"{check['log_likelihood']:.4f}) | {label} {other:.4f} ({reference['seconds']:.1f} s) | diff "
          f"{ours['log_likelihood'] - other:+.4f} | RF {row[f'rf_ours_to_reference{tail}']}", flush=True)
    return row


def run_set(name: str, workdir: Path, fast: bool) -> dict:
    path = alignment_path(name)
    alignment = jp.read_alignment(path)
    patterns = alignment.site_patterns().num_patterns
    print(f"# {name}: {len(alignment.taxa)} taxa, {alignment.num_sites} sites, {patterns} patterns", flush=True)
    row = {"set": name, "taxa": len(alignment.taxa), "sites": alignment.num_sites, "patterns": patterns,
           "seed": SEED, "model": MODEL}

    settings = ml.SearchSettings.fast() if fast else ml.SearchSettings()
    rounds = []

    def progress(*entry):
        rounds.append(entry)
        print("  round {}  best log L {:.4f}  candidates {}  trees {}  {:.1f} s".format(*entry), flush=True)

    load = os.getloadavg()[0]
    began = time.perf_counter()
    result = ml.search(alignment, MODEL, seed=SEED, settings=settings, progress=progress)
    seconds = time.perf_counter() - began
    ours = {"seconds": round(seconds, 2), "load_before": round(load, 2), "log_likelihood": result.log_likelihood,
            "model": result.model_string, "rounds": len(rounds), "trees_climbed": rounds[-1][3] if rounds else None,
            "first_round_seconds": round(rounds[0][4], 2) if rounds else None, "settings": vars(settings)}
    tree_path = write_newick(result.tree, workdir / f"{name}_ours.nwk")
    check = iqtree(["-s", str(path), "-te", str(tree_path), "-m", iqtree_model(result.model_string), "-blfix",
                    "-nt", "1"], workdir / f"{name}_blfix")
    ours["iqtree_blfix_log_likelihood"] = check["log_likelihood"]
    row["ours_fast" if fast else "ours"] = ours

    if fast:
        reference = fasttree(name, alignment, workdir)
        row["fasttree"] = reference
        other = reference["log_likelihood_iqtree_fit"]
    else:
        reference = iqtree(["-s", str(path), "-m", MODEL, "-nt", "1", "-seed", str(SEED)], workdir / f"{name}_iq")
        row["iqtree"] = reference
        other = reference["log_likelihood"]
    theirs = with_alignment_names(jp.parse_newick(reference["tree"]), alignment)
    row["rf_ours_to_reference" + ("_fast" if fast else "")] = ml.robinson_foulds(result.tree, theirs)
    row["log_likelihood_difference" + ("_fast" if fast else "")] = result.log_likelihood - other
    row.update(against_truth(name, result.tree, alignment))
    print(f"{name:15s} {'fast' if fast else 'default':8s} ours {result.log_likelihood:.4f} ({seconds:.1f} s; "
          f"IQ-TREE -blfix on it {check['log_likelihood']:.4f}) | {'FastTree' if fast else 'IQ-TREE -nt 1'} "
          f"{other:.4f} ({reference['seconds']:.1f} s) | diff {result.log_likelihood - other:+.4f} | "
          f"RF {row['rf_ours_to_reference' + ('_fast' if fast else '')]}", flush=True)
    return row


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="DS1,DS2,DS3,carnivores,primates_mtDNA,rsv2")
    parser.add_argument("--fast", action="store_true", help="ours --fast against FastTree instead")
    parser.add_argument("--out", default=str(OUT), help="JSON to merge the rows into (by set)")
    parser.add_argument("--ours-only", metavar="JSON", help="run only our searches (a machine without IQ-TREE) and "
                                                            "write them here")
    parser.add_argument("--references-for", metavar="JSON", help="run IQ-TREE beside searches --ours-only wrote; "
                                                                 "their rows go to --out under 'ours_elsewhere'")
    parser.add_argument("--data", type=Path, default=DATA, help="the folder of the sets (default ../shared/data)")
    parser.add_argument("--checkpoints", type=Path, help="with --ours-only: save each search here and continue a "
                                                         "saved one (a set longer than one call)")
    parser.add_argument("--max-seconds", type=float, help="with --checkpoints: stop, saved, after this long")
    parser.add_argument("--repeat", action="store_true", help="with --ours-only: each search a second time in the "
                                                              "process (warm_seconds: the search without compiling)")
    parser.add_argument("--iqtree-only", action="store_true", help="with --workdir: only IQ-TREE's searches, kept "
                                                                   "there for a later --references-for")
    parser.add_argument("--workdir", type=Path, help="keep IQ-TREE's runs here and reuse them (default: a "
                                                     "temporary folder)")
    args = parser.parse_args()
    DATA = args.data
    out = Path(args.out)
    if args.max_seconds and not args.checkpoints:
        parser.error("--max-seconds needs --checkpoints (where the stopped search is saved)")
    began = time.perf_counter()
    if args.ours_only:
        path = Path(args.ours_only)
        rows = json.loads(path.read_text()) if path.exists() else {}
        for name in args.sets.split(","):  # written after each set: a run cut short keeps what it finished
            left = args.max_seconds and args.max_seconds - (time.perf_counter() - began)  # one budget for all sets
            row = our_search(name, args.fast, args.checkpoints, left, args.repeat)
            if row is None:
                return
            rows[name] = row
            print(f"{name}: {row['log_likelihood']:.4f}, {row['seconds']} s", flush=True)
            path.write_text(json.dumps(rows, indent=1, default=float) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.iqtree_only:
            for name in args.sets.split(","):
                row = iqtree(["-s", str(alignment_path(name)), "-m", MODEL, "-nt", "1", "-seed", str(SEED)],
                             workdir / f"{name}_iq")
                print(f"{name}: IQ-TREE -nt 1 {row['log_likelihood']:.4f} ({row['seconds']} s)", flush=True)
            return
        if args.references_for:
            record = json.loads(out.read_text())
            for name, ours in json.loads(Path(args.references_for).read_text()).items():
                rows = record.setdefault("ours_elsewhere", {})  # a --fast row joins the set's default one
                rows[name] = {**rows.get(name, {}), **references_for(name, ours, workdir, args.fast)}
                out.write_text(json.dumps(record, indent=1, default=float) + "\n")
            return
    header = dict(iqtree=subprocess.run(["iqtree2", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
                  cpu_count=os.cpu_count(), jaxphylo=jp.__version__, seed=SEED, model=MODEL,
                  note="wall times on a shared 2-core machine (load average before each run kept); ours include "
                       "compilation")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets.split(","):
            row = run_set(name, Path(tmp), args.fast)
            record = json.loads(out.read_text()) if out.exists() else {"rows": {}}  # other runs may have written
            record.update(header)
            record["rows"][name] = {**record["rows"].get(name, {}), **row}
            out.write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
