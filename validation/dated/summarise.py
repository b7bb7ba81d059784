#!/usr/bin/env python3
"""Summarise a Tracer-style MCMC log and a NEXUS trees file as JSON.

Works for BEAST 1/2 output and for any sampler writing the same formats:

* log: tab-separated, ``#`` comment lines, a header line whose first column
  is the state (``state``/``Sample``), one row per sample;
* trees: NEXUS with an optional TRANSLATE block and lines such as
  ``tree STATE_1000 [&lnP=-3770.1] = [&R] ((1:2.5,2:2.5)...);``; node
  annotations (``[&height=...,rate=...]``) and branch lengths are optional.

The first ``--burnin`` fraction (default 10%) of the log rows and of the
trees is dropped.  Per log column: median, mean, 95% HPD interval (shortest
interval, ``arviz.hdi``), bulk ESS (``arviz.ess`` with the column as one
chain).  Per clade (set of tips below an internal node of the rooted tree;
single tips and the full tip set left out): posterior frequency, for all
clades with frequency >= ``--min-clade-freq`` (default 0.05).

With ``--seconds`` (wall time of the run) and ``--chain-length`` the JSON
also gets states per second and ESS per hour for every column.

Example::

    python validation/dated/summarise.py run.log run.trees \
        --seconds 312.4 --chain-length 10000000 --out run.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter

import numpy as np


# --------------------------------------------------------------------- log
def read_log(path):
    """Return (column names, 2-D float array) of a Tracer-style log."""
    header = None
    rows = []
    with open(path) as fh:
        for line in fh:
            if line.startswith("#") or line.startswith("[") or not line.strip():
                continue
            parts = line.rstrip("\r\n").split("\t")
            if header is None:
                header = [p.strip() for p in parts]
                continue
            if len(parts) != len(header):
                # a truncated last line of a log still being written
                continue
            try:
                rows.append([float(p) for p in parts])
            except ValueError:
                continue
    if header is None:
        raise SystemExit(f"{path}: no header line found")
    return header, np.array(rows, dtype=float).reshape(-1, len(header))


def column_summary(x):
    x = np.asarray(x, dtype=float)
    out = {"n": int(x.size)}
    if x.size == 0:
        return out
    out["median"] = float(np.median(x))
    out["mean"] = float(np.mean(x))
    out["sd"] = float(np.std(x, ddof=1)) if x.size > 1 else 0.0
    if x.size >= 4 and np.ptp(x) > 0:
        import arviz

        # ArviZ 1.x renamed `hdi_prob` to `prob`, and its `ess` takes [chain, draw] arrays only
        probability = "prob" if int(arviz.__version__.split(".")[0]) >= 1 else "hdi_prob"
        lo, hi = arviz.hdi(x, **{probability: 0.95})
        out["hpd95"] = [float(lo), float(hi)]
        ess = float(arviz.ess(x[np.newaxis], method="bulk"))
        out["ess"] = ess if math.isfinite(ess) else None
    else:
        out["hpd95"] = [float(np.min(x)), float(np.max(x))]
        out["ess"] = None  # constant column
    return out


# ------------------------------------------------------------------- trees
def _strip_comments(s):
    """Remove [...] comments (annotations) outside of quoted labels."""
    out = []
    depth = 0
    quote = None
    for ch in s:
        if quote:
            out.append(ch)
            if ch == quote:
                quote = None
            continue
        if depth == 0 and ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _unquote(s):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1].replace("''", "'")
    return s


def read_nexus_trees(path):
    """Return (translate dict, list of (tree name, newick)) from a NEXUS file.

    A plain Newick file (one tree per line) is accepted too.
    """
    with open(path) as fh:
        text = fh.read()
    if not text.lstrip().upper().startswith("#NEXUS"):
        trees = []
        for i, line in enumerate(text.splitlines()):
            line = _strip_comments(line).strip()
            if line.startswith("("):
                trees.append((f"tree_{i}", line))
        return {}, trees

    translate = {}
    trees = []
    # split into statements terminated by ';' (outside comments / quotes)
    body = _strip_comments(text)
    body = re.sub(r"^\s*#nexus", "", body, flags=re.IGNORECASE)
    in_trees = False
    for stmt in _split_statements(body):
        s = stmt.strip()
        if not s:
            continue
        low = s.lower()
        if low.startswith("begin"):
            in_trees = low.split()[1].rstrip(";") == "trees" if len(low.split()) > 1 else False
            continue
        if low.startswith("end"):
            in_trees = False
            continue
        if not in_trees:
            continue
        if low.startswith("translate"):
            entries = s[len("translate"):].split(",")
            for e in entries:
                e = e.strip()
                if not e:
                    continue
                parts = e.split(None, 1)
                if len(parts) == 2:
                    translate[_unquote(parts[0])] = _unquote(parts[1])
        elif low.startswith("tree") or low.startswith("utree"):
            head, _, newick = s.partition("=")
            name = head.split(None, 1)[1].strip() if len(head.split(None, 1)) > 1 else ""
            if name.startswith("*"):
                name = name[1:].strip()
            trees.append((_unquote(name), newick.strip() + ";"))
    return translate, trees


def _split_statements(text):
    out, cur, quote = [], [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == ";":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def newick_clades(newick, index):
    """Return the list of clades (bitmasks over ``index``) of a rooted
    Newick tree whose comments were already stripped.  ``index`` maps a tip
    label to a bit; unseen labels are added to it."""
    clades = []
    stack = [0]
    i, n = 0, len(newick)
    expect_label = True
    while i < n:
        ch = newick[i]
        if ch == "(":
            stack.append(0)
            i += 1
            expect_label = True
        elif ch == ",":
            i += 1
            expect_label = True
        elif ch == ")":
            mask = stack.pop()
            clades.append(mask)
            stack[-1] |= mask
            i += 1
            expect_label = False
            # skip an internal node label
            while i < n and newick[i] not in ",():;":
                i += 1
        elif ch == ":":
            i += 1
            while i < n and newick[i] not in ",();":
                i += 1
        elif ch == ";":
            break
        elif ch.isspace():
            i += 1
        else:
            # a tip label, possibly quoted
            if ch in "'\"":
                j = newick.index(ch, i + 1)
                label = newick[i + 1:j]
                i = j + 1
            else:
                j = i
                while j < n and newick[j] not in ",():;" and not newick[j].isspace():
                    j += 1
                label = newick[i:j]
                i = j
            if expect_label:
                if label not in index:
                    index[label] = len(index)
                stack[-1] |= 1 << index[label]
            expect_label = False
    return clades, stack[0]


def clade_frequencies(translate, trees, min_freq):
    index = {}
    counts = Counter()
    n_trees = 0
    tips_mask = None
    for _, newick in trees:
        clades, all_mask = newick_clades(newick, index)
        tips_mask = all_mask if tips_mask is None else tips_mask
        n_trees += 1
        for m in set(clades):
            if m != all_mask and (m & (m - 1)) != 0:
                counts[m] += 1
    labels = [None] * len(index)
    for lab, bit in index.items():
        labels[bit] = translate.get(lab, lab)
    result = []
    for m, c in counts.most_common():
        f = c / n_trees
        if f < min_freq:
            break
        taxa = sorted(labels[b] for b in range(len(labels)) if (m >> b) & 1)
        result.append({"taxa": taxa, "size": len(taxa), "frequency": f})
    result.sort(key=lambda d: (-d["frequency"], d["size"], d["taxa"]))
    return n_trees, sorted(labels), result


# -------------------------------------------------------------------- main
def summarise(log_path, trees_path=None, burnin=0.1, min_clade_freq=0.05,
              seconds=None, chain_length=None, most_recent_tip=None):
    header, data = read_log(log_path)
    n_rows = data.shape[0]
    start = int(math.floor(burnin * n_rows))
    kept = data[start:]
    res = {
        "log": log_path,
        "burnin_fraction": burnin,
        "n_samples_total": int(n_rows),
        "n_samples_used": int(kept.shape[0]),
    }
    if n_rows:
        res["first_state_used"] = float(kept[0, 0]) if kept.shape[0] else None
        res["last_state"] = float(data[-1, 0])
    columns = {}
    for j, name in enumerate(header):
        if j == 0:
            continue
        columns[name] = column_summary(kept[:, j])
    if "age(root)" not in columns and most_recent_tip is not None:
        for rh in ("treeModel.rootHeight", "rootHeight", "tree.height", "root_height"):
            if rh in header:
                columns["age(root)"] = column_summary(most_recent_tip - kept[:, header.index(rh)])
                columns["age(root)"]["derived_from"] = f"{most_recent_tip} - {rh}"
                break
    res["columns"] = columns

    if chain_length is None and n_rows:
        chain_length = int(data[-1, 0])
    res["chain_length"] = chain_length
    if seconds is not None:
        res["wall_seconds"] = seconds
        if chain_length:
            res["states_per_second"] = chain_length / seconds if seconds > 0 else None
        hours = seconds / 3600.0
        # ESS is over the post-burn-in part; scale the time to that part
        used_hours = hours * (1.0 - burnin)
        res["ess_per_hour_note"] = (
            "ESS of the post-burn-in samples divided by the total wall time "
            "(burn-in included)")
        res["ess_per_hour"] = {
            k: (v["ess"] / hours if v.get("ess") and hours > 0 else None)
            for k, v in columns.items()
        }
        res["ess_per_hour_postburnin_time"] = {
            k: (v["ess"] / used_hours if v.get("ess") and used_hours > 0 else None)
            for k, v in columns.items()
        }

    if trees_path:
        translate, trees = read_nexus_trees(trees_path)
        t0 = int(math.floor(burnin * len(trees)))
        n_used, taxa, clades = clade_frequencies(translate, trees[t0:], min_clade_freq)
        res["trees"] = trees_path
        res["n_trees_total"] = len(trees)
        res["n_trees_used"] = n_used
        res["taxa"] = taxa
        res["min_clade_frequency"] = min_clade_freq
        res["clades"] = clades
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="Tracer-style log (tab-separated)")
    p.add_argument("trees", nargs="?", default=None, help="NEXUS trees file")
    p.add_argument("--burnin", type=float, default=0.1, help="fraction dropped (default 0.1)")
    p.add_argument("--min-clade-freq", type=float, default=0.05)
    p.add_argument("--seconds", type=float, default=None, help="wall time of the run")
    p.add_argument("--chain-length", type=int, default=None,
                   help="number of states (default: last state in the log)")
    p.add_argument("--most-recent-tip", type=float, default=None,
                   help="date of the most recent tip: derives age(root) from the root "
                        "height when the log has no age(root) column")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="extra metadata for the JSON (value parsed as JSON if possible)")
    p.add_argument("--out", default=None, help="output JSON (default: stdout)")
    args = p.parse_args(argv)

    res = summarise(args.log, args.trees, args.burnin, args.min_clade_freq,
                    args.seconds, args.chain_length, args.most_recent_tip)
    meta = {}
    for kv in args.meta:
        k, _, v = kv.partition("=")
        try:
            meta[k] = json.loads(v)
        except json.JSONDecodeError:
            meta[k] = v
    if meta:
        res = {**meta, **res}
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
