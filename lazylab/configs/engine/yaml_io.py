"""Dumping a computed configuration to YAML, and replaying a dump soundly.

A dump (``to_dict`` / ``dump``) has these sections:

``values``
    every plain value, by dotted path (sub-config items under dotted names): a plain value as itself (tuples as
    lists, enums by name), a value computed by an option as the option's name (so replay, and its check, are about
    which option computes it).
``given``
    the paths whose values were *given*, with where from: ``override`` / ``assigned`` (code outside any
    computation: ``_set_values``, ``apply_overrides``, ``conf.x = …``), or a label the caller gave with
    :func:`label_given` (the command line uses ``user``, ``preset NAME``, ``--config FILE``, ``sweep``).
``computed``
    every other path of ``values``, with how it was computed, in :func:`~.report.explain`'s terms: ``default``,
    ``option NAME``, ``aggregate SELECTOR=OPTION``, ``set_default func``, ``assigned while computing ITEM`` (set by
    code inside ITEM's option), ….
``objects``
    values that have no text form, for reading: ``module.Type (how)``; listed by type, never by ``repr``, so two
    dumps of one configuration are the same text (no memory addresses).
``computed_before_run`` (only when the caller gives ``run_values``)
    values the run itself changed after the configuration computed them (``total_steps`` fitted to a time
    budget): ``values`` holds what the run did, this section what the configuration had computed.
``hyperparams``, ``meta``
    the flagged items.

A given value is written as it is given (``escape_env``: a ``${`` in its text as ``$${``), except a secret read from
the environment (``note_env``), which is written as its reference (``api_key: ${env:API_KEY}``; the header names
these keys). Replay (``load``) reads the references of the values it applies (``${env:NAME}``: see
:mod:`.env_refs`), so it gives them back in the same environment; it applies the ``given`` values only, so that
everything computed from them is computed again: ``--config RUN/configs.yaml d_model=32`` gives a 32-wide model
whose every derived width follows. It also remembers the ``computed`` values (and the objects' types), and
:func:`replay_changes`, called once the replayed configuration is computed, lists each one that comes out
differently although nothing it was computed from was given a new value (the code changed, or the data), as (path,
recorded, now). A dump without a ``given`` section
(older dumps, or a flat ``{key: value}`` file) is applied whole, as before.

    text = dump(conf)               # or dump(conf, 'configs.yaml')
    fresh = Configs(); load(fresh, text)    # the same given values; the rest recomputed
    ...                             # compute what is needed (e.g. the model)
    replay_changes(fresh)           # [] when every recorded computed value came out the same
"""
import os
from enum import Enum
from typing import Any, NamedTuple, Optional, Union

from lazylab import safe_yaml, user_files

from .env_refs import escape_env, expand_env, note_env, redacted
from .errors import BadValueError, UnknownItemError
from .overrides import apply_overrides, typed_pending
from .report import given_paths, type_name, walk
from .state import Provenance, state_of

_NOT_TEXT = object()


def _text_value(value: Any) -> Any:
    """A YAML-safe rendering of a plain value, or ``_NOT_TEXT``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        items = [_text_value(v) for v in value]
        return _NOT_TEXT if any(i is _NOT_TEXT for i in items) else items
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int, float, bool)) for k in value):
            return _NOT_TEXT
        items = {k: _text_value(v) for k, v in value.items()}
        return _NOT_TEXT if any(i is _NOT_TEXT for i in items.values()) else items
    return _NOT_TEXT


class _Entry(NamedTuple):
    """One declared item as a dump sees it: its text (or ``_NOT_TEXT``), its type name when it is an object,
    its provenance (``None`` when not computed), whether it was computed at all, and the value itself."""
    text: Any
    object_type: Optional[str]
    provenance: Optional[Provenance]
    computed: bool
    value: Any = None


def _entries(configs: Any) -> dict[str, _Entry]:
    """Every item that has a value, computed or given, by dotted path, in the dump's order (a value given for a
    sub-config not made yet, after the items of the config that waits for it)."""
    out: dict[str, _Entry] = {}
    for path, st, key in walk(state_of(configs)):
        if key in st.pending and key not in st.children:  # given for a sub-config not made yet: replayed too
            for sub, (given, from_text) in st.pending[key].items():
                given = typed_pending(st, key, sub, given, from_text)
                text = _text_value(given)
                out[f'{path}.{sub}'] = _Entry(text, type_name(given) if text is _NOT_TEXT else None, None, False,
                                              given)
        if key not in st.cache:
            # a value the user gave but nothing read yet is still part of the configuration to replay
            given = st.overrides.get(key, st.assigned.get(key, _NOT_TEXT))
            if given is not _NOT_TEXT:
                text = _text_value(given)
                out[path] = _Entry(text, type_name(given) if text is _NOT_TEXT else None, None, False, given)
            continue
        p = st.provenance.get(key)
        value = st.cache[key]
        if p is not None and p.source == 'option':
            out[path] = _Entry(p.detail, None, p, True, value)
            continue
        # A sub-config (even one whose parent sees only its `_primary` item) and a constructed type are
        # rebuilt by the same code on replay; their own items are dumped under dotted names.
        rebuilt = key in st.children or (p is not None and p.source == 'from_type')
        text = _NOT_TEXT if rebuilt else _text_value(value)
        out[path] = _Entry(text, type_name(value) if text is _NOT_TEXT else None, p, True, value)
    return out


def _how(p: Optional[Provenance], set_by: Optional[str]) -> str:
    """How a value was computed, in explain()'s terms (``option AdamW``, ``assigned while computing optimizer``)."""
    if p is None:
        return 'given'
    how = p.source + (f' {p.detail}' if p.detail else '')
    return how + (f' while computing {set_by}' if set_by else '')


