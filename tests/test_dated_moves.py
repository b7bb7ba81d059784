"""validation/dated/moves.py, the measure of what each dated move does: its per-move counts against a recount on
the host, and its driver against `dated_mcmc`'s chains."""

import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import dated_simulation
from jaxphylo.inference.dated import DATED_MOVES, DatedSettings, clade_masks, dated_mcmc, dated_start

DATED = Path(__file__).resolve().parents[1] / "validation" / "dated"


@pytest.fixture(scope="module")
def moves():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(DATED))  # moves.py imports run_jaxphylo.py beside it
        spec = importlib.util.spec_from_file_location("dated_moves", DATED / "moves.py")
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "dated_moves", module)  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def weak_data(num_sites: int = 60, seed: int = 3):
    """Eight tips over 20 years and a short JC alignment: the topology is loosely resolved, so every tree move is
    accepted now and then. Returns `(alignment, tip heights)`."""
    alignment, _, tips, _ = dated_simulation(8, 40.0, 5e-3, num_sites, seed)
    return alignment, tips


def clades(parents, heights) -> set:
    n = (len(parents) + 1) // 2
    return set(clade_masks(parents, heights)[n:])


def test_move_effects_count_what_each_generation_did(moves):
    """One generation per call for every chain: the proposal counted is the move drawn, a topology change is
    counted exactly when the host's clade sets before and after differ, the root shift is the change of the
    root height; node-height, root-height and HMC moves never change the topology, an accepted narrow exchange
    always does."""
    alignment, tips = weak_data()
    settings = DatedSettings(chains=4, generations=1, sample_every=1, block=1,
                             moves={name: 1.0 for name in DATED_MOVES})
    posterior, state, _ = dated_start(alignment, "JC", tips, settings=settings, seed=2)
    codes = moves.tip_codes(8)
    carry, key = (state, moves.MoveEffects.start(state.chains.position, codes)), jax.random.PRNGKey(2)
    before = (np.asarray(state.chains.position.parents), np.asarray(state.chains.position.heights))
    for _ in range(600):
        effects = jax.tree.map(np.asarray, carry[1])
        carry, key, (parents, heights) = moves.measured_block(carry, key, posterior, settings.program(), codes,
                                                              np.int32(1), np.int32(0))
        after = (np.asarray(parents[0]), np.asarray(heights[0]))
        change = jax.tree.map(lambda new, old: np.asarray(new) - old, carry[1], effects)
        assert np.all(change.proposed.sum(1) == 1)
        changed = [clades(p, h) != clades(q, g) for p, h, q, g in zip(*before, *after)]
        np.testing.assert_array_equal(change.reshaped.sum(1), changed)
        np.testing.assert_allclose(change.root_shift.sum(1), np.abs(after[1].max(1) - before[1].max(1)))
        before = after
    table = moves.per_move(jax.tree.map(np.asarray, carry[1]), {})
    assert all(table[name]["topology_changes"] == 0 for name in ("node_height", "root_height", "hmc"))
    assert table["narrow_exchange"]["topology_changed_share"] == 1.0
    assert all(table[name]["topology_changes"] > 0 for name in DATED_MOVES[:4])


@pytest.mark.parametrize("heats", [1, 3])
def test_the_measuring_driver_follows_dated_mcmc(moves, heats):
    """From `dated_start` with `dated_mcmc`'s seed, `sample` (tuning, blocks of its own) keeps the same trees, its
    moves counted for the chains that were cold when they moved (one per run and generation)."""
    alignment, tips = weak_data()
    settings = DatedSettings(chains=2, heats=heats, generations=200, sample_every=10, block=4, tune=50)
    result = dated_mcmc(alignment, "HKY+G4", tips, settings=settings, seed=4)
    posterior, state, _ = dated_start(alignment, "HKY+G4", tips, settings=settings, seed=4)
    done = moves.sample(posterior, state, settings, 4, 50, np.inf)
    for c in range(2):
        for i, (parents, heights, _) in enumerate(result.samples.trees[c]):
            np.testing.assert_array_equal(done["parents"][i, c], parents)
            np.testing.assert_array_equal(done["heights"][i, c], heights)
    assert done["generations"] == 200 and done["effects"].proposed.sum() == 2 * 150
