"""Tree priors outbreak analyses use: the exponential-growth coalescent (BEAST's parameterisation) and the
skygrid with its precision fixed; their densities, gradients, NumPyro sites and command line."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
import scipy.integrate
from numpyro import handlers
from numpyro.infer.util import log_density

import jaxphylo as jp
from conftest import six_dated_tips
from jaxphylo.inference import Analysis, prepare, ratios_to_heights, time_tree
from jaxphylo.inference.priors import (
    ConstantCoalescent, ExponentialCoalescent, coalescent_times_log_density, exponential_coalescent_times_log_density,
)
from jaxphylo.tree import all_heights

RSV2 = "/work/shared/data/rsv2"


def serial_tree(num_tips=7, seed=2):
    """A rooted tree with tips sampled through time (the latest at 0) and consistent node heights."""
    rng = np.random.default_rng(seed)
    topology = jp.random_topology_tree([f"t{i}" for i in range(num_tips)], seed=seed).topology
    tips = rng.uniform(0, 2, num_tips)
    tips[0] = 0.0
    time = time_tree(topology, tips)
    heights = ratios_to_heights(time, jnp.asarray(1.2), jnp.asarray(rng.uniform(0.2, 0.8, time.num_internal - 1)))
    return time, heights


def quad_exponential_coalescent(tip_heights, heights, n0, g):
    """The same density by walking the events one at a time and integrating `C(k, 2) / N(t)` with quad."""
    size = lambda t: n0 * math.exp(-g * t)  # noqa: E731
    events = sorted([(float(t), +1) for t in tip_heights] + [(float(h), -1) for h in heights])
    log_p, lineages = 0.0, 0
    for (t, change), (t_next, _) in zip(events, events[1:] + [(None, None)]):
        lineages += change
        if change < 0:
            log_p -= math.log(size(t))
        if t_next is not None and lineages > 1:
            pairs = lineages * (lineages - 1) / 2
            log_p -= scipy.integrate.quad(lambda s, c: c / size(s), t, t_next, (pairs,), epsabs=1e-14, epsrel=1e-13)[0]
    return log_p


def test_exponential_growth_at_zero_is_the_constant_coalescent():
    """g = 0 is the constant coalescent exactly, and the density is continuous there: (e^x - 1) / x is
    computed without the cancellation near 0 (g = 1e-10 changes the density by about 1e-9, its true slope
    times g, not by rounding)."""
    time, heights = serial_tree()
    constant = float(ConstantCoalescent(time, 0.7).log_prob(heights))
    assert float(ExponentialCoalescent(time, 0.7, 0.0).log_prob(heights)) == pytest.approx(constant, rel=1e-14)
    near = float(ExponentialCoalescent(time, 0.7, 1e-10).log_prob(heights))
    assert abs(near - constant) < 1e-8
    slope = jax.grad(lambda g: ExponentialCoalescent(time, 0.7, g).log_prob(heights))(0.0)
    assert near - constant == pytest.approx(float(slope) * 1e-10, rel=1e-4)


@pytest.mark.parametrize("n0, g", [(0.7, 0.9), (1.5, -0.4), (0.3, 3.0), (0.8, 2e-5)])
def test_exponential_growth_against_numerical_integration(n0, g):
    """Serially sampled tips; g = 2e-5 is inside the Taylor branch of (e^x - 1) / x. Tolerance 1e-9 relative:
    quad's error is below 1e-13 per interval."""
    time, heights = serial_tree()
    expected = quad_exponential_coalescent(time.tip_heights, np.asarray(heights), n0, g)
    assert float(ExponentialCoalescent(time, n0, g).log_prob(heights)) == pytest.approx(expected, rel=1e-9)


def test_exponential_growth_by_hand():
    """Two tips at heights 0 and 1, the root at 3, N(t) = 2 e^(-t/2): one pair from t = 1 to 3, so
    log p = -log N(3) - integral_1^3 e^(t/2) / 2 dt = -(log 2 - 3/2) - (e^(3/2) - e^(1/2))."""
    time = time_tree(jp.parse_newick("(a:3,b:2);").topology, np.array([0.0, 1.0]))
    expected = -(math.log(2.0) - 1.5) - (math.exp(1.5) - math.exp(0.5))
    assert float(ExponentialCoalescent(time, 2.0, 0.5).log_prob(jnp.array([3.0]))) == pytest.approx(expected,
                                                                                                     rel=1e-14)


