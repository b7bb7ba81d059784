"""BEAGLE 3.1 CPU (SSE, float64, one thread) as the reference next to jaxphylo's CPU timings.

    from _beagle import beagle_likelihood, tips_from_table
    result = beagle_likelihood(P, pi, weights, tip_states, pattern_weights, parent)

BEAGLE comes from Debian: `apt-get install libhmsbeagle-dev` (not a dependency of
jaxphylo). `benchmarks/beagle/beagle_bench.c` is compiled once with `cc -O2` into
`benchmarks/beagle/build/` (rebuilt when the source changes) and given the very
transition matrices jaxphylo uses, so both compute the same likelihood. Without
BEAGLE, or if the build or the run fails, `beagle_likelihood` prints why and
returns None (benchmarks then print "—").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "beagle"
SOURCE = HERE / "beagle_bench.c"
BUILD = HERE / "build"
INSTALL_HINT = "BEAGLE not installed (apt-get install libhmsbeagle-dev)"

_binary_cache: dict[str, Path | None] = {}


def _say(reason: str) -> None:
    print(f"BEAGLE reference unavailable: {reason}")


def _compile_flags() -> list[str] | None:
    """Compiler and linker flags for libhmsbeagle, or None when it is not installed."""
    if shutil.which("pkg-config"):
        run = subprocess.run(["pkg-config", "--cflags", "--libs", "hmsbeagle-1"], capture_output=True, text=True)
        if run.returncode == 0:
            return run.stdout.split()
    for include in ("/usr/include/libhmsbeagle-1", "/usr/local/include/libhmsbeagle-1"):
        if Path(include, "libhmsbeagle", "beagle.h").exists():
            return [f"-I{include}", "-lhmsbeagle"]
    return None


def beagle_binary() -> Path | None:
    """Path of the compiled harness (built on first use), or None with a printed reason."""
    if "binary" in _binary_cache:
        return _binary_cache["binary"]
    binary = None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    flags = _compile_flags()
    if flags is None:
        _say(INSTALL_HINT)
    elif compiler is None:
        _say("no C compiler (cc) found")
    else:
        digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
        target = BUILD / f"beagle_bench-{digest}"
        if target.exists():
            binary = target
        else:
            BUILD.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
                out = Path(tmp) / "beagle_bench"
                run = subprocess.run([compiler, "-O2", str(SOURCE), "-o", str(out), *flags, "-lm"],
                                     capture_output=True, text=True)
                if run.returncode == 0:
                    os.replace(out, target)  # atomic: concurrent builds do not clash
                    binary = target
                else:
                    _say(f"building {SOURCE.name} failed:\n{run.stderr.strip()}")
    _binary_cache["binary"] = binary
    return binary


def tips_from_table(codes, tip_table) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Tip states (missing = S) from jaxphylo codes into a 0/1 `tip_table`.

    Rows of the table with a single one are that state; all ones is missing. Tips with
    any other (ambiguous) row come back as partials `{tip: [patterns, S]}` for the
    `tip_partials` argument.
    """
    codes, table = np.asarray(codes), np.asarray(tip_table, float)
    states = table.shape[1]
    single = (table.sum(1) == 1) & np.all((table == 0) | (table == 1), 1)
    missing = np.all(table == 1, 1)
    row_state = np.where(single, table.argmax(1), states)
    ambiguous = ~(single | missing)
    tip_states = row_state[codes].astype(np.int64)
    partials = {int(t): table[codes[t]] for t in range(codes.shape[0]) if ambiguous[codes[t]].any()}
    return tip_states, partials


