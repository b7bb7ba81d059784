"""Tip dates as databases write them, and tip-date sampling: uniform interval priors recovered from the prior alone."""

import calendar
import datetime

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.integrate
import scipy.stats
from numpyro import handlers
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS, init_to_value
from numpyro.infer.util import initialize_model, log_density, potential_energy

import jaxphylo as jp
from conftest import six_dated_tips
from jaxphylo.inference import (
    Analysis, ConstantCoalescent, RatioTransform, branch_durations, node_anchors, prepare, ratios_to_heights,
    sample_tip_heights, time_tree,
)
from jaxphylo.inference.nuts import Draws, column_labels, tip_height_draws
from jaxphylo.inference.nuts import tracer_columns
from jaxphylo.tree import all_heights
from jaxphylo.io import TipDates, parse_date, read_tip_dates, tip_dates_from_names


def middle_of(year, month, day):
    """TreeTime's decimal year of a day: year + (day_of_year - 0.5) / days_in_year."""
    number = datetime.date(year, month, day).timetuple().tm_yday
    return year + (number - 0.5) / (366 if calendar.isleap(year) else 365)


@pytest.mark.parametrize("text, expected", [
    ("1999.5", (1999.5, 1999.5)),
    ("2004.0", (2004.0, 2004.0)),
    ("2004-07-12", (2004 + 193.5 / 366,) * 2),  # leap year: July 12 is day 194 of 366
    ("2003-07-12", (2003 + 192.5 / 365,) * 2),
    ("2004-02-29", (middle_of(2004, 2, 29),) * 2),
    ("2004-07", (2004 + 182 / 366, 2004 + 213 / 366)),  # July: days 183-213 of 2004
    ("2004-7", (2004 + 182 / 366, 2004 + 213 / 366)),
    ("2004", (2004.0, 2005.0)),
    ("NA", None), ("?", None), ("", None),
])
def test_each_date_form(text, expected):
    value = parse_date(text)
    assert value == expected if expected is None else value == pytest.approx(expected, abs=1e-12)


def test_an_interval_running_past_today_ends_today():
    today = datetime.date.today()
    low, high = parse_date(str(today.year))
    assert low == today.year and high == pytest.approx(middle_of(today.year, today.month, today.day), abs=1 / 365)


def test_dates_in_names():
    names = ["A/Brazil/x|2004-07-12", "seq_2004-07-12", "b@2004-07", "A/Brazil/1982", "x_1999.5", "y/2010.0",
             "unknown|?", "other_NA"]
    dates = tip_dates_from_names(names)
    got = dates.as_dict()
    assert got["A/Brazil/x|2004-07-12"] == got["seq_2004-07-12"] == pytest.approx((2004 + 193.5 / 366,) * 2)
    assert got["b@2004-07"] == pytest.approx((2004 + 182 / 366, 2004 + 213 / 366))
    assert got["A/Brazil/1982"] == (1982.0, 1983.0) and got["x_1999.5"] == (1999.5, 1999.5)
    assert got["y/2010.0"] == (2010.0, 2010.0)
    assert dates.undated == ("unknown|?", "other_NA") and not dates.exact
    with pytest.raises(jp.InputError, match="taxon 'plain' has no date"):
        tip_dates_from_names(["a_2001", "plain"])


def test_tsv_columns_in_any_order(tmp_path):
    path = tmp_path / "dates.tsv"
    path.write_text("country\tupper\tstrain\tlower\n"
                    "BR\t2004-07\ta\t2004-03-15\n"
                    "BR\t2001.5\tb\t2001\n"
                    "PE\tNA\tc\t?\n")
    dates = read_tip_dates(path).as_dict()
    assert dates["a"] == pytest.approx((middle_of(2004, 3, 15), 2004 + 213 / 366))
    assert dates["b"] == (2001.0, 2001.5) and dates["c"] is None
    path.write_text("name\tdate\nx\t2004-07-12\ny\t2004\nz\t1999.25\nw\t\n")
    dates = read_tip_dates(path)
    assert dates.as_dict()["y"] == (2004.0, 2005.0) and dates.as_dict()["z"] == (1999.25, 1999.25)
    assert dates.undated == ("w",)
    path.write_text("x\t2004.5\ny\t2004-07\n")  # the old form, no header
    assert read_tip_dates(path).as_dict()["x"] == (2004.5, 2004.5)
    path.write_text("taxon\tsampling time\nx\t2004.5\n")  # an unnamed header, as before
    assert read_tip_dates(path).taxa == ("x",)


