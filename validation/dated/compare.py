"""Side by side: BEAST 1.10's runs (`beast/*.json`) and jaxphylo's (`ours/*.json`) on the same data and model.

    python validation/dated/compare.py [--out validation/dated/comparison.json]

For every BEAST run and every jaxphylo run of the same data set, clock and
tree prior: posterior medians of age(root), the clock rate, kappa and the
Gamma shape (the same parameter only when ours used median rates, `+G4m`) with
their Monte-Carlo standard errors (`sd / sqrt(ESS)`) and the difference in
units of the combined error (|z| < 3 is "within Monte-Carlo error"); the
largest difference of clade posteriors (over clades at >= 0.05 in either);
ESS per hour of wall time for age(root) and the likelihood, and their ratio.
A BEAST run with another seed (`beast/replicates/*.json`, `SEED=2 run_beast.sh ...`) is compared with BEAST's
main run the same way: BEAST against itself, the Monte-Carlo error of its own clade posteriors.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAME = {"age(root)": ("age(root)", "age(root)"), "clock rate": ("clock.rate", "clock.rate"),
        "kappa": ("kappa", "kappa"), "gamma shape": ("alpha", "gamma_shape")}
RELAXED = {"clock rate": ("ucld.mean", "ucld.mean")}


def _key(record) -> tuple:
    return record["dataset"], record["clock"], record["tree_prior"]


def _clades(record) -> dict:
    clades = record["clades"]
    if clades and isinstance(clades[0], dict):  # summarise.py's form
        return {tuple(sorted(c["taxa"])): c["frequency"] for c in clades}
    return {tuple(names): f for names, f in clades}


def clade_difference(one: dict, other: dict) -> float:
    """The largest difference of a clade's posterior between two runs (clades at >= 0.05 in either)."""
    first, second = _clades(one), _clades(other)
    return max(abs(first.get(c, 0.0) - second.get(c, 0.0)) for c in set(first) | set(second))


def compare(beast: dict, ours: dict) -> dict:
    row = {"dataset": beast["dataset"], "clock": beast["clock"], "tree_prior": beast["tree_prior"],
           "ours": ours["device"], "model": ours.get("model", "HKY+FO+G4"), "parameters": {}}
    # (runs from before `--median-gamma` record no model: they are HKY+FO+G4, mean rates)
    names = {**SAME, **(RELAXED if beast["clock"] == "relaxed" else {})}
    for label, (theirs, mine) in names.items():
        b, o = beast["columns"][theirs], ours["columns"][mine]
        se_b, se_o = b["sd"] / math.sqrt(b["ess"]), o["sd"] / math.sqrt(o["ess"])
        row["parameters"][label] = {"beast": b["median"], "ours": o["median"], "beast_se": se_b, "ours_se": se_o,
                                    "z": (o["median"] - b["median"]) / math.hypot(se_b, se_o)}
    row["max_clade_difference"] = clade_difference(beast, ours)
    for label, theirs, mine in (("age(root)", "age(root)", "age(root)"),
                                ("likelihood", "likelihood", "likelihood")):
        b, o = beast["ess_per_hour"][theirs], ours["ess_per_hour"][mine]
        row[f"ess_per_hour {label}"] = {"beast": b, "ours": o, "ratio": o / b}
    row["seconds"] = {"beast": beast["wall_seconds"], "ours": ours["wall_seconds"],
                      "ours_first_block": ours["first_block_seconds"]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "comparison.json")
    args = parser.parse_args()
    beast = {_key(r): r for r in (json.loads(p.read_text()) for p in sorted((HERE / "beast").glob("*.json")))}
    rows = []
    for path in sorted((HERE / "ours").glob("*.json")):
        ours = json.loads(path.read_text())
        if _key(ours) in beast:
            rows.append({"file": path.name, **compare(beast[_key(ours)], ours)})
    for row in rows:
        print(f"{row['file']}: {row['dataset']} {row['clock']} {row['tree_prior']} ({row['ours']}, {row['model']})")
        for label, p in row["parameters"].items():
            print(f"  {label:<12} BEAST {p['beast']:.6g} ± {p['beast_se']:.2g}   ours {p['ours']:.6g} ± "
                  f"{p['ours_se']:.2g}   z {p['z']:+.2f}")
        print(f"  largest clade posterior difference {row['max_clade_difference']:.3f}")
        for label in ("age(root)", "likelihood"):
            e = row[f"ess_per_hour {label}"]
            print(f"  ESS/hour {label:<11} BEAST {e['beast']:>10.0f}   ours {e['ours']:>10.0f}   ratio {e['ratio']:.2f}")
        s = row["seconds"]
        print(f"  wall seconds   BEAST {s['beast']:.0f}   ours {s['ours']:.0f} (first block, with compilation, "
              f"{s['ours_first_block']:.0f})")
    for path in sorted((HERE / "beast" / "replicates").glob("*.json")):
        replicate = json.loads(path.read_text())
        if _key(replicate) in beast:
            difference = clade_difference(beast[_key(replicate)], replicate)
            rows.append({"file": path.name, "dataset": replicate["dataset"], "clock": replicate["clock"],
                         "tree_prior": replicate["tree_prior"], "seconds": replicate["wall_seconds"],
                         "beast_against_beast_max_clade_difference": difference})
            print(f"{path.name}: BEAST's main run against this one, largest clade posterior difference "
                  f"{difference:.3f} ({replicate['wall_seconds']:.0f} s)")
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
