#!/usr/bin/env python3
"""The exponential-growth coalescent as a distribution on time trees, three ways, prior only.

Four tips sampled through time (heights 0, 0.5, 1.0, 0.2), `N(t) = N0 exp(-g t)` with N0 and g fixed, the
topology free. Rooted-topology frequencies and the root height's mean, sd and quartiles from:

* direct simulation backwards in time (time rescaling: with `k` lineages from `t`, the next coalescence is at
  `Lambda^-1(Lambda(t) + E / C(k, 2))`, `Lambda(t) = (e^(g t) - 1) / (g N0)`, `E ~ Exp(1)`, unless a tip is
  sampled first), independent of both samplers; with g < 0 a draw whose last lineages never meet is dropped
  (the density of finite trees is defective there, in BEAST and here alike: the fraction is reported);
* jaxphylo's free-topology sampler (`DatedPosterior` with `prior_only`, N0 and g held in `fixed`), BEAST's
  tree moves and HMC;
* BEAST 1.10.4 (`beast-mcmc`, if installed): `exponentialGrowth` with fixed popSize and growthRate in a
  `coalescentLikelihood`, no data, BEAST's default tree operators.

    PYTHONPATH=. python validation/exponential_coalescent/compare.py   # writes results.json next to it
"""

from __future__ import annotations

import collections
import json
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxphylo as jp
from jaxphylo.inference.dated import DatedPosterior, DatedSettings, clade_masks, init, run_block
from jaxphylo.models import ModelCoordinates

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent
TIPS = np.array([0.0, 0.5, 1.0, 0.2])
TAXA = [f"t{i}" for i in range(len(TIPS))]
SETTINGS = [(1.0, 1.5), (0.25, -0.3)]  # (N0, g): growing towards the present; shrinking
DRAWS = 40_000


def simulate(n0, g, draws, seed=0):
    """Rooted topologies (frozensets of non-root clades, as taxon-name frozensets) and root heights."""
    rng = np.random.default_rng(seed)
    big = lambda t: (math.expm1(g * t) / g if g else t) / n0  # noqa: E731  Lambda(t)
    inverse = lambda y: (math.log1p(g * n0 * y) / g if g else n0 * y)  # noqa: E731  (inf when it never comes)
    counts, roots, lost = collections.Counter(), [], 0
    order = list(np.argsort(TIPS))
    while len(roots) < draws:
        pending, lineages, clades, t = list(order), [], [], 0.0
        while True:
            while pending and TIPS[pending[0]] <= t:
                lineages.append(frozenset([TAXA[pending.pop(0)]]))
            k = len(lineages)
            if k == 1 and not pending:
                break
            target = big(t) + rng.exponential() / (k * (k - 1) / 2) if k > 1 else np.inf
            nxt = inverse(target) if (k > 1 and 1 + g * n0 * target > 0) else np.inf
            if pending and nxt >= TIPS[pending[0]]:
                t = TIPS[pending[0]]
                continue
            if not np.isfinite(nxt):
                break
            t = nxt
            i, j = rng.choice(k, 2, replace=False)
            clades.append(lineages[i] | lineages[j])
            lineages = [x for q, x in enumerate(lineages) if q not in (i, j)] + [clades[-1]]
        if len(lineages) > 1 or pending:
            lost += 1
            continue
        counts[frozenset(clades[:-1])] += 1
        roots.append(t)
    return {k: v / draws for k, v in counts.items()}, np.asarray(roots), lost / (draws + lost)


def ours(n0, g, chains=8, generations=240_000):
    n, m = len(TIPS), 2 * len(TIPS) - 1
    settings = DatedSettings(chains=chains, generations=generations, sample_every=generations // 3000, block=3000,
                             tune=3000)
    posterior = DatedPosterior(None, ModelCoordinates(jp.parse_model("JC"), frozenset()), jnp.asarray(TIPS),
                               jnp.zeros(0, jnp.int32), jnp.zeros((2, 0)), (), jnp.float64, n, "none", "exponential",
                               prior_only=True, fixed=(("log_population_size", math.log(n0)), ("growth_rate", g)))
    parents = np.array([4, 4, 5, 6, 5, 6, -1])
    heights = np.array([*TIPS, 1.3, 1.8, 2.5])
    began = time.perf_counter()
    state = init(np.tile(parents, (chains, 1)), np.tile(heights, (chains, 1)), {}, posterior)
    _, _, samples = run_block(state, jax.random.PRNGKey(1), posterior, settings, np.int32(3000),
                              np.int32(settings.tune_generations))
    jax.block_until_ready(samples.heights)
    seconds = time.perf_counter() - began
    kept = slice(300, None)
    p = np.asarray(samples.parents)[kept].reshape(-1, m)
    h = np.asarray(samples.heights)[kept].reshape(-1, m)
    everyone = (1 << n) - 1
    found = collections.Counter(
        frozenset(frozenset(TAXA[b] for b in range(n) if c >> b & 1) for c in set(clade_masks(pp, hh)[n:]) - {everyone})
        for pp, hh in zip(p, h))
    total = sum(found.values())
    return {k: v / total for k, v in found.items()}, h.max(-1), seconds


