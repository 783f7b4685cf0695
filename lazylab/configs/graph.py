"""A picture of a config's lazy graph: its items as nodes, "computed from" as edges (what each item's calculator
read, as :mod:`lazylab.configs.inspect` recorded it), the option each computed item was computed with, and the keys
the user set marked. `lazylab options EXPERIMENT key=value … --graph dot|mermaid|svg` draws the configuration a run
would get (:func:`lazylab.experiments.resolved.resolve`: nothing built that needs the model).

    g = graph(conf)                   # conf: any config object, computed as far as wanted; later: see resolve()
    print(to_dot(g))                  # Graphviz: `dot -Tsvg` draws it (to_svg)
    print(to_mermaid(g))              # a Mermaid flowchart (GitHub and mkdocs-material render it)

Each node is labelled ``path = value`` and how the value came: ``option NAME``, ``aggregate SELECTOR=OPTION``,
``default``, ``set by ITEM``, ``command line``, ``FILE:LINE``, ``preset NAME``; an item not computed says what it
starts from and when it is computed. User-set values (the command line, a ``--config`` file, the environment) are
filled. Reads nothing it was not given: nothing here computes an item. (Like the engine, torch-free.)
"""
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from lazylab.errors import UsageError

from . import inspect

__all__ = ['Node', 'Graph', 'graph', 'to_dot', 'to_mermaid', 'to_svg', 'need_dot', 'is_user_set', 'given_by', 'FORMATS']

#: the formats of `--graph`
FORMATS = ('dot', 'mermaid', 'svg')
#: how user-set nodes are filled (dot and mermaid alike)
USER_FILL = '#fde68a'
#: a value longer than this is cut, ending with …
MAX_VALUE = 40


@dataclass(frozen=True)
class Node:
    """One item: its full dotted path, its value as shown (``''`` for none), how it came, whether the user set it."""
    path: str
    value: str
    how: str
    user: bool

    @property
    def label(self) -> str:
        """``path = value`` (or the path alone), then how, on two lines."""
        first = f'{self.path} = {self.value}' if self.value else self.path
        return f'{first}\n{self.how}' if self.how else first


@dataclass
class Graph:
    """Nodes in :func:`inspect.items` order; edges ``(read item, item computed from it)``, in the same order."""
    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)


def is_user_set(label: Optional[str]) -> bool:
    """Whether a given value's label (:func:`inspect.given`) is the user's: the command line (``user``), a
    ``--config`` file, the environment. A preset, a sweep's trial and code's own values are not."""
    return label is not None and (label == 'user' or label.startswith(('--config ', 'env ')))


def given_by(label: str) -> str:
    """A given value's source as shown: ``user`` is the command line, ``--config FILE:LINE`` is ``FILE:LINE``."""
    if label == 'user':
        return 'command line'
    return label[len('--config '):] if label.startswith('--config ') else label


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + '…'


def _computed(item: inspect.Item, setter: Optional[str]) -> tuple[str, str]:
    value = _shown(item.value) if item.plain else type(item.value).__name__
    if item.given is not None:
        return value, given_by(item.given)
    if item.source == 'option':
        return value, f'option {item.detail}'
    if item.source == 'aggregate':
        return value, f'aggregate {item.detail}'
    if setter is not None:
        return value, f'set by {setter}' if setter else 'set by the experiment'
    how = {'default': 'default', 'from_type': 'constructed from its type', 'set_default': 'computed'}
    return value, how.get(item.source or '', item.source or '')


def _not_computed(item: inspect.Item, waiting: Mapping[str, Any], later: Mapping[str, str]) -> tuple[str, str]:
    if item.path in later:
        needs = later[item.path]
        when = 'built when the run starts' if needs == item.path else f'when the run starts: needs {needs}'
    else:
        when = 'not computed'
    selected = None if item.plain else inspect.selected_option(item.owner, item.key)
    if selected is not None:
        return '', f'option {selected}, {when}'
    if item.waiting == 'set_default':
        return '', f'set by the experiment, {when}'
    start = waiting[item.path] if item.path in waiting else inspect.class_defaults(type(item.owner)).get(item.key)
    source = given_by(item.given) if item.given is not None else ('default' if start is not None else '')
    return ('' if start is None else _shown(start)), f'{source}, {when}' if source else when