@pytest.mark.parametrize("row, message", [
    ("b\t2004-13-01", "line 3: date '2004-13-01' of 'b' month 13 does not exist"),
    ("b\t2004-04-31", "line 3: date '2004-04-31' of 'b' April 2004 has 30 days"),
    ("b\t2003-02-29", "line 3: date '2003-02-29' of 'b' February 2003 has 28 days \\(not a leap year\\)"),
    (f"b\t{datetime.date.today().year + 1}-01-01", "line 3: date .* of 'b' is after today"),
    ("b\t12/07/2004", "line 3: date '12/07/2004' of 'b' is not a number, an ISO date"),
    ("a\t2001", "line 3: taxon 'a' has two dates"),
    ("b\t\t2006\t2004", "line 3: taxon 'b' has its lower bound 2006 after its upper bound 2005"),
    ("b\t\t2004\t", "line 3: taxon 'b' needs both a lower and an upper bound"),
    ("b\t2004\t2003\t2005", "line 3: taxon 'b' has both a date and lower/upper bounds"),
])
def test_bad_dates_name_the_file_line_and_taxon(tmp_path, row, message):
    path = tmp_path / "dates.tsv"
    path.write_text(f"taxon\tdate\tlower\tupper\na\t2001\t\t\n{row}\n")
    with pytest.raises(jp.InputError, match=f"{path}: {message}") as error:
        read_tip_dates(path)
    assert "\n" not in str(error.value)


def test_bad_dates_in_names_name_the_taxon():
    with pytest.raises(jp.InputError, match="taxon names: date '2004-13' of 'a\\|2004-13' month 13 does not exist"):
        tip_dates_from_names(["a|2004-13", "b|2004"])
    with pytest.raises(jp.InputError, match="'b_2001' appears twice"):
        tip_dates_from_names(["b_2001", "b_2001"])


def test_heights_reference_and_the_undated_default_range():
    dates = TipDates(("a", "b", "c"), (2000.0, 2010.0, 2014.0), (2000.0, 2010.0, 2015.0), ("d",))
    bounds = dates.heights(["d", "c", "b", "a"])
    assert bounds.reference == 2015.0  # the latest upper bound is height 0
    np.testing.assert_allclose(bounds.lower, [0.0, 0.0, 5.0, 15.0])
    np.testing.assert_allclose(bounds.upper, [30.0, 1.0, 5.0, 15.0])  # d: [2000 - 15, 2015]
    with pytest.raises(jp.InputError, match="'e' of the tree has no date"):
        dates.heights(["a", "b", "c", "d", "e"])
    with pytest.raises(jp.InputError, match="'d' has a date but is not in the tree"):
        dates.heights(["a", "b", "c"])
    exact = TipDates(("a", "b"), (2000.0, 2010.5), (2000.0, 2010.5))
    np.testing.assert_array_equal(exact.heights(["a", "b"]).lower, jp.io.tip_heights({"a": 2000.0, "b": 2010.5},
                                                                                     ["a", "b"]))


def sampled_tree(seed=2):
    """Seven tips, two sampled (one of them below a fixed sister), and heights consistent with them."""
    topology = jp.random_topology_tree([f"t{i}" for i in range(7)], seed=seed).topology
    low = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 4.0, 0.0])
    high = low.copy()
    high[[1, 4]] = [5.0, 6.0]
    return time_tree(topology, tip_bounds=np.stack([low, high]))


def test_anchors_follow_the_sampled_tips():
    time = sampled_tree()
    rng = np.random.default_rng(0)
    for _ in range(5):
        tips = time.tip_heights.copy()
        tips[time.free_tips] = rng.uniform(*time.free_bounds)
        np.testing.assert_array_equal(node_anchors(time, jnp.asarray(tips)), time_tree(time.topology, tips).anchors)


def test_joint_jacobian_is_the_tips_plus_the_ratio_transform():
    """(tip logits, x) -> (tips, heights) is block triangular: its log-determinant is the sum of the sites' terms."""
    time = sampled_tree()
    low, high = (jnp.asarray(b) for b in time.free_bounds)
    tip_map = dist.biject_to(dist.constraints.interval(low, high))
    k = len(time.free_tips)

    def joint(v):
        free = tip_map(v[:k])
        tips = jnp.asarray(time.tip_heights).at[time.free_tips].set(free)
        return jnp.concatenate([free, RatioTransform(time, tips)(v[k:])])

    v = jnp.asarray(np.random.default_rng(1).normal(size=k + time.num_internal))
    _, expected = jnp.linalg.slogdet(jax.jacfwd(joint)(v))
    free = tip_map(v[:k])
    tips = jnp.asarray(time.tip_heights).at[time.free_tips].set(free)
    heights = RatioTransform(time, tips)(v[k:])
    terms = jnp.sum(tip_map.log_abs_det_jacobian(v[:k], free)) + RatioTransform(time, tips).log_abs_det_jacobian(
        v[k:], heights)
    assert float(terms) == pytest.approx(float(expected), abs=1e-10)
    np.testing.assert_allclose(RatioTransform(time, tips).inv(heights), v[k:], rtol=1e-10, atol=1e-10)