def beast_xml(n0, g, states, every, prefix):
    dates = "\n".join(f'    <taxon id="{t}"><date value="{10.0 - float(h)!r}" direction="forwards" units="years"/></taxon>'
                      for t, h in zip(TAXA, TIPS))
    return f"""<?xml version="1.0" standalone="yes"?>
<beast version="1.10.4">
  <taxa id="taxa">
{dates}
  </taxa>
  <constantSize id="initialDemo" units="years"><populationSize><parameter id="initialDemo.popSize" value="1.0"/>
  </populationSize></constantSize>
  <coalescentSimulator id="startingTree"><taxa idref="taxa"/><constantSize idref="initialDemo"/></coalescentSimulator>
  <treeModel id="treeModel">
    <coalescentTree idref="startingTree"/>
    <rootHeight><parameter id="treeModel.rootHeight"/></rootHeight>
    <nodeHeights internalNodes="true"><parameter id="treeModel.internalNodeHeights"/></nodeHeights>
    <nodeHeights internalNodes="true" rootNode="true"><parameter id="treeModel.allInternalNodeHeights"/></nodeHeights>
  </treeModel>
  <exponentialGrowth id="exponential" units="years">
    <populationSize><parameter id="exponential.popSize" value="{n0!r}"/></populationSize>
    <growthRate><parameter id="exponential.growthRate" value="{g!r}"/></growthRate>
  </exponentialGrowth>
  <coalescentLikelihood id="coalescent">
    <model><exponentialGrowth idref="exponential"/></model>
    <populationTree><treeModel idref="treeModel"/></populationTree>
  </coalescentLikelihood>
  <operators id="operators" optimizationSchedule="log">
    <subtreeSlide size="1.0" gaussian="true" weight="15"><treeModel idref="treeModel"/></subtreeSlide>
    <narrowExchange weight="15"><treeModel idref="treeModel"/></narrowExchange>
    <wideExchange weight="3"><treeModel idref="treeModel"/></wideExchange>
    <wilsonBalding weight="3"><treeModel idref="treeModel"/></wilsonBalding>
    <scaleOperator scaleFactor="0.75" weight="3"><parameter idref="treeModel.rootHeight"/></scaleOperator>
    <uniformOperator weight="30"><parameter idref="treeModel.internalNodeHeights"/></uniformOperator>
  </operators>
  <mcmc id="mcmc" chainLength="{states}" autoOptimize="true">
    <posterior id="posterior"><prior id="prior"><coalescentLikelihood idref="coalescent"/></prior></posterior>
    <operators idref="operators"/>
    <log id="fileLog" logEvery="{every}" fileName="{prefix}.log" overwrite="true">
      <posterior idref="posterior"/><parameter idref="treeModel.rootHeight"/>
    </log>
    <logTree id="treeFileLog" logEvery="{every}" nexusFormat="true" fileName="{prefix}.trees">
      <treeModel idref="treeModel"/>
    </logTree>
  </mcmc>
</beast>
"""


def beast(n0, g, states=4_000_000, every=200):
    import dendropy

    if shutil.which("beast-mcmc") is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "prior.xml").write_text(beast_xml(n0, g, states, every, "prior"))
        began = time.perf_counter()
        done = subprocess.run(["beast-mcmc", "-overwrite", "-seed", "7", "prior.xml"], cwd=folder,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:] + done.stdout[-2000:])
        rows = [line.split("\t") for line in (Path(folder) / "prior.log").read_text().splitlines()
                if line and not line.startswith("#")]
        column = rows[0].index("treeModel.rootHeight")
        roots = np.array([float(r[column]) for r in rows[1:]])
        trees = dendropy.TreeList.get(path=str(Path(folder) / "prior.trees"), schema="nexus", rooting="force-rooted")
    burn = len(roots) // 10
    counts = collections.Counter()
    for tree in trees[burn:]:
        clades = frozenset(frozenset(leaf.taxon.label for leaf in node.leaf_iter())
                           for node in tree.preorder_internal_node_iter() if node is not tree.seed_node)
        counts[clades] += 1
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}, roots[burn:], seconds


def describe(freqs, roots, reference):
    worst = max(abs(freqs.get(k, 0.0) - f) for k, f in reference.items())
    q = np.quantile(roots, [0.25, 0.5, 0.75])
    return {"largest topology difference from simulation": round(float(worst), 4),
            "root mean": round(float(roots.mean()), 4), "root sd": round(float(roots.std()), 4),
            "root quartiles": [round(float(x), 4) for x in q], "samples": int(len(roots))}


def main():
    results = {"tips": TIPS.tolist(), "jax": jax.__version__, "machine": platform.processor() or platform.machine(),
               "note": "2-core CPU shared with other sessions: seconds are disturbed", "settings": []}
    for n0, g in SETTINGS:
        expected, roots, lost = simulate(n0, g, DRAWS)
        row = {"N0": n0, "g": g, "simulation": describe(expected, roots, expected) | {"dropped": round(lost, 5)}}
        freqs, r, seconds = ours(n0, g)
        row["jaxphylo"] = describe(freqs, r, expected) | {"seconds": round(seconds, 1)}
        found = beast(n0, g)
        if found is not None:
            row["beast 1.10.4"] = describe(found[0], found[1], expected) | {"seconds": round(found[2], 1)}
        results["settings"].append(row)
        print(json.dumps(row, indent=1), flush=True)
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