def graph(configs: Any, later: Optional[Mapping[str, str]] = None) -> Graph:
    """The lazy graph of ``configs`` as computed so far.

    Args:
        configs: a config object.
        later: {path: the item it waits for} of items left to compute when the run starts
            (:func:`lazylab.experiments.resolved.resolve`'s second value); others not computed are "not computed".
    """
    later = later or {}
    setters, waiting, hidden = inspect.set_by(configs), inspect.waiting(configs), inspect.redacted(configs)
    out = Graph()
    for item in inspect.items(configs):
        value, how = (_computed(item, setters.get(item.path)) if item.computed
                      else _not_computed(item, waiting, later))
        if item.path in hidden:  # a secret read from the environment: its reference, never its value
            value = _shown(hidden[item.path])
        out.nodes.append(Node(item.path, value, how, is_user_set(item.given)))
        out.edges.extend((read, item.path) for read in item.reads if read != item.path)
    return out


def _dot_text(text: str) -> str:
    return text.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def to_dot(g: Graph, name: str = 'configs') -> str:
    """Graphviz's dot language: one box per item (user-set ones filled), an arrow from each item read to the item
    computed from it."""
    lines = [f'digraph "{_dot_text(name)}" {{', '  rankdir=LR;',
             '  node [shape=box, style=rounded, fontname="Helvetica", fontsize=10];']
    for node in g.nodes:
        fill = f', style="rounded,filled,bold", fillcolor="{USER_FILL}"' if node.user else ''
        lines.append(f'  "{_dot_text(node.path)}" [label="{_dot_text(node.label)}"{fill}];')
    lines += [f'  "{_dot_text(a)}" -> "{_dot_text(b)}";' for a, b in g.edges]
    return '\n'.join(lines + ['}']) + '\n'


def _mermaid_text(text: str) -> str:
    for plain, code in (('#', '#35;'), ('"', '#quot;'), ('<', '#lt;'), ('>', '#gt;')):
        text = text.replace(plain, code)
    return text.replace('\n', '<br/>')


def to_mermaid(g: Graph) -> str:
    """A Mermaid flowchart: nodes ``n0``, ``n1``, … in :func:`graph`'s order, labelled as in :func:`to_dot`; the
    user-set ones in class ``user``."""
    ids = {node.path: f'n{i}' for i, node in enumerate(g.nodes)}
    lines = ['flowchart LR']
    lines += [f'  {ids[node.path]}["{_mermaid_text(node.label)}"]' for node in g.nodes]
    lines += [f'  {ids[a]} --> {ids[b]}' for a, b in g.edges if a in ids and b in ids]
    user = [ids[node.path] for node in g.nodes if node.user]
    if user:
        lines += [f'  classDef user fill:{USER_FILL},stroke:#b45309,stroke-width:2px', f'  class {",".join(user)} user']
    return '\n'.join(lines) + '\n'


def need_dot() -> str:
    """The path of graphviz's ``dot``.

    Raises:
        UsageError: it is not installed (one line saying to install graphviz).
    """
    dot = shutil.which('dot')
    if dot is None:
        raise UsageError("--graph svg needs graphviz's dot program, which is not installed: install graphviz "
                         "(apt-get install graphviz, brew install graphviz), or use --graph dot or --graph mermaid")
    return dot


def to_svg(dot_text: str, timeout: float = 60.0) -> str:
    """The SVG that graphviz's ``dot -Tsvg`` draws from ``dot_text``.

    Raises:
        UsageError: graphviz's ``dot`` is not installed (one line saying to install it), or it failed.
    """
    dot = need_dot()
    try:
        done = subprocess.run([dot, '-Tsvg'], input=dot_text, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f'graphviz dot failed: {e}') from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [f'exit status {done.returncode}'])[0]
        raise UsageError(f'graphviz dot failed: {first}')
    return done.stdout