@pytest.mark.parametrize("g", [0.0, 0.8, -0.6])
def test_exponential_growth_gradient_against_finite_differences(g):
    """d log p / d(every node and tip height, log N0, g) against central differences (step 1e-6, float64):
    truncation ~1e-12 and rounding ~1e-9, so 1e-6 absolute is safe; g = 0 checks the Taylor branch's."""
    time, heights = serial_tree()
    nodes = all_heights(time, heights)
    n = time.num_tips

    def f(x):
        return exponential_coalescent_times_log_density(x[:-2], n, x[-2], x[-1])

    x = jnp.concatenate([nodes, jnp.array([math.log(0.9), g])])
    grad = np.asarray(jax.grad(f)(x))
    step = 1e-6
    for i in range(x.shape[0]):
        e = jnp.zeros_like(x).at[i].set(step)
        fd = (float(f(x + e)) - float(f(x - e))) / (2 * step)
        assert grad[i] == pytest.approx(fd, abs=1e-6), i
    # at g = 0 the value is the constant coalescent's, whatever the order of its events
    if g == 0.0:
        assert float(f(x)) == pytest.approx(float(coalescent_times_log_density(nodes, n, jnp.log(0.9)[None])),
                                            rel=1e-14)


def dated_analysis(tmp_path, analysis):
    """`prepare`'s model for six dated tips (one dated only to a year, so a tip height is sampled too)."""
    alignment, tree, dates = six_dated_tips(tmp_path, 40)
    return prepare(alignment, tree, analysis, dates)


def prior_of(prepared):
    """The model without its likelihood (the same in both models compared)."""
    return handlers.block(prepared.model, hide=["alignment"])


def test_skygrid_with_a_fixed_precision(tmp_path):
    """With `skygrid_precision=X` the precision is no site, and the model's log density is the sampled
    skygrid's at precision X less the precision's Gamma(0.001, 0.001) term."""
    sampled = dated_analysis(tmp_path, Analysis("JC", clock="strict", tree_prior="skygrid", skygrid_intervals=4))
    fixed = dated_analysis(tmp_path, Analysis("JC", clock="strict", tree_prior="skygrid", skygrid_intervals=4,
                                              skygrid_precision=3.0))
    trace = handlers.trace(handlers.seed(handlers.substitute(fixed.model, fixed.init), 0)).get_trace(fixed.data)
    assert "skygrid_precision" not in trace and "skygrid_precision" not in fixed.init
    assert "skygrid_precision" in sampled.init
    params = dict(fixed.init, skygrid_first=jnp.asarray(0.3), skygrid_steps=jnp.array([0.5, -1.0, 0.2]))
    value, _ = log_density(prior_of(fixed), (fixed.data,), {}, params)
    full, _ = log_density(prior_of(sampled), (sampled.data,), {}, dict(params, skygrid_precision=jnp.asarray(3.0)))
    gamma = float(dist.Gamma(0.001, 0.001).log_prob(3.0))
    assert float(value) == pytest.approx(float(full) - gamma, rel=1e-12)
    with pytest.raises(jp.JaxphyloError, match="skygrid"):
        Analysis("JC", clock="strict", skygrid_precision=3.0)
    with pytest.raises(jp.JaxphyloError, match="positive"):
        Analysis("JC", clock="strict", tree_prior="skygrid", skygrid_precision=0.0)