def run_prior(model, init, seed, samples, args=()):
    """NUTS draws of `model(*args)`, one chain, a fixed seed."""
    mcmc = MCMC(NUTS(model, init_strategy=init_to_value(values=init)), num_warmup=500, num_samples=samples,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), *args)
    return {k: np.asarray(v) for k, v in mcmc.get_samples().items()}


def assert_ordered(time, tips, heights):
    h = np.concatenate([tips, heights], axis=-1)
    parent = time.topology.parent_array
    assert np.all(h[:, parent[:-1]] > h[:, :-1])


def assert_matches(values, cdf, mean):
    """KS against `cdf` (thinned by 3 against autocorrelation), and the mean within 3 MC standard errors."""
    assert scipy.stats.kstest(values[::3], cdf).pvalue > 0.01
    ess = float(effective_sample_size(values[None, :]))
    assert abs(values.mean() - mean) < 3 * values.std() / np.sqrt(ess)


def test_interval_prior_recovered_from_the_prior_of_the_dated_model(tmp_path):
    """`prepare`'s coalescent model, likelihood removed, population size fixed: the latest tip, dated only to
    the year 2015, is alone in its window (every other tip is older than 2011), so the coalescent's density
    of the node heights does not depend on its date and the date's marginal is exactly Uniform(2015, 2016)."""
    alignment, tree, dates = six_dated_tips(tmp_path, 50)
    prepared = prepare(alignment, tree, Analysis("JC", clock="strict"), dates)
    assert prepared.reference == 2016.0 and list(prepared.time.free_tips) == [0]
    prior = handlers.condition(handlers.block(prepared.model, hide=["alignment"]), {"population_size": 10.0})
    init = {k: v for k, v in prepared.init.items() if k != "population_size"}
    draws = run_prior(prior, init, 0, 3000, (prepared.data,))
    date = draws["tip_dates"][:, 0]
    np.testing.assert_allclose(date, 2016.0 - draws["tip_heights_free"][:, 0])
    assert_matches(date, scipy.stats.uniform(2015, 1).cdf, 2015.5)
    tips = tip_height_draws(Draws({k: v[None] for k, v in draws.items()}, {}), prepared.time)[0]
    assert_ordered(prepared.time, tips, draws["node_heights"])


def three_tip_marginal(theta, fixed, low, high):
    """Density of the sampled tip A's height in ((A, B), C) under the coalescent, A ~ Uniform(low, high) a priori,
    B and C at `fixed` heights: p(a) is proportional to the integral over the node heights of the coalescent density.
    Above the cherry's node two lineages coalesce at rate 1/theta, which integrates to one, so
    p(a) ~ int_(max(a, b))^inf exp(-int_0^h C(k(t), 2) dt / theta) / theta dh, k(t) the tips sampled by t."""
    def exponent(h, a):
        times = np.sort(np.concatenate([[a], fixed]))
        pieces = np.diff(np.clip(np.append(times, h), None, h))
        return np.sum(np.arange(1, 4) * np.arange(0, 3) / 2 * pieces) / theta

    def density(a):
        start = max(a, fixed[0])
        return scipy.integrate.quad(lambda h: np.exp(-exponent(h, a)) / theta, start, np.inf)[0]

    grid = np.linspace(low, high, 801)
    values = np.array([density(a) for a in grid])
    cdf = np.concatenate([[0.0], np.cumsum((values[1:] + values[:-1]) / 2 * np.diff(grid))])
    mean = np.trapezoid(grid * values, grid) / cdf[-1]
    return (lambda x: np.interp(x, grid, cdf / cdf[-1])), mean


