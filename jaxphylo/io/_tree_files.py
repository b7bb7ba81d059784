"""Reading and writing trees (Newick, NEXUS) through DendroPy."""

from __future__ import annotations

import math
import os

import dendropy
import numpy as np

from .._errors import InputError
from ..runtime import to_device
from ..tree import Topology, Tree
from ._alignment_files import read_text


def read_tree(path, default_branch_length: float | None = None, index: int = 0) -> Tree:
    """Read tree number `index` of a Newick or NEXUS file.

    Translate blocks, quoted labels and `[&...]` annotations are understood;
    annotations are kept in `tree.topology.annotations`. A tree whose root has
    three or more children is unrooted. Missing branch lengths are an error
    unless `default_branch_length` is given.
    """
    path = os.fspath(path)
    return _parse(read_text(path, "tree"), path, default_branch_length, index)


def parse_newick(text: str, default_branch_length: float | None = None) -> Tree:
    """A tree from a Newick (or NEXUS) string."""
    return _parse(text, "<newick>", default_branch_length, 0)


def _parse(text, source, default_branch_length, index) -> Tree:
    schema = "nexus" if text.lstrip()[:6].upper() == "#NEXUS" else "newick"
    try:
        trees = dendropy.TreeList.get(
            data=text, schema=schema, preserve_underscores=True, rooting="default-unrooted"
        )
    except dendropy.utility.error.DataParseError as err:
        message = err.message
        if "Duplicate taxon labels:" in message:
            message = f"taxon {message.split('Duplicate taxon labels:')[1].strip()!r} appears twice"
        raise InputError(f"{source}: line {err.line_num}, column {err.col_num}: {message}") from None
    except Exception as err:  # DendroPy raises assorted errors for malformed input
        raise InputError(f"{source}: unparsable {schema} tree: {err}".splitlines()[0]) from None
    if len(trees) <= index:
        raise InputError(f"{source}: no tree number {index + 1} (found {len(trees)})")
    return from_dendropy(trees[index], source, default_branch_length)


def from_dendropy(dtree, source, default_branch_length) -> Tree:
    dtree.suppress_unifurcations()
    leaves = list(dtree.leaf_node_iter())
    internal = [n for n in dtree.postorder_node_iter() if not n.is_leaf()]
    order = leaves + internal
    index = {id(node): k for k, node in enumerate(order)}
    taxa = []
    for leaf in leaves:
        if leaf.taxon is None or not leaf.taxon.label:
            raise InputError(f"{source}: a tip has no name")
        taxa.append(leaf.taxon.label)
    if len(set(taxa)) != len(taxa):
        dup = next(t for t in taxa if taxa.count(t) > 1)
        raise InputError(f"{source}: taxon {dup!r} appears twice in the tree")
    lengths = np.zeros(len(order))
    for k, node in enumerate(order[:-1]):
        length = node.edge.length
        what = f"taxon {taxa[k]!r}" if k < len(leaves) else f"the clade of {_first_tip(node)!r}"
        if length is None:
            if default_branch_length is None:
                raise InputError(f"{source}: the branch above {what} has no length")
            length = default_branch_length
        if not math.isfinite(length) or length < 0:
            raise InputError(f"{source}: the branch above {what} has length {length}; lengths must be >= 0")
        lengths[k] = length
    root_children = len(order[-1].child_nodes())
    topology = Topology(
        parent=tuple(index[id(n.parent_node)] if n.parent_node is not None else -1 for n in order),
        taxa=tuple(taxa),
        rooted=bool(dtree.is_rooted) or root_children == 2,
        labels=tuple(None if n.is_leaf() else n.label for n in order),
        annotations=tuple(tuple((a.name, str(a.value)) for a in n.annotations) for n in order),
    )
    return Tree(to_device(lengths), topology)


def _first_tip(node):
    return next(node.leaf_iter()).taxon.label


def to_dendropy(tree: Tree) -> dendropy.Tree:
    """The tree as a DendroPy object, annotations included."""
    topo = tree.topology
    namespace = dendropy.TaxonNamespace(list(topo.taxa))
    nodes = [dendropy.Node() for _ in range(topo.num_nodes)]
    lengths = np.asarray(tree.branch_lengths, float)
    for k, node in enumerate(nodes):
        if k < topo.num_tips:
            node.taxon = namespace.get_taxon(topo.taxa[k])
        elif topo.labels and topo.labels[k] is not None:
            node.label = topo.labels[k]
        for name, value in topo.annotations[k] if topo.annotations else ():
            node.annotations.add_new(name, value)
    first_tip = list(range(topo.num_nodes))  # children are written left to right by first tip
    for k, up in enumerate(topo.parent):
        if up >= 0:
            first_tip[up] = min(first_tip[up], first_tip[k])  # children precede parents
    for k in sorted(range(topo.num_nodes - 1), key=lambda k: first_tip[k]):
        nodes[topo.parent[k]].add_child(nodes[k])
        nodes[k].edge.length = float(lengths[k])
    return dendropy.Tree(seed_node=nodes[-1], taxon_namespace=namespace, is_rooted=topo.rooted)


def write_tree(tree: Tree, path, format: str = "newick") -> None:
    """Write `tree` as Newick or NEXUS, with branch lengths and `[&...]` annotations."""
    if format not in ("newick", "nexus"):
        raise InputError(f"unknown tree format {format!r}; use 'newick' or 'nexus'")
    options = dict(unquoted_underscores=True, preserve_spaces=True, suppress_annotations=False,
                   suppress_leaf_node_labels=False, suppress_internal_node_labels=False)
    if format == "nexus":
        options["translate_tree_taxa"] = True
    to_dendropy(tree).write(path=os.fspath(path), schema=format, **options)
