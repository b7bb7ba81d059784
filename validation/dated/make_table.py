#!/usr/bin/env python3
"""Print a Markdown table of run summaries: the JSON files given, or all of
validation/dated/beast/*.json."""

import glob
import json
import os
import sys


def fmt(x, nd=1):
    return "–" if x is None else f"{x:,.{nd}f}"


def sig(x, n=3):
    return "–" if x is None else f"{x:.{n}g}"


def main(paths=None):
    if not paths:
        folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "beast")
        paths = sorted(glob.glob(os.path.join(folder, "*.json")))
    rows = []
    for path in paths:
        d = json.load(open(path))
        cols = d["columns"]
        age = cols["age(root)"]
        rate_key = "ucld.mean" if "ucld.mean" in cols else "clock.rate"
        model = f"{d['clock']} clock, {d['tree_prior']}"
        if d["tree_prior"] == "skygrid":
            model += f" (cutoff {d['skygrid_cutoff']:g}, K={d['skygrid_intervals']})"
        if rate_key == "ucld.mean":
            model += f"; ucld.stdev {sig(cols['ucld.stdev']['median'], 2)}"
        rows.append(
            "| {ds} | {model} | {states:,} | {secs} | {age} [{lo}, {hi}] | {rate} | {kappa} | "
            "{eage} / {essage:.0f} | {elik} / {esslik:.0f} |".format(
                ds=d["dataset"], model=model, states=d["chain_length"],
                secs=fmt(d["wall_seconds"], 0),
                age=f"{age['median']:.1f}", lo=f"{age['hpd95'][0]:.1f}", hi=f"{age['hpd95'][1]:.1f}",
                rate=sig(cols[rate_key]["median"]), kappa=sig(cols["kappa"]["median"]),
                eage=fmt(d["ess_per_hour"]["age(root)"], 0), essage=age["ess"],
                elik=fmt(d["ess_per_hour"]["likelihood"], 0), esslik=cols["likelihood"]["ess"],
            )
        )
    print("| dataset | model | states | wall s | root age median [95% HPD] | clock rate median "
          "(subst/site/yr) | kappa median | ESS/h root age / ESS | ESS/h likelihood / ESS |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
