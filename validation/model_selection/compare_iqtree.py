"""Model selection against IQ-TREE 2's ModelFinder: chosen models, per-candidate log L, wall times.

For each data set: our default selection (`select_model`, BIONJ tree) timed cold
(first call in the process, compilation included) and warm (the same call
again); `iqtree2 -te OUR_BIONJ -m MF -nt 1` on the same topology (per-candidate
log L and its BIC choice) and `iqtree2 -m MF -nt 1` on its own tree (its
default choice), both timed in the same run. Writes results.json beside this
script. Takes minutes; not a test.

    python validation/model_selection/compare_iqtree.py [--datasets primates_mtDNA,DS1,DS2,DS3] [--data DIR]
        [--out results.json]   (results-gpu.json: the same on the H100 machine, IQ-TREE on its CPU)

With `--mrate` (and optionally `--mset`), the candidate-set check instead: the
`jaxphylo models ALN --tree T --mrate M [--mset S]` command and `iqtree2 -s ALN
-te T -m MF -mrate M [-mset S] -nt 1` run one after the other on the same tree
T (our BIONJ, written to a file given to both), each timed as a whole command.
For IQ-TREE's ten best models by BIC: present in our table? our log L minus
IQ-TREE's (must be >= -0.1); and the BIC choice (IQ-TREE's, or one whose BIC is
lower than IQ-TREE's best). Writes candidates.json and candidates.txt (a table
per data set) beside this script:

    python validation/model_selection/compare_iqtree.py --mrate E,I,G,I+G,R --datasets DS1,DS2,DS3
    python validation/model_selection/compare_iqtree.py --mset HKY,TN,GTR --mrate E,I,G,I+G,R,I+R \
        --datasets DS1,DS2,DS3 --out validation/model_selection/candidates-I+R.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

import jaxphylo as jp
from jaxphylo.ml import select_model
from jaxphylo.ml.selection import bionj_start

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "shared" / "data"
# IQ-TREE 2.0.7 lists TPM2+F and TPM3+F beside TPM2u+F and TPM3u+F: the same models.
SAME = {"TPM2+F": "TPM2u+F", "TPM3+F": "TPM3u+F"}


def canonical(name: str) -> str:
    for alias, model in SAME.items():
        if name.startswith(alias + "+") or name == alias:
            return model + name[len(alias):]
    return name


def iqtree(alignment: Path, workdir: Path, prefix: str, extra: list[str]) -> tuple[dict, str, float]:
    """({model: log L}, BIC choice, wall seconds) of `iqtree2 -m MF -nt 1`."""
    command = ["iqtree2", "-s", str(alignment), "-m", "MF", "-nt", "1", "-seed", "1", "-redo", "-quiet",
               "-pre", str(workdir / prefix)] + extra
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=3600)
    seconds = time.perf_counter() - start
    text = (workdir / f"{prefix}.log").read_text()
    rows = re.findall(r"^\s*\d+\s+(\S+)\s+([\d.]+)\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$", text, re.M)
    chosen = re.search(r"Best-fit model: (\S+) chosen according to BIC", text).group(1)
    return {name: -float(value) for name, value in rows}, chosen, seconds


def compare(name: str, workdir: Path, data: Path = DATA) -> dict:
    path = data / name / "alignment.fasta"
    alignment = jp.read_alignment(path)
    start = time.perf_counter()
    ours = select_model(alignment)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    select_model(alignment, ours.tree)
    warm = time.perf_counter() - start
    tree_path = workdir / f"{name}.bionj.nwk"
    jp.write_tree(ours.tree, tree_path)
    same_tree, same_tree_choice, same_tree_seconds = iqtree(path, workdir, f"{name}.te", ["-te", str(tree_path)])
    _, own_tree_choice, own_tree_seconds = iqtree(path, workdir, f"{name}.own", [])
    ours_by_name = {f.model: f.log_likelihood for f in ours.fits}
    common = sorted(set(ours_by_name) & set(same_tree))
    delta = {m: ours_by_name[m] - same_tree[m] for m in common}
    return {
        "alignment": f"data/{name}/alignment.fasta", "taxa": len(alignment.taxa), "sites": alignment.num_sites,
        "ours": {"best_BIC": ours.best, "best_AIC": ours.best_under("AIC"), "best_AICc": ours.best_under("AICc"),
                 "fitted": ours.model_string, "models_fitted": len(ours.fits),
                 "seconds_cold": round(cold, 2), "seconds_warm": round(warm, 2)},
        "iqtree_same_tree": {"best_BIC": same_tree_choice, "models_fitted": len(same_tree),
                             "seconds": round(same_tree_seconds, 2)},
        "iqtree_own_tree": {"best_BIC": own_tree_choice, "seconds": round(own_tree_seconds, 2)},
        "chosen_equal_same_tree": canonical(ours.best) == canonical(same_tree_choice),
        "chosen_equal_own_tree": canonical(ours.best) == canonical(own_tree_choice),
        "log_likelihood": {
            "candidates_compared": len(common),
            "max_abs_delta": round(max(abs(d) for d in delta.values()), 4),
            "max_ours_below_iqtree": round(max(-d for d in delta.values()), 4),
            "within_0.05": sum(abs(d) <= 0.05 for d in delta.values()),
            "ours_higher_by_more_than_0.05": {m: round(d, 3) for m, d in delta.items() if d > 0.05},
            "ours_lower_by_more_than_0.05": {m: round(d, 3) for m, d in delta.items() if d < -0.05},
            "only_ours": sorted(set(ours_by_name) - set(same_tree)),
            "only_iqtree": sorted(set(same_tree) - set(ours_by_name)),
            "per_model": {m: {"ours": round(ours_by_name[m], 4), "iqtree": same_tree[m], "delta": round(delta[m], 4)}
                          for m in common},
        },
    }


TOLERANCE = 0.1  # our log L may be at most this much below IQ-TREE's for its ten best models
ROW = re.compile(r"^\s*\d+\s+(\S+)\s+([\d.]+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$", re.MULTILINE)


def run_timed(command: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done, seconds


def compare_candidates(name: str, workdir: Path, data: Path, mset: str | None, mrate: str) -> dict:
    """IQ-TREE's ten best (by BIC) against our table, both on our BIONJ tree with the same -mset/-mrate."""
    path = data / name / "alignment.fasta"
    alignment = jp.read_alignment(path)
    tree_path = workdir / f"{name}.bionj.nwk"
    jp.write_tree(bionj_start(alignment), tree_path)
    narrowing = ["--mrate", mrate] + (["--mset", mset] if mset else [])
    load_before = os.getloadavg()[0]
    ours_run, ours_seconds = run_timed([sys.executable, "-m", "jaxphylo.cli", "models", str(path), "--tree",
                                        str(tree_path), "--quiet", "--out", str(workdir / f"{name}.ours")] + narrowing)
    load_between = os.getloadavg()[0]
    _, iqtree_seconds = run_timed(["iqtree2", "-s", str(path), "-te", str(tree_path), "-m", "MF", "-nt", "1",
                                   "-seed", "1", "-redo", "-quiet", "-pre", str(workdir / f"{name}.iq")]
                                  + ["-mrate", mrate] + (["-mset", mset] if mset else []))
    load_after = os.getloadavg()[0]
    text = (workdir / f"{name}.iq.log").read_text()
    theirs = {m: {"log_likelihood": -float(l), "df": int(df), "BIC": float(bic)} for m, l, df, bic in ROW.findall(text)}
    announced = int(re.search(r"ModelFinder will test up to (\d+)", text).group(1))
    their_choice = re.search(r"Best-fit model: (\S+) chosen according to BIC", text).group(1)
    with open(workdir / f"{name}.ours.models.tsv") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        ours = {}
        for line in handle:
            row = dict(zip(header, line.rstrip("\n").split("\t")))
            ours[row["model"]] = {"log_likelihood": float(row["log_likelihood"]), "df": int(row["df"]),
                                  "BIC": float(row["BIC"])}
    our_choice = re.search(r"Best-fit model according to BIC: (\S+)", ours_run.stdout).group(1)
    selection_seconds = float(re.search(r"models fitted in ([\d.]+) s", ours_run.stderr).group(1))
    ten = sorted(theirs, key=lambda m: theirs[m]["BIC"])[:10]
    best_ten = []
    for m in ten:
        row = {"model": m, "iqtree_log_likelihood": theirs[m]["log_likelihood"], "iqtree_BIC": theirs[m]["BIC"],
               "in_ours": m in ours}
        if m in ours:
            delta = ours[m]["log_likelihood"] - theirs[m]["log_likelihood"]
            row.update(ours_log_likelihood=round(ours[m]["log_likelihood"], 4), ours_BIC=round(ours[m]["BIC"], 4),
                       delta_log_likelihood=round(delta, 4), df_equal=ours[m]["df"] == theirs[m]["df"],
                       ok=delta >= -TOLERANCE)
        else:
            row["ok"] = False
        best_ten.append(row)
    their_best_bic = theirs[their_choice]["BIC"]
    our_best_bic = ours[our_choice]["BIC"]
    common = sorted(set(ours) & set(theirs))
    delta = {m: ours[m]["log_likelihood"] - theirs[m]["log_likelihood"] for m in common}
    choice_ok = canonical(our_choice) == canonical(their_choice) or our_best_bic < their_best_bic
    return {
        "alignment": f"data/{name}/alignment.fasta", "taxa": len(alignment.taxa), "sites": alignment.num_sites,
        "mset": mset, "mrate": mrate, "tree": "BIONJ of JC69 distances (ours), given to both (--tree / -te)",
        "iqtree_ten_best": best_ten,
        "ten_best_all_present_within_tolerance": all(r["ok"] for r in best_ten),
        "bic_choice": {"iqtree": their_choice, "iqtree_BIC": their_best_bic, "ours": our_choice,
                       "ours_BIC": round(our_best_bic, 4), "same_model": canonical(our_choice) == canonical(their_choice),
                       "ok": choice_ok},
        "models": {"iqtree_candidates_announced": announced, "iqtree_fitted": len(theirs), "ours_fitted": len(ours),
                   "only_iqtree": sorted(set(theirs) - set(ours)), "only_ours": sorted(set(ours) - set(theirs)),
                   "common": len(common), "max_ours_below_iqtree": round(max(-d for d in delta.values()), 4),
                   "max_ours_above_iqtree": round(max(delta.values()), 4),
                   "ours_lower_by_more_than_0.1": {m: round(d, 3) for m, d in delta.items() if d < -TOLERANCE}},
        "wall_seconds": {"ours_command": round(ours_seconds, 2), "ours_selection": selection_seconds,
                         "iqtree_command": round(iqtree_seconds, 2),
                         "load_average_1min": [round(x, 2) for x in (load_before, load_between, load_after)]},
    }