def test_exponential_model_sites_and_priors(tmp_path):
    """`tree_prior="exponential"` with a clock: sites `population_size` (1/x) and `growth_rate`
    (Laplace(0, scale)); at g = 0 its log density is the constant coalescent model's plus the Laplace's
    log density at 0, `-log(2 scale)`."""
    growth = dated_analysis(tmp_path, Analysis("JC", clock="strict", tree_prior="exponential", growth_rate_scale=2.5))
    constant = dated_analysis(tmp_path, Analysis("JC", clock="strict"))
    assert growth.init["growth_rate"] == 0.0 and "population_size" in growth.init
    value, _ = log_density(prior_of(growth), (growth.data,), {}, growth.init)
    reference, _ = log_density(prior_of(constant), (constant.data,), {}, constant.init)
    assert float(value) == pytest.approx(float(reference) - math.log(5.0), rel=1e-12)
    # unrooted, "exponential" stays the branch-length prior
    assert Analysis("JC", tree_prior="exponential").resolved_tree_prior == "exponential"


@pytest.fixture(scope="module")
def rsv2_subset(tmp_path_factory):
    """Ten rsv2 taxa, their first 300 sites and year dates (so every tip height is sampled), and a start tree."""
    folder = tmp_path_factory.mktemp("rsv2")
    alignment = jp.read_alignment(f"{RSV2}/alignment.fasta")
    taxa = alignment.taxa[:10]
    (folder / "aln.fasta").write_text("".join(f">{t}\n{s[:300]}\n" for t, s in zip(taxa, alignment.sequences)))
    with open(f"{RSV2}/dates.tsv") as handle:
        rows = handle.read().splitlines()
    keep = [rows[0]] + [row for row in rows[1:] if row.split("\t")[0] in taxa]
    (folder / "dates.tsv").write_text("\n".join(keep) + "\n")
    jp.write_tree(jp.random_topology_tree(taxa, seed=3, mean_branch_length=5.0), folder / "start.nwk")
    return folder


