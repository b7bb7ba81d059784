"""Posterior checks: clock recovery, agreement with MrBayes.

Calibration from the prior (the coverage of NUTS's 90% intervals on data simulated from the prior) runs
for minutes: `validation/calibration.py`, its results in `validation/calibration_results.json`.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS, init_to_value

import jaxphylo as jp
from jaxphylo.inference import Analysis, prepare, ratios_to_heights, time_tree

from conftest import dataset, require

VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def load(name):
    spec = importlib.util.spec_from_file_location(name, VALIDATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_strict_clock_with_tip_dates_recovers_root_age_and_rate():
    """14 tips sampled over 30 years, root 60 years back, rate 5e-3 per year, 2000 sites."""
    rng = np.random.default_rng(7)
    taxa = [f"s{i}" for i in range(14)]
    topology = jp.random_topology_tree(taxa, seed=7).topology
    tips = rng.uniform(0, 30, len(taxa))
    tips[0] = 0.0
    time = time_tree(topology, tips)
    heights = ratios_to_heights(time, jnp.asarray(60.0 - time.anchors[-1]),
                                jnp.asarray(rng.uniform(0.3, 0.9, time.num_internal - 1)))
    durations = jp.inference.branch_durations(time, heights)
    rate, root = 5e-3, float(heights[-1])
    alignment = jp.simulate(jp.Tree(rate * durations, topology), jp.parse_model("HKY{4}+FQ"), 2000, seed=8)
    start_heights = ratios_to_heights(time, jnp.asarray(30.0), jnp.full(time.num_internal - 1, 0.5))
    start = jp.Tree(jp.inference.branch_durations(time, start_heights), topology)  # far from the truth
    prepared = prepare(alignment, start, Analysis("HKY+FQ", clock="strict"), tips)
    mcmc = MCMC(NUTS(prepared.model, init_strategy=init_to_value(values=prepared.init)), num_warmup=400,
                num_samples=600, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), prepared.data)
    draws = mcmc.get_samples()
    for name, truth in (("root_height", root), ("clock_rate", rate)):
        values = np.asarray(draws[name])
        low, high = np.quantile(values, [0.025, 0.975])
        assert low <= truth <= high, (name, truth, low, high)
        assert abs(np.median(values) / truth - 1) < 0.25, (name, truth, np.median(values))


def test_posterior_agrees_with_mrbayes(tmp_path):
    """Primates mtDNA, fixed BIONJ topology, HKY+G4, MrBayes's priors: posterior means of tree length,
    kappa and the Gamma shape within 3 combined Monte-Carlo standard errors."""
    folder = dataset("primates_mtDNA")
    require("mb")
    comparison = load("mrbayes_comparison")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tree = comparison.start_tree(alignment)
    mb, _ = comparison.run_mrbayes(alignment, tree, tmp_path, ngen=200_000)
    nuts, _, _ = comparison.run_nuts(alignment, tree, chains=2, warmup=400, samples=800)
    for name, row in comparison.compare(mb, nuts).items():
        assert abs(row["z"]) < 3, (name, row)