def candidates_text(results: dict) -> str:
    """The candidate-set check as plain tables, one per data set."""
    lines = [f"# {results['machine']['iqtree']}; jax {results['machine']['jax_backend']}; {results['note']}", ""]
    for name, r in results["datasets"].items():
        w = r["wall_seconds"]
        lines.append(f"## {name} ({r['taxa']} taxa, {r['sites']} sites), -mset {r['mset'] or '(all)'} "
                     f"-mrate {r['mrate']}")
        lines.append(f"{'IQ-TREE ten best':<16} {'IQ log L':>12} {'IQ BIC':>12} {'ours log L':>12} {'ours BIC':>12} "
                     f"{'ours - IQ':>9}  in ours / ok")
        for row in r["iqtree_ten_best"]:
            if row["in_ours"]:
                lines.append(f"{row['model']:<16} {row['iqtree_log_likelihood']:12.3f} {row['iqtree_BIC']:12.3f} "
                             f"{row['ours_log_likelihood']:12.3f} {row['ours_BIC']:12.3f} "
                             f"{row['delta_log_likelihood']:9.3f}  yes / {'ok' if row['ok'] else 'FAIL'}")
            else:
                lines.append(f"{row['model']:<16} {row['iqtree_log_likelihood']:12.3f} {row['iqtree_BIC']:12.3f} "
                             f"{'-':>12} {'-':>12} {'-':>9}  NO / FAIL")
        c, m = r["bic_choice"], r["models"]
        lines.append(f"BIC choice: IQ-TREE {c['iqtree']} ({c['iqtree_BIC']:.3f}), ours {c['ours']} "
                     f"({c['ours_BIC']:.3f}): {'ok' if c['ok'] else 'FAIL'}")
        lines.append(f"models fitted: IQ-TREE {m['iqtree_fitted']} (of {m['iqtree_candidates_announced']}), ours "
                     f"{m['ours_fitted']}; only IQ-TREE {m['only_iqtree'] or 'none'}, only ours "
                     f"{m['only_ours'] or 'none'}; ours - IQ-TREE log L over all {m['common']} common: "
                     f"{-m['max_ours_below_iqtree']:.4f} .. {m['max_ours_above_iqtree']:.4f}")
        lines.append(f"wall: ours {w['ours_command']} s (jaxphylo models; selection {w['ours_selection']} s), "
                     f"IQ-TREE {w['iqtree_command']} s; 1-min load average {w['load_average_1min']}")
        lines.append("")
    return "\n".join(lines)