def to_dict(configs: Any, run_values: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The dump as a dict: ``{'values', 'given', 'computed', 'objects', 'hyperparams', 'meta'}`` (see the module
    docstring).

    Args:
        configs: the config object; only what was computed so far is recorded (nothing is computed).
        run_values: {path: value} of computed items the run changed after the configuration computed them
            (e.g. ``{'total_steps': 617}``): ``values`` records these, ``computed_before_run`` the configuration's
            own values. Ignored for given paths (replay must give the same value again).
    """
    st = state_of(configs)
    given_labels, set_by = given_paths(st)
    hidden = redacted(configs)
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    computed: dict[str, str] = {}
    objects: dict[str, str] = {}
    before: dict[str, Any] = {}
    hyper, meta = [], []
    for path, s, key in walk(st):
        if s.spec.hyperparams.get(key):
            hyper.append(path)
        if s.spec.meta.get(key):
            meta.append(path)
    for path, e in _entries(configs).items():
        is_given = path in given_labels
        how = given_labels[path] if is_given else _how(e.provenance, set_by.get(path))
        if e.text is _NOT_TEXT:
            objects[path] = f'{e.object_type} ({how})'
        elif is_given:  # replay reads it back: a secret as its reference, any other text escaped
            values[path] = hidden[path] if path in hidden else escape_env(e.text)
        else:
            values[path] = e.text
            computed[path] = how
        if is_given:
            given[path] = given_labels[path]
        elif run_values and path in run_values and e.text is not _NOT_TEXT and run_values[path] != e.value:
            before[path] = _text_value(e.value)
            values[path] = _text_value(run_values[path])
    out = {'values': values, 'given': given, 'computed': computed, 'objects': objects}
    if before:
        out['computed_before_run'] = before
    out.update(hyperparams=hyper, meta=meta)
    return out


#: the top-level sections of a dump (see `to_dict`)
DUMP_SECTIONS = ('values', 'given', 'computed', 'objects', 'computed_before_run', 'hyperparams', 'meta')

_HEADER = ('# lazylab configuration. Replay: lazylab train NAME --config THIS_FILE [key=value …], or\n'
           '# lazylab.configs.load(conf, THIS_FILE): the `given` values are applied, the `computed` ones are\n'
           '# computed again and checked (lazylab.configs.replay_changes).\n')


def dump(configs: Any, path: Optional[Union[str, os.PathLike]] = None,
         run_values: Optional[dict[str, Any]] = None) -> str:
    """The YAML text of :func:`to_dict`; also written to ``path`` when given (through a temporary file and a
    rename, so a reader never sees half a file).

    Args:
        configs: the config object to dump (what was computed so far).
        path: the file to write, or ``None`` to only return the text.
        run_values: computed values the run changed afterwards, as for :func:`to_dict`.

    Returns:
        The YAML text, with a header comment saying how to replay it.
    """
    import yaml  # PyYAML only when a dump is written: importing lazylab.configs stays quick
    hidden = redacted(configs)
    header = _HEADER + (f'# Not written here (secrets): {", ".join(hidden)}; each is the ${{env:…}} reference it was '
                        f'given as,\n# read again from the environment on replay.\n' if hidden else '')
    text = header + yaml.safe_dump(to_dict(configs, run_values), sort_keys=False, default_flow_style=False,
                                    allow_unicode=True)
    if path is not None:
        tmp = f'{os.fspath(path)}.tmp{os.getpid()}'
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(tmp, path)
    return text


class Replay:
    """What :func:`load` remembers of a dump, for :func:`replay_changes`.

    Attributes:
        source: where the dump came from (a path or the caller's label), for messages.
        given: {path: value} the dump gave (and load applied).
        expected: {path: value} the dump recorded as computed; objects as ``('object', 'module.Type')``.
        unchecked: paths the run changed after computing them (``computed_before_run``): not compared.
    """

    def __init__(self, source: str, given: dict[str, Any], expected: dict[str, Any], unchecked: set):
        self.source, self.given, self.expected, self.unchecked = source, given, expected, unchecked


class Change(NamedTuple):
    """A computed value that replay did not reproduce: ``now`` is ``None`` when the item no longer exists."""
    path: str
    recorded: Any
    now: Any
    source: str

    def __str__(self):
        now = 'no longer exists' if self.now is None and self.path else f'comes out {_show(self.now)}'
        return f'{self.path} {now}, {self.source} has {_show(self.recorded)}'


def _show(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == 'object':
        return f'a {value[1]}'
    return repr(value)


def _read(source: Union[str, os.PathLike, dict[str, Any]]) -> tuple[Any, str, dict[str, int]]:
    """(the document ``source`` holds, its file's path or ``''``, {key: its line} of the values it gives when it is a
    file): a dict as it is, a path read (bounded: ``user_files.CONFIG``) and parsed, other text parsed as YAML.

    Raises:
        BadValueError: as :func:`load`.
    """
    if isinstance(source, dict):
        return source, '', {}
    import yaml  # PyYAML only when a dump is read: importing lazylab.configs stays quick
    text, path = str(source), ''
    if isinstance(source, os.PathLike) or ('\n' not in text and os.path.exists(text)):
        path = os.fspath(source)
        raw = user_files.read_bytes(source, 'configuration YAML', user_files.CONFIG, BadValueError)
        try:  # (the one reader of files a user names: never a FIFO, a device or a file of gigabytes)
            text = raw.decode('utf-8')
        except UnicodeDecodeError as e:
            raise BadValueError(f'cannot read configuration YAML {path}: not UTF-8 text (invalid byte at '
                                f'offset {e.start})') from None
    try:
        doc = safe_yaml.load(text)
    except yaml.YAMLError as e:
        raise BadValueError(f'cannot read configuration YAML{" " + path if path else ""}: '
                            f'{safe_yaml.problem(e)}') from None
    doc = {} if doc is None else doc
    lines = safe_yaml.key_lines(text, 'values' if isinstance(doc.get('values'), dict) else '') \
        if path and isinstance(doc, dict) else {}
    return doc, path, lines


def load(configs: Any, source: Union[str, os.PathLike, dict[str, Any]], label: Optional[str] = None,
         env: bool = True) -> dict[str, Any]:
    """Replay a dump into a fresh config object (all-or-nothing); returns the values it applied, by dotted path.

    ``source`` is a path, YAML text, or a dict as from :func:`to_dict` (a flat ``{key: value}`` mapping without a
    ``values`` section is accepted too). With a ``given`` section only the given values are applied (labelled as
    the dump labels them, or ``label``), and the computed ones are remembered for :func:`replay_changes`;
    without one every value is applied. With ``env``, the references in the values it applies are read
    (``${env:NAME}``, ``$${``: see :mod:`.env_refs`), and the values that read the environment are labelled
    ``env NAME`` (:func:`~.env_refs.note_env`).

    Args:
        configs: a fresh config object of the dump's class (nothing given or computed yet).
        source: the dump: a file path, YAML text, or a dict.
        label: what the applied values are labelled as given by (``'--config FILE'``), instead of the dump's own
            labels.
        env: read ``${env:…}`` references (False: the caller has read them already, and the values are applied as
            they are).

    Raises:
        BadValueError: the YAML is malformed or not a mapping; the file is missing, not a regular file (a FIFO, a
            device) or larger than ``lazylab.user_files.CONFIG`` allows; a malformed ``${…}`` or an unset variable
            (``FILE:LINE: key: …``).
        UnknownItemError, UnknownOptionError, BadValueError, AlreadyComputedError: see ``apply_overrides``.
    """
    doc, path, lines = _read(source)
    name = label or path or '<dump>'
    where = f' {path}' if path else ''  # for messages
    if not isinstance(doc, dict):
        raise BadValueError(f'a configuration YAML must be a mapping of keys to values{where and ":" + where}')
    if 'values' in doc:  # a dump: a key beside its sections (a setting written at the top by hand) would be lost
        unknown = [k for k in doc if k not in DUMP_SECTIONS]
        if unknown:
            raise UnknownItemError(f'{name}: {unknown[0]!r} is not a section of a dump (its sections: '
                                   f'{", ".join(DUMP_SECTIONS)}); a setting belongs under values:', str(unknown[0]))
    values = doc.get('values', doc)
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise BadValueError(f"the configuration YAML's 'values' must be a mapping{where and ':' + where}")
    given = doc.get('given') if 'values' in doc else None
    applied = {k: values[k] for k in given if k in values} if isinstance(given, dict) else dict(values)
    uses = {}
    if env:
        origins = {k: f'{path}:{lines[k]}' if k in lines else name for k in applied}
        applied, uses = expand_env(applied, origins)
    apply_overrides(configs, applied)
    if not isinstance(given, dict):
        if label is not None:
            label_given(configs, applied, label)
        note_env(configs, uses)
        return applied
    st = state_of(configs)
    labels = st.__dict__.setdefault('given', {})
    for k in applied:
        labels[k] = label if label is not None else str(given[k])
    note_env(configs, uses)
    expected = {k: v for k, v in values.items() if k not in given}
    for k, text in (doc.get('objects') or {}).items():
        if k not in given and isinstance(text, str):
            expected[k] = ('object', text.split(' (', 1)[0])
    unchecked = set(doc.get('computed_before_run') or ())
    st.__dict__['replay'] = Replay(name, applied, expected, unchecked)
    return applied


def label_given(configs: Any, keys, label: str) -> None:
    """Say where given values came from (``'user'``, ``'preset labml_nn'``, ``'--config FILE'``): the dump's
    ``given`` section and ``lazylab diff`` show it. ``keys`` are dotted paths given to ``configs`` (keys not given
    are ignored).

    Args:
        configs: the config object the values were given to.
        keys: dotted paths of given values.
        label: where they came from.
    """
    labels = state_of(configs).__dict__.setdefault('given', {})
    for k in keys:
        if k in labels:
            labels[k] = label


def replay_changes(configs: Any) -> list[Change]:
    """The computed values of the dump ``configs`` was loaded from that came out differently, although nothing
    they were computed from was given a new value since; ``[]`` when ``configs`` was not loaded from a dump with a
    ``given`` section. Call it once the configuration is computed (values not computed yet are not compared).

    A value counts as following the new values when any item it was computed from — the items its calculator
    read, for a value set by code the item whose computation set it, transitively — or a sub-config holding it is
    given now with a value the dump did not give.
    """
    st = state_of(configs)
    replay: Optional[Replay] = st.__dict__.get('replay')
    if replay is None:
        return []
    entries = _entries(configs)
    given_now, set_by = given_paths(st)
    changed = {p for p in given_now
               if p in entries and (p not in replay.given or replay.given[p] != _recorded_form(entries[p]))}
    provenance = {p: e.provenance for p, e in entries.items() if e.provenance is not None}
    declared, sub_configs = set(), set()
    for path, s, key in walk(st):
        declared.add(path)
        if key in s.children:
            sub_configs.add(path)
    memo: dict[str, bool] = {}

    def follows(path: str) -> bool:
        if path in memo:
            return memo[path]
        memo[path] = False  # cycles cannot happen in a computed configuration; this only stops a bad record
        parts = path.split('.')
        result = path in changed or any('.'.join(parts[:i]) in changed for i in range(1, len(parts)))
        if not result:
            p = provenance.get(path)
            deps = list(p.reads) if p is not None else []
            if path in set_by:
                deps.append(set_by[path])
            result = any(follows(d) for d in deps)
        memo[path] = result
        return result

    changes = []
    for path, recorded in replay.expected.items():
        if path in replay.unchecked or path in given_now:
            continue
        if path not in declared:
            if _item_removed(path, declared, sub_configs):
                changes.append(Change(path, recorded, None, replay.source))
            continue
        e = entries.get(path)
        if e is None or not e.computed:
            continue
        now = _recorded_form(e)
        if now != recorded and not follows(path):
            changes.append(Change(path, recorded, now, replay.source))
    return changes


def _recorded_form(e: _Entry) -> Any:
    return ('object', e.object_type) if e.text is _NOT_TEXT else e.text


def _item_removed(path: str, declared: set, sub_configs: set) -> bool:
    """Whether an item of the dump that is not declared now was removed from the code: it is a top-level item,
    or its sub-config exists now without it. (Items of a sub-config not created this time are simply not
    computed.)"""
    parts = path.split('.')
    for i in range(len(parts) - 1, 0, -1):
        prefix = '.'.join(parts[:i])
        if prefix in declared:
            return prefix in sub_configs
    return True
