"""The one YAML reader of lazylab: ``yaml.safe_load`` that refuses a document whose aliases expand too far.

``yaml.safe_load`` already builds no Python objects but plain data; it still accepts the "billion laughs":
nine anchors, each a list of nine aliases of the one before, are a few hundred bytes that stand for 9⁹ strings.
PyYAML shares the aliased objects, so loading is quick, but anything that walks the value afterwards (a type
check, an error message, a dump, a sweep's grid) walks all 387 million strings. A configuration file, a run's
``configs.yaml`` or a sweep's ``sweep.yaml`` is never that large, so the reader counts the values the document
stands for, each alias counted at its full size, and refuses one above :data:`MAX_VALUES` before anything walks it.
Anchors and aliases of a reasonable size (a Hydra-style file that reuses a block) load as before.
"""
from __future__ import annotations

import functools
from typing import Any

# late imports: PyYAML only when a document is read, so that importing lazylab (and its config engine) stays quick

MAX_VALUES = 1_000_000
"""The most values (scalars, lists and mappings, aliases counted at their expanded size) a document may stand for."""


def load(text: str) -> Any:
    """Parse one YAML document into plain data (``yaml.safe_load``'s types).

    Raises:
        yaml.YAMLError: not valid YAML, a tag that is not plain data (``!!python/object``), or a
            ``yaml.composer.ComposerError`` for aliases that expand to more than :data:`MAX_VALUES` values or a
            value that contains itself.
    """
    import yaml
    return yaml.load(text, Loader=_bounded_loader())  # noqa: S506 - a SafeLoader subclass


def key_lines(text: str, section: str = '') -> dict[str, int]:
    """{key: its 1-based line} of the keys of the document's top-level mapping (or of the mapping under its key
    ``section``): where a config file gives each value, for the provenance ``FILE:LINE``. Keys that are not strings,
    and a document that is not a mapping, give ``{}``.

    Raises:
        yaml.YAMLError: as :func:`load` (call it on a text :func:`load` read).
    """
    import yaml
    node = yaml.compose(text, Loader=_bounded_loader())  # noqa: S506 - a SafeLoader subclass
    if section and isinstance(node, yaml.MappingNode):
        node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == section), None)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def problem(e: Exception) -> str:
    """One line for a ``yaml.YAMLError``: ``line 3: found undefined alias 'x'`` (PyYAML's own text spans
    several lines and quotes the document)."""
    what = getattr(e, 'problem', None) or ' '.join(str(e).split())
    if 'could not determine a constructor for the tag' in what:
        what = what.replace('could not determine a constructor for the tag', 'not plain data: the tag') + \
            ' is refused (lazylab reads YAML as plain data only)'
    elif getattr(e, 'context', None):
        what = f'{e.context}: {what}'
    mark = getattr(e, 'problem_mark', None)
    return f'line {mark.line + 1}: {what}' if mark is not None else what


@functools.cache
def _bounded_loader() -> type:
    """The safe loader, with the expanded size checked between composing the node graph and constructing it."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def get_single_node(self) -> Any:
            node = super().get_single_node()
            if node is not None:
                _check_size(node)
            return node

    return BoundedLoader


def _check_size(root: Any) -> None:
    """Raise ``yaml.composer.ComposerError`` if the node graph ``root`` stands for more than :data:`MAX_VALUES`
    values, or contains itself.

    Every node's expanded size is computed once (aliases share their node object), so the check costs the number of
    distinct nodes, not the expanded size.
    """
    from yaml.composer import ComposerError
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # entered, children not yet sized: meeting one again is a loop
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # post-order without recursion: a deeply nested document must not overflow the Python stack
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not children_done:
            if id(node) in open_nodes:
                raise ComposerError(None, None, 'the document contains itself through an alias (a value that is '
                                    'its own element): refused', node.start_mark)
            if children:
                open_nodes.add(id(node))
                stack.append((node, True))
                stack.extend((child, False) for child in children if id(child) not in sizes)
                continue
        open_nodes.discard(id(node))
        size = 1 + sum(sizes[id(child)] for child in children)
        if size > MAX_VALUES:
            raise ComposerError(None, None, f'the document expands to more than {MAX_VALUES:,} values through its '
                                f'aliases (*name): refused, as no configuration is that large', node.start_mark)
        sizes[id(node)] = size


def _children(node: Any) -> list[Any]:
    """A sequence node's items, a mapping node's keys and values, nothing for a scalar."""
    if isinstance(node.value, list):
        return [part for item in node.value for part in (item if isinstance(item, tuple) else (item,))]
    return []
