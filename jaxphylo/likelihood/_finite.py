"""Never a silent -inf or NaN: what a non-finite log-likelihood or gradient is blamed on.

Checked in order: a model parameter that is not finite or out of its domain
(negative rates, frequencies off the simplex, a proportion of invariant sites
outside [0, 1)); a branch length that is negative or not finite; a gradient
component that is not finite (named by its parameter or branch); and, the
parameters being fine, the first site pattern whose likelihood is zero
(underflow beyond what rescaling rescues, or data impossible under the model).
"""

from __future__ import annotations

import jax
import numpy as np

from .._errors import ModelError

_SIMPLEX = ("frequencies", "weights", "category_weights")
_UNIT = ("proportion_invariant", "invariant")


def _named_leaves(tree) -> list[tuple[str, np.ndarray]]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    name = lambda path: jax.tree_util.keystr(path).replace("['", ".").replace("']", "").lstrip(".") or "value"
    return [(name(path), np.asarray(leaf)) for path, leaf in leaves if np.asarray(leaf).dtype.kind == "f"]


def _show(value: np.ndarray) -> str:
    flat = np.ravel(value)
    return f"{flat[0]:g}" if flat.size == 1 else np.array2string(flat, precision=4, threshold=8)


def parameter_problem(model) -> str | None:
    """The first model parameter that is not finite or outside its domain, described; None if all are fine."""
    for name, value in _named_leaves(model):
        last = name.split(".")[-1]
        if not np.all(np.isfinite(value)):
            return f"model parameter {name} = {_show(value)} is not finite"
        if np.any(value < 0):
            return f"model parameter {name} = {_show(value)} is negative"
        if last in _SIMPLEX and abs(float(np.sum(value)) - 1) > 1e-6:
            return f"model parameter {name} = {_show(value)} does not sum to 1"
        if last in _UNIT and np.any(value >= 1):
            return f"model parameter {name} = {_show(value)} is not below 1"
    return None


def branch_problem(branch_lengths, taxa, num_tips: int) -> str | None:
    lengths = np.asarray(branch_lengths)
    bad = ~np.isfinite(lengths) | (lengths < 0)
    if not bad.any():
        return None
    node = int(np.argmax(bad))
    where = f"taxon {taxa[node]!r}" if node < num_tips else f"internal node {node}"
    return f"branch length above {where} = {lengths[node]:g} is negative or not finite"


def gradient_problem(gradient, label: str = "") -> str | None:
    for name, value in _named_leaves(gradient):
        if not np.all(np.isfinite(value)):
            index = int(np.argmax(~np.isfinite(np.ravel(value))))
            at = f"[{index}]" if np.size(value) > 1 else ""
            return f"the gradient with respect to {label}{name}{at} is {np.ravel(value)[index]:g}"
    return None


def require_finite(value, *, model, tree, per_pattern=None, gradient=None, where: str = "log-likelihood") -> None:
    """`ModelError` naming the parameter, branch or pattern to blame when `value` or `gradient` is not finite."""
    finite = np.all(np.isfinite(np.asarray(value)))
    gradient_issue = gradient_problem(gradient) if gradient is not None else None
    if finite and gradient_issue is None:
        return
    problem = parameter_problem(model) or branch_problem(tree.branch_lengths, tree.taxa, tree.num_tips)
    if problem is None and not finite and per_pattern is not None:
        per = np.asarray(per_pattern)
        k = int(np.argmax(~np.isfinite(per)))
        problem = (f"site pattern {k + 1} has log-likelihood {per[k]:g} (underflow beyond rescaling, or data "
                   f"impossible under the model)")
    problem = problem or gradient_issue
    raise ModelError(f"the {where} is {float(np.asarray(value).sum()):g}: {problem or 'cause not found'}")




def check_start(data, tree, model, precision: str = "float64", where: str = "starting log-likelihood") -> float:
    """The log-likelihood of pattern `data` on `tree` under `model`, once it and its gradient are known finite."""
    from ..tree import branch_index
    from ._api import data_log_likelihood
    from ._arrays import PRECISIONS, PatternData
    from ._single import schedule_for, schedule_pattern_log_likelihoods

    def total(lengths, model):
        return data_log_likelihood(data, tree.with_branch_lengths(lengths), model, precision=precision)

    value, (d_lengths, d_model) = jax.value_and_grad(total, argnums=(0, 1))(tree.branch_lengths, model)
    per_pattern = None
    if not np.isfinite(float(value)) and isinstance(data, PatternData):  # one model's patterns: name the worst
        dtype = PRECISIONS[precision]
        per_pattern = schedule_pattern_log_likelihoods(model, tree.branch_lengths, data, schedule_for(tree, model, data, dtype),
                                               branch_index(tree.topology), dtype)
    require_finite(value, model=model, tree=tree, per_pattern=per_pattern,
                   gradient={"branch_lengths": d_lengths, "model": d_model}, where=where)
    return float(value)