def test_sample_with_the_exponential_growth_coalescent(rsv2_subset, tmp_path, capsys):
    """`jaxphylo sample ALN TREE --clock strict --dates D --tree-prior exponential`: a short NUTS run whose
    Tracer log has the N0 (`population_size`) and `growth_rate` columns."""
    from jaxphylo import cli

    out = tmp_path / "run"
    assert cli.main(["sample", str(rsv2_subset / "aln.fasta"), str(rsv2_subset / "start.nwk"), "--clock", "strict",
                     "--dates", str(rsv2_subset / "dates.tsv"), "--tree-prior", "exponential", "-m", "JC",
                     "--chains", "1", "--warmup", "5", "--samples", "5", "--block", "5", "--out", str(out),
                     "--no-progress"]) == 0
    rows = [line.split("\t") for line in (out / "chain1.log").read_text().splitlines()]
    size, growth = rows[0].index("population_size"), rows[0].index("growth_rate")
    assert len(rows) == 6 and all(float(row[size]) > 0 and math.isfinite(float(row[growth])) for row in rows[1:])
    assert "growth_rate" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--clock", "strict", "--skygrid-precision", "2"], "--tree-prior skygrid"),
    (["--skygrid-precision", "2"], "--tree-prior skygrid"),
    (["--clock", "strict", "--tree-prior", "skygrid", "--skygrid-precision", "0"], "must be positive"),
    (["--clock", "strict", "--tree-prior", "skygrid", "--skygrid-precision", "-1"], "must be positive"),
    (["--clock", "strict", "--tree-prior", "exponential", "--growth-rate-scale", "0"], "must be positive"),
])
def test_tree_prior_options_are_checked_in_one_line(rsv2_subset, tmp_path, capsys, extra, message):
    from jaxphylo import cli

    assert cli.main(["sample", str(rsv2_subset / "aln.fasta"), str(rsv2_subset / "start.nwk"), *extra,
                     "--out", str(tmp_path / "bad"), "--dry-run"]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error and "Traceback" not in error


def test_free_topology_tree_priors():
    """The free-topology sampler's tree prior (its coordinates: log N0 flat, g with its Laplace) is the library
    density plus the hyperparameters' priors; a fixed skygrid precision drops the Gamma term and reads the
    precision from `fixed`."""
    from jaxphylo.inference.dated import DatedPosterior
    from jaxphylo.models import ModelCoordinates

    time, heights = serial_tree()
    nodes = all_heights(time, heights)
    n = time.num_tips

    def posterior(tree_prior, **extra):
        return DatedPosterior(None, ModelCoordinates(jp.parse_model("JC"), frozenset()), jnp.asarray(time.tip_heights),
                              jnp.zeros(0, jnp.int32), jnp.zeros((2, 0)), (), jnp.float64, n, "strict", tree_prior,
                              prior_only=True, **extra)

    params = {"log_population_size": jnp.asarray(math.log(0.8)), "growth_rate": jnp.asarray(-0.7)}
    value = posterior("exponential", growth_rate_scale=2.0)._tree_prior(nodes, params)
    expected = (float(ExponentialCoalescent(time, 0.8, -0.7).log_prob(heights))
                + float(dist.Laplace(0.0, 2.0).log_prob(-0.7)))
    assert float(value) == pytest.approx(expected, rel=1e-12)
    grid = (0.5, 1.0, 1.5)
    skygrid = {"skygrid_first": jnp.asarray(0.1), "skygrid_steps": jnp.array([0.3, -0.2, 0.5])}
    sampled = posterior("skygrid", grid=grid)._tree_prior(nodes, dict(skygrid, log_skygrid_precision=jnp.log(4.0)))
    fixed = posterior("skygrid", grid=grid, fixed=(("log_skygrid_precision", math.log(4.0)),))._tree_prior(nodes,
                                                                                                           skygrid)
    gamma_in_log = float(dist.Gamma(0.001, 0.001).log_prob(4.0)) + math.log(4.0)  # with its log Jacobian
    assert float(fixed) == pytest.approx(float(sampled) - gamma_in_log, rel=1e-12)


def test_sample_free_topology_with_exponential_growth(rsv2_subset, tmp_path):
    """`--topology free --tree-prior exponential` logs BEAST's `exponential.popSize` and
    `exponential.growthRate`; with the skygrid's precision fixed, no precision column."""
    from jaxphylo import cli
    from jaxphylo.inference.dated import column_names
    from jaxphylo.models import ModelCoordinates

    common = [str(rsv2_subset / "aln.fasta"), "--clock", "strict", "--dates", str(rsv2_subset / "dates.tsv"),
              "-m", "JC", "--chains", "1", "--warmup", "2", "--samples", "4", "--sample-every", "5", "--no-progress"]
    assert cli.main(["sample", *common, "--tree-prior", "exponential", "--out", str(tmp_path / "exp")]) == 0
    rows = [line.split("\t") for line in (tmp_path / "exp" / "chain1.log").read_text().splitlines()]
    size, growth = rows[0].index("exponential.popSize"), rows[0].index("exponential.growthRate")
    assert len(rows) == 7 and all(float(row[size]) > 0 and math.isfinite(float(row[growth])) for row in rows[1:])
    coordinates = ModelCoordinates(jp.parse_model("JC"), frozenset())
    names = column_names("strict", "skygrid", 3, coordinates, True, precision_fixed=True)
    assert "skygrid.logPopSize3" in names and "skygrid.precision" not in names


def test_sample_free_topology_move_weights(rsv2_subset, tmp_path, capsys):
    """`--move-weights` changes the defaults' weights: a move weighted 0 is never proposed; a malformed item or an
    unknown move is a one-line error."""
    from jaxphylo import cli

    common = [str(rsv2_subset / "aln.fasta"), "--clock", "strict", "--dates", str(rsv2_subset / "dates.tsv"),
              "-m", "JC", "--chains", "1", "--warmup", "2", "--samples", "4", "--sample-every", "5", "--no-progress"]
    assert cli.main(["sample", *common, "--move-weights", "wide_exchange=0, wilson_balding=0,hmc=6",
                     "--out", str(tmp_path / "run")]) == 0
    acceptance = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("# acceptance"))
    assert "narrow_exchange" in acceptance and "wide_exchange" not in acceptance and "wilson_balding" not in acceptance
    for bad, message in (("hmc:6", "expected NAME=WEIGHT, got 'hmc:6'"), ("hmc=x", "got 'hmc=x'"),
                         ("spr=1", "unknown move 'spr'")):
        assert cli.main(["sample", *common, "--move-weights", bad, "--out", str(tmp_path / "bad")]) != 0
        assert message in capsys.readouterr().err
