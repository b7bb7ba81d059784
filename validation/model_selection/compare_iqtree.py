"""Model selection against IQ-TREE 2's ModelFinder: chosen models, per-candidate log L, wall times.

For each data set: our default selection (`select_model`, BIONJ tree) timed cold
(first call in the process, compilation included) and warm (the same call
again); `iqtree2 -te OUR_BIONJ -m MF -nt 1` on the same topology (per-candidate
log L and its BIC choice) and `iqtree2 -m MF -nt 1` on its own tree (its
default choice), both timed in the same run. Writes results.json beside this
script. Takes minutes; not a test.

    python validation/model_selection/compare_iqtree.py [--datasets primates_mtDNA,DS1,DS2,DS3] [--data DIR]
        [--out results.json]   (results-gpu.json: the same on the H100 machine, IQ-TREE on its CPU)
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

import jax

import jaxphylo as jp
from jaxphylo.ml import select_model

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="primates_mtDNA,DS1")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--data", default=str(DATA), help="folder of the data sets (default ../shared/data)")
    args = parser.parse_args()
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