def main_candidates(args) -> None:
    out = Path(args.out or HERE / "candidates.json")
    version = subprocess.run(["iqtree2", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "jax_backend": jax.default_backend(), "iqtree": version},
               "note": "both whole commands timed, one after the other on the same machine (a 2-core CPU shared "
                       "with other jobs: see the load averages); IQ-TREE -nt 1",
               "datasets": {}}
    if out.exists():
        results["datasets"] = json.loads(out.read_text())["datasets"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            print(f"# {name}", flush=True)
            results["datasets"][name] = compare_candidates(name, Path(tmp), Path(args.data), args.mset, args.mrate)
            out.write_text(json.dumps(results, indent=1) + "\n")
            out.with_suffix(".txt").write_text(candidates_text(results) + "\n")
            print(candidates_text({**results, "datasets": {name: results["datasets"][name]}}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="primates_mtDNA,DS1")
    parser.add_argument("--out", default=None, help="default results.json, or candidates.json with --mrate")
    parser.add_argument("--data", default=str(DATA), help="folder of the data sets (default ../shared/data)")
    parser.add_argument("--mrate", help="the candidate-set check with this -mrate (e.g. E,I,G,I+G,R)")
    parser.add_argument("--mset", help="with --mrate: this -mset too (default: all 22 DNA models)")
    args = parser.parse_args()
    if args.mrate:
        main_candidates(args)
        return
    args.out = args.out or str(HERE / "results.json")
    version = subprocess.run(["iqtree2", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    results = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                           "jax_backend": jax.default_backend(), "device": str(jax.devices()[0]),
                           "iqtree": version},
               "note": "ours cold = first select_model call in the process (compilation included); warm = same "
                       "call again. IQ-TREE -nt 1, -m MF, same run; same_tree uses -te with our BIONJ tree.",
               "datasets": {}}
    if Path(args.out).exists():  # data sets run before (perhaps on another day) are kept beside the new ones
        results["datasets"] = json.loads(Path(args.out).read_text())["datasets"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            print(f"# {name}", flush=True)
            results["datasets"][name] = compare(name, Path(tmp), Path(args.data))
            summary = {k: v for k, v in results["datasets"][name].items() if k != "log_likelihood"}
            print(json.dumps(summary, indent=1), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