def test_sampled_tip_below_its_sister_matches_numerical_integration():
    """A's interval [0, 2] straddles its sister B's fixed height 1, so its parent's anchor switches from B to A:
    NUTS on the coalescent prior must give the marginal computed by quadrature."""
    topology = jp.parse_newick("((A:1,B:1):1,C:1);").topology
    fixed = np.array([1.0, 0.5])  # B, C
    time = time_tree(topology, tip_bounds=np.array([[0.0, *fixed], [2.0, *fixed]]))

    def model():
        tips = sample_tip_heights(time, 2000.0)
        numpyro.sample("node_heights", ConstantCoalescent(time, 1.0, tip_heights=tips))

    init = {"tip_heights_free": jnp.array([1.5]), "node_heights": jnp.array([2.0, 3.0])}
    draws = run_prior(model, init, 1, 4000)
    cdf, mean = three_tip_marginal(1.0, fixed, 0.0, 2.0)
    assert_matches(draws["tip_heights_free"][:, 0], cdf, mean)
    tips = np.concatenate([draws["tip_heights_free"], np.broadcast_to(fixed, (len(draws["node_heights"]), 2))], 1)
    assert_ordered(time, tips, draws["node_heights"])
    np.testing.assert_allclose(draws["tip_dates"][:, 0], 2000.0 - draws["tip_heights_free"][:, 0])


def test_fixed_tip_dates_give_the_same_model_as_heights():
    taxa = [f"s{i}" for i in range(5)]
    topology = jp.random_topology_tree(taxa, seed=4).topology
    dates = np.array([2010.5, 2003.25, 2007.0, 2001.75, 2009.5])
    time = time_tree(topology, dates.max() - dates)
    heights = ratios_to_heights(time, jnp.asarray(8.0), jnp.full(time.num_internal - 1, 0.4))
    tree = jp.Tree(branch_durations(time, heights), topology)
    alignment = jp.simulate(jp.Tree(0.02 * tree.branch_lengths, topology), jp.parse_model("JC"), 40, seed=2)
    analysis = Analysis("JC", clock="strict")
    old = prepare(alignment, tree, analysis, dates.max() - dates)
    new = prepare(alignment, tree, analysis, TipDates(tuple(taxa), tuple(dates), tuple(dates)))
    assert not new.time.sampled and set(new.init) == set(old.init)
    for name, value in old.init.items():
        np.testing.assert_array_equal(new.init[name], value)
    params = dict(old.init)
    assert log_density(new.model, (new.data,), {}, params)[0] == log_density(old.model, (old.data,), {}, params)[0]


def test_gradient_with_every_tip_sampled():
    """Years only in the names (every tip an interval) and one undated tip: the potential's gradient against
    central differences, through the tip sites, the moving anchors and the coalescent."""
    years = np.array([2015, 2011, 2004, 2008, 1999, 2002])
    taxa = [f"s{i}|{y}" for i, y in enumerate(years)]
    taxa[3] = "s3|?"
    topology = jp.random_topology_tree(taxa, seed=6).topology
    time = time_tree(topology, years.max() - years)
    heights = ratios_to_heights(time, jnp.asarray(9.0), jnp.full(time.num_internal - 1, 0.5))
    tree = jp.Tree(branch_durations(time, heights), topology)
    alignment = jp.simulate(jp.Tree(0.02 * tree.branch_lengths, topology), jp.parse_model("JC"), 60, seed=3)
    prepared = prepare(alignment, tree, Analysis("JC", clock="strict"), tip_dates_from_names(tree.taxa))
    assert len(prepared.time.free_tips) == 6
    model, data = prepared.model, prepared.data
    info = initialize_model(jax.random.PRNGKey(0), model, model_args=(data,),
                            init_strategy=init_to_value(values=prepared.init))
    flat, unravel = jax.flatten_util.ravel_pytree(info.param_info.z)
    energy = lambda v: potential_energy(model, (data,), {}, unravel(v))
    grad = jax.grad(energy)(flat)
    for index in range(len(flat)):
        step = jnp.zeros_like(flat).at[index].set(1e-5)
        fd = (energy(flat + step) - energy(flat - step)) / 2e-5
        assert float(grad[index]) == pytest.approx(float(fd), rel=1e-5, abs=1e-5)


def test_output_columns_name_the_sampled_taxa():
    time = sampled_tree()
    labels = column_labels(time)
    assert labels == {"tip_dates": ["date_t1", "date_t4"]}
    draws = Draws({"tip_dates": np.array([[[2001.0, 2002.0]]]), "tip_heights_free": np.array([[[2.0, 3.0]]]),
                   "node_heights": np.zeros((1, 1, time.num_internal))}, {})
    assert [name for name, _ in tracer_columns(draws.samples, labels)] == ["date_t1", "date_t4", "node_heights.1",
                                                                     "node_heights.2", "node_heights.3",
                                                                     "node_heights.4", "node_heights.5",
                                                                     "node_heights.6"]
    tips = tip_height_draws(draws, time)[0, 0]
    assert tips[1] == 2.0 and tips[4] == 3.0 and tips[2] == 2.0
    np.testing.assert_array_equal(all_heights(time, jnp.zeros(time.num_internal), tips)[:7], tips)