def _binarize(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Resolve multifurcations with zero-length branches: (new parent array, added nodes).

    A node with children c1..ck (k > 2) keeps c1 and gets a new child that holds the rest,
    repeatedly. Added nodes are numbered after the existing ones.
    """
    parent = [int(p) for p in parent]
    children: dict[int, list[int]] = {}
    for node, up in enumerate(parent):
        if up >= 0:
            children.setdefault(up, []).append(node)
    added = []
    for node in list(children):
        kids = children[node]
        if len(kids) == 1:
            raise ValueError(f"node {node} has a single child: not supported")
        holder = node
        while len(kids) > 2:
            new = len(parent)
            parent.append(holder)
            added.append(new)
            for k in kids[1:]:
                parent[k] = new
            kids = kids[1:]
            holder = new
    return np.asarray(parent), np.asarray(added, int)


def _post_order(parent: np.ndarray, tips: int) -> list[tuple[int, int, int]]:
    children: dict[int, list[int]] = {}
    for node, up in enumerate(parent):
        if up >= 0:
            children.setdefault(int(up), []).append(node)
    roots = [n for n, up in enumerate(parent) if up < 0]
    if len(roots) != 1:
        raise ValueError(f"the tree needs exactly one root, found {len(roots)}")
    ops, stack = [], [(roots[0], False)]
    while stack:
        node, expanded = stack.pop()
        if node < tips:
            continue
        if expanded:
            a, b = children[node]
            ops.append((node, a, b))
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children[node])
    return ops


def _write_input(path, transition, derivative, frequencies, category_weights, tip_states, tip_partials,
                 pattern_weights, parent, ops, repeats):
    nodes, categories, s, _ = transition.shape
    tips, patterns = tip_states.shape
    root = ops[-1][0]
    number = lambda a: " ".join(map(repr, np.asarray(a, float).ravel().tolist()))  # noqa: E731
    with open(path, "w") as f:
        f.write("beagle_bench 1\n")
        f.write(f"tips {tips} nodes {nodes} patterns {patterns} states {s} categories {categories} "
                f"repeats {repeats}\n")
        f.write(f"pattern_weights {number(pattern_weights)}\n")
        f.write(f"category_weights {number(category_weights)}\n")
        f.write(f"frequencies {number(frequencies)}\n")
        for t in range(tips):
            if t in tip_partials:
                f.write(f"tip {t} partials {number(tip_partials[t])}\n")
            else:
                f.write(f"tip {t} states {' '.join(map(str, tip_states[t].tolist()))}\n")
        for v in range(nodes):
            if v != root:
                f.write(f"matrix {v} {number(transition[v])}\n")
        f.write(f"derivatives {int(derivative is not None)}\n")
        if derivative is not None:
            for v in range(nodes):
                if v != root:
                    f.write(f"dmatrix {v} {number(derivative[v])}\n")
        f.write(f"operations {len(ops)}\n")
        f.writelines(f"{a} {b} {c}\n" for a, b, c in ops)


def beagle_likelihood(transition, frequencies, category_weights, tip_states, pattern_weights, parent, *,
                      transition_derivative=None, tip_partials=None, repeats: int = 0,
                      timeout: float = 900) -> dict | None:
    """Log-likelihood and median milliseconds of BEAGLE's CPU SSE evaluation, or None.

    transition: `[nodes, C, S, S]`, the P of the branch above each node (the root's row is
        ignored); `P[v, c, i, j]` = Pr(child state j | parent state i).
    frequencies `[S]`, category_weights `[C]`, pattern_weights `[patterns]`.
    tip_states: `[tips, patterns]` ints in `0..S`, `S` = missing.
    parent: parent of each node, tips `0..N-1`, the root has -1. A multifurcation (e.g. an
        unrooted tree's trifurcating root) is resolved with zero-length (identity) branches.
    transition_derivative: optional `[nodes, C, S, S]` dP/dt; then the branch-length gradient
        (upper partials + beagleCalculateEdgeLogLikelihoods with first derivatives on every
        edge) is timed too and its values returned. The model must be reversible.
    tip_partials: optional `{tip: [patterns, S]}` for tips with ambiguous data.
    repeats: timed evaluations (0: as many as fit about 1.5 s, at least 7).

    Returns {"log_likelihood", "median_ms", "median_ms_rescaled", "implementation", "version",
    ...}: also "resource", "flags", "log_likelihood_rescaled", "cpu_per_wall" (~1 for one thread)
    and, with derivatives, "gradient_median_ms", "gradient_median_ms_rescaled", "derivatives"
    (d log L / d t per original node, root 0).
    """
    binary = beagle_binary()
    if binary is None:
        return None
    transition = np.asarray(transition, float)
    tip_states = np.asarray(tip_states)
    nodes, categories, s, _ = transition.shape
    parent = np.asarray(parent)
    tips = tip_states.shape[0]
    if parent.shape != (nodes,):
        raise ValueError(f"parent has {parent.shape[0]} nodes, transition {nodes}")
    for label, array, size in (("frequencies", frequencies, s), ("category_weights", category_weights, categories),
                               ("pattern_weights", pattern_weights, tip_states.shape[1])):
        if np.shape(array) != (size,):
            raise ValueError(f"{label} has shape {np.shape(array)}, expected ({size},)")
    if tip_states.min() < 0 or tip_states.max() > s:
        raise ValueError(f"tip states must lie in 0..{s} ({s} = missing)")
    full_parent, added = _binarize(parent)
    if len(added):  # zero-length branches: identity P, zero dP/dt
        eye = np.broadcast_to(np.eye(s), (len(added), categories, s, s))
        transition = np.concatenate([transition, eye])
        if transition_derivative is not None:
            transition_derivative = np.concatenate(
                [np.asarray(transition_derivative, float), np.zeros_like(eye)])
    if len(full_parent) != 2 * tips - 1:
        raise ValueError("after resolving multifurcations the tree is not binary with tips 0..N-1")
    ops = _post_order(full_parent, tips)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.txt"
        _write_input(path, transition, transition_derivative, frequencies, category_weights, tip_states,
                     tip_partials or {}, pattern_weights, full_parent, ops, repeats)
        try:
            run = subprocess.run([str(binary), str(path)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            _say(f"timed out after {timeout} s")
            return None
    if run.returncode != 0:
        _say(f"beagle_bench exited {run.returncode}: {run.stderr.strip()}")
        return None
    if run.stderr.strip():
        print(run.stderr.strip(), file=sys.stderr)
    # printf writes an underflowed (unscaled) log-likelihood as -inf or nan, which JSON spells otherwise
    line = re.sub(r"(?<![A-Za-z])-?nan(?![A-Za-z])", "NaN", run.stdout.strip().splitlines()[-1])
    line = re.sub(r"(?<![A-Za-z])(-?)inf(?![A-Za-z])", r"\1Infinity", line)
    result = json.loads(line)
    for key in ("derivatives", "derivatives_rescaled"):
        if key in result:
            result[key] = result[key][:nodes]
    return result
