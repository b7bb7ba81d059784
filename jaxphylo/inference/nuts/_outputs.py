"""What a run leaves behind: ArviZ data, Tracer logs, NEXUS trees, a summary table and a plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpyro.diagnostics import hpdi, summary as numpyro_summary

from ...tree import TimeTree, Topology
from ...io import newick_string, nexus_trees_header
from ._runner import Draws

# standard-normal auxiliaries of non-centred parameterisations; sampled tip heights (their dates are logged)
HIDDEN = ("rate_z", "skygrid_steps", "tip_heights_free")


def column_labels(time: TimeTree | None) -> dict[str, list[str]]:
    """Names for the entries of vector sites: `tip_dates` entries become `date_<taxon>`."""
    if time is None or not time.sampled:
        return {}
    return {"tip_dates": [f"date_{time.topology.taxa[tip]}" for tip in time.free_tips]}


def tracer_columns(samples: dict, labels: dict | None = None) -> list[tuple[str, np.ndarray]]:
    """Scalar columns `[chains, draws]`: vectors become `name.1`, `name.2`, ... (Tracer's convention),
    or the names `labels[name]` gives."""
    columns = []
    for name, values in samples.items():
        if name in HIDDEN:
            continue
        if values.ndim == 2:
            columns.append((name, values))
        else:
            flat = values.reshape(values.shape[:2] + (-1,))
            names = (labels or {}).get(name) or [f"{name}.{i + 1}" for i in range(flat.shape[-1])]
            columns += [(names[i], flat[..., i]) for i in range(flat.shape[-1])]
    return columns


def write_tracer_logs(out: Path, draws: Draws, labels: dict | None = None) -> list[Path]:
    """One tab-separated log per chain, as BEAST writes them: Tracer opens them as they are."""
    columns = [("posterior", draws.stats["posterior"]), ("likelihood", draws.stats["likelihood"]),
               ("prior", draws.stats["prior"])] + tracer_columns(draws.samples, labels)
    paths = []
    for chain in range(draws.num_draws and columns[0][1].shape[0]):
        path = out / f"chain{chain + 1}.log"
        table = np.column_stack([np.arange(draws.num_draws)] + [v[chain] for _, v in columns])
        header = "state\t" + "\t".join(name for name, _ in columns)
        np.savetxt(path, table, delimiter="\t", header=header, comments="", fmt=["%d"] + ["%.10g"] * len(columns))
        paths.append(path)
    return paths


def write_trees(out: Path, draws: Draws, topology: Topology, time: TimeTree | None) -> list[Path]:
    """A NEXUS trees file per chain. Time trees carry branch lengths in time and `[&rate=...]`
    on every branch (FigTree and TreeAnnotator read both); unrooted trees carry substitutions."""
    paths = []
    chains = draws.stats["posterior"].shape[0]
    rooted = "[&R]" if time is not None else "[&U]"
    tips = None if time is None else tip_height_draws(draws, time)
    for chain in range(chains):
        lines = [nexus_trees_header(topology.taxa).rstrip("\n")]
        for draw in range(draws.num_draws):
            lengths, notes = _branch_values(draws, chain, draw, topology, None if tips is None else tips[chain, draw])
            lines.append(f"tree STATE_{draw} = {rooted} {newick_string(topology, lengths, notes)}")
        lines.append("End;")
        path = out / f"chain{chain + 1}.trees"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def tip_height_draws(draws: Draws, time: TimeTree) -> np.ndarray:
    """Tip heights `[chains, draws, tips]`: the fixed ones, and the sampled ones of every draw."""
    shape = draws.samples["node_heights"].shape[:2] + (time.num_tips,)
    tips = np.broadcast_to(time.tip_heights, shape).copy()
    if time.sampled:
        tips[..., time.free_tips] = draws.samples["tip_heights_free"]
    return tips


def _branch_values(draws, chain, draw, topology, tips):
    """Branch lengths and notes of one draw: substitutions (no `tips`), or durations and `[&rate=...]`."""
    n = topology.num_nodes
    substitutions = np.append(draws.samples["branch_lengths"][chain, draw], 0.0)
    if tips is None:
        return substitutions, [""] * n
    heights = np.concatenate([tips, draws.samples["node_heights"][chain, draw]])
    parent = topology.parent_array
    durations = np.append(heights[parent[:-1]] - heights[:-1], 0.0)
    rates = substitutions / np.where(durations > 0, durations, np.inf)
    return durations, [f"[&rate={r:.8g}]" for r in rates]


MIN_DRAWS_FOR_DIAGNOSTICS = 4  # split R-hat halves each chain; ESS needs at least two draws per half


def _moments(values, prob: float) -> dict:
    """Mean, sd and HPD interval of a run too short for ESS and R-hat (those are NaN)."""
    flat = np.reshape(values, (-1,) + np.shape(values)[2:])
    low, high = hpdi(flat, prob) if len(flat) > 1 else (flat[0], flat[0])
    return {"mean": flat.mean(0), "std": flat.std(0), f"{100 * (1 - prob) / 2:.1f}%": low,
            f"{100 * (1 + prob) / 2:.1f}%": high, "n_eff": np.nan, "r_hat": np.nan}


def summary_table(draws: Draws, prob: float = 0.95, labels: dict | None = None) -> list[dict]:
    """Mean, sd, HPD interval, bulk ESS and split R-hat of every column."""
    columns = [("likelihood", draws.stats["likelihood"])] + tracer_columns(draws.samples, labels)
    if draws.stats["likelihood"].shape[1] < MIN_DRAWS_FOR_DIAGNOSTICS:
        stats = {name: _moments(values, prob) for name, values in columns}
    else:
        stats = numpyro_summary({name: values for name, values in columns}, prob=prob, group_by_chain=True)
    low, high = f"{100 * (1 - prob) / 2:.1f}%", f"{100 * (1 + prob) / 2:.1f}%"
    return [{"name": name, "mean": s["mean"], "sd": s["std"], "hpd_low": s[low], "hpd_high": s[high],
             "ess": s["n_eff"], "r_hat": s["r_hat"]} for name, s in stats.items()]


def write_summary(out: Path, rows: list[dict]) -> str:
    """`summary.tsv`, and the text printed: every scalar plus one line per vector (its worst ESS and R-hat)."""
    keys = ["name", "mean", "sd", "hpd_low", "hpd_high", "ess", "r_hat"]
    with open(out / "summary.tsv", "w") as handle:
        handle.write("\t".join(keys) + "\n")
        for row in rows:
            handle.write("\t".join([row["name"]] + [f"{float(row[k]):.6g}" for k in keys[1:]]) + "\n")
    lines = [f"{'parameter':<24}{'mean':>12}{'sd':>11}{'95% HPD':>25}{'ESS':>9}{'R-hat':>7}"]
    vectors: dict[str, list[dict]] = {}
    many_dates = sum(row["name"].startswith("date_") for row in rows) > 12
    for row in rows:
        base, dot, index = row["name"].rpartition(".")
        if dot and index.isdigit():
            vectors.setdefault(base, []).append(row)
            continue
        if many_dates and row["name"].startswith("date_"):
            vectors.setdefault("tip dates", []).append(row)
            continue
        lines.append(f"{row['name']:<24}{row['mean']:>12.5g}{row['sd']:>11.4g}"
                     f"   [{row['hpd_low']:>10.4g}, {row['hpd_high']:>10.4g}]{row['ess']:>9.0f}{row['r_hat']:>7.3f}")
    for base, members in vectors.items():
        ess = min(r["ess"] for r in members)
        r_hat = max(r["r_hat"] for r in members)
        lines.append(f"{base + f' ({len(members)})':<24}{'':>12}{'':>11}{'(see summary.tsv)':>25}"
                     f"{ess:>9.0f}{r_hat:>7.3f}")
    return "\n".join(lines)


def write_inference_data(out: Path, draws: Draws) -> Path:
    """ArviZ's NetCDF layout (one HDF5 group per InferenceData group): posterior, sample stats and
    the log-likelihood.

    Written with xarray and h5netcdf, not ArviZ: ArviZ 0.2x (`InferenceData`) and 1.x (xarray's
    `DataTree`) share no writing API, but both read this file with `arviz.from_netcdf`. Dimensions
    follow ArviZ's convention (`chain`, `draw`, then `<name>_dim_<k>`); no time stamps, so equal
    runs write equal bytes."""
    import xarray as xr

    stats = {"lp": draws.stats["posterior"], "diverging": draws.stats["diverging"].astype(bool),
             "n_steps": draws.stats["num_steps"], "acceptance_rate": draws.stats["accept_prob"]}
    groups = {"posterior": dict(draws.samples), "sample_stats": stats,
              "log_likelihood": {"alignment": draws.stats["likelihood"]}}
    path = out / "posterior.nc"
    path.unlink(missing_ok=True)
    for group, variables in groups.items():
        arrays = {}
        for name, values in variables.items():
            values = np.asarray(values)
            dims = ("chain", "draw") + tuple(f"{name}_dim_{k}" for k in range(values.ndim - 2))
            arrays[name] = xr.DataArray(values, dims=dims)
        chains, draws_per_chain = np.asarray(next(iter(variables.values()))).shape[:2]
        dataset = xr.Dataset(arrays, coords={"chain": np.arange(chains), "draw": np.arange(draws_per_chain)},
                             attrs={"inference_library": "jaxphylo"})
        dataset.to_netcdf(path, group=group, mode="a" if path.exists() else "w", engine="h5netcdf")
    return path


def plot_run(out: Path, draws: Draws, topology: Topology, time: TimeTree | None) -> Path:
    """The tree at posterior means with 95% intervals on every branch (node heights for time
    trees), beside the traces of the log-likelihood and the tree length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(12, 7))
    tree_axis = figure.add_subplot(1, 2, 1)
    _draw_tree(tree_axis, draws, topology, time)
    for row, (name, values) in enumerate([("log-likelihood", draws.stats["likelihood"]),
                                          ("tree length", draws.samples["tree_length"])]):
        axis = figure.add_subplot(2, 2, 2 * row + 2)
        for chain, trace in enumerate(values):
            axis.plot(trace, lw=0.6, label=f"chain {chain + 1}")
        axis.set_ylabel(name)
        axis.set_xlabel("draw")
    figure.axes[-2].legend(fontsize=7, loc="best")
    figure.tight_layout()
    path = out / "summary.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _draw_tree(axis, draws, topology, time):
    n, m = topology.num_tips, topology.num_nodes
    parent = topology.parent_array
    y = np.zeros(m)
    y[:n] = np.arange(n)
    order = _tip_order(topology)
    y[order] = np.arange(n)
    for node in range(n, m):
        y[node] = np.mean(y[list(topology.children[node])])
    if time is None:
        lengths = draws.samples["branch_lengths"].reshape(-1, m - 1)
        mean = np.append(lengths.mean(0), 0.0)
        low, high = np.percentile(lengths, [2.5, 97.5], axis=0)
        x = np.zeros(m)
        for node in range(m - 2, -1, -1):  # root-first
            x[node] = x[parent[node]] + mean[node]
        for node in range(m - 1):
            axis.plot([x[parent[node]], x[node]], [y[node], y[node]], color="k", lw=1)
            axis.plot([x[parent[node]] + low[node], x[parent[node]] + high[node]], [y[node]] * 2,
                      color="tab:blue", lw=4, alpha=0.35, solid_capstyle="butt")
        axis.set_xlabel("substitutions per site (bars: 95% interval of each branch length)")
    else:
        heights = draws.samples["node_heights"].reshape(-1, m - n)
        tips = tip_height_draws(draws, time).reshape(-1, n)
        x = -np.concatenate([tips.mean(0), heights.mean(0)])
        low, high = np.percentile(heights, [2.5, 97.5], axis=0)
        for node in range(m - 1):
            axis.plot([x[parent[node]], x[node]], [y[node], y[node]], color="k", lw=1)
        for k in range(m - n):
            axis.plot([-high[k], -low[k]], [y[n + k]] * 2, color="tab:blue", lw=4, alpha=0.35, solid_capstyle="butt")
        axis.set_xlabel("time before the latest tip (bars: 95% interval of node heights)")
    for node in range(n, m):
        kids = list(topology.children[node])
        axis.plot([x[node]] * 2, [y[kids].min(), y[kids].max()], color="k", lw=1)
    for tip in range(n):
        axis.text(x[tip], y[tip], " " + topology.taxa[tip], va="center", fontsize=7)
    axis.set_yticks([])
    for side in ("left", "right", "top"):
        axis.spines[side].set_visible(False)


def _tip_order(topology):
    order, stack = [], [topology.root]
    while stack:
        node = stack.pop()
        if node < topology.num_tips:
            order.append(node)
        else:
            stack.extend(reversed(topology.children[node]))
    return np.array(order)


def write_outputs(out, draws: Draws, topology: Topology, time: TimeTree | None) -> str:
    """Every output file of a run; returns the printed summary."""
    out = Path(out)
    labels = column_labels(time)
    write_tracer_logs(out, draws, labels)
    write_trees(out, draws, topology, time)
    write_inference_data(out, draws)
    plot_run(out, draws, topology, time)
    return write_summary(out, summary_table(draws, labels=labels))
