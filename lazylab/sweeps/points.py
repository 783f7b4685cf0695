"""Checking a sweep's points before anything is written, each as `lazylab train` checks a run, many of them fast.

A point's check is the one `lazylab train` makes before it writes anything, on the CPU: a fresh configuration of
the experiment with the fixed settings and the point's values, then `configure.check_values` and `configure.compute`
(memory, data, model, step count, every plain item; not the optimizer, which the trials build, nor the pass on a
first batch). Done for every point of a 5,000-point grid that is ten minutes of reading the same text and building
the same model; `PointChecker` shares what does not depend on the point, from the configuration engine's record of
what each item was computed from — the items its calculator read, the item whose computation set it, the sub-config
that holds it and the selectors of its aggregates, transitively — reduced to the swept keys (an item *follows* the
swept keys it was computed from):

- objects: a computed object (the dataset, the task, the model and its parts; not a sub-config, not a plain value,
  not one whose computation set other items) is kept with the values the point had on the keys it follows, and given
  to the configuration of a later point with the same values there, so the engine does not compute it again (the
  dataset is read once unless the text or seq_len is swept, the model built once per value of the keys that shape
  it). At most `KEEP` objects per item are kept (the last used).
- whole points: a point whose values equal those of a point already checked on every swept key that check followed —
  through the items computed, and through what `check_values` and `compute` read themselves — would be computed
  exactly as that one was, so it passes without being computed. (Each swept value on its own was checked when it
  was typed, `lazylab.sweeps.typed.type_space`, so the plain reading of a swept key counts for no point.)

Points are identified by their override texts (`{key: text}`): two texts of one value count as two values. The
record is read through the public view of a config, `lazylab.configs.inspect` (`items`, `set_by`, `reads_outside`).
"""
import time
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch

from lazylab.configs import ConfigError, apply_overrides, inspect
from lazylab.errors import UsageError, plural, user_error_message
from lazylab.experiments import configure

#: objects kept per item, the last used
KEEP = 16
#: seconds between two progress lines
PROGRESS_EVERY = 5.0


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_is_plain(v) for v in value)


def make_configs(name: str, tokens: list[str]) -> Any:
    """`lazylab.experiments.configure.make_configs` of key=value `tokens`, each `--config FILE` among them as the
    sweep's plan appends them (in order: stacked as `lazylab train` stacks them).

    Raises:
        UsageError, ConfigError: as `lazylab train` (an unknown experiment, a bad key, value or file).
    """
    settings, config, rest = [], [], iter(tokens)
    for token in rest:
        if token == '--config':
            config.append(next(rest))
        else:
            settings.append(token)
    return configure.make_configs(name, settings, config=config)


class PointChecker:
    """Checks points of a sweep of experiment NAME (see the module docstring).

    Args:
        name: the experiment.
        fixed: the key=value tokens (and --config FILE) every trial gets.
        keys: the swept keys, in full.

    Attributes:
        computed, skipped: how many points were computed, and how many passed as copies of one computed.
    """

    def __init__(self, name: str, fixed: list[str], keys: list[str]):
        self.name, self.keys = name, set(keys)
        cpu = [] if [a for a in fixed if a.startswith('device=')] == ['device=cpu'] else ['device=cpu']
        self.fixed = list(fixed) + cpu
        self.objects: dict[str, OrderedDict] = {}   # item path -> {((key, text), …): object}
        self.passed: dict[tuple[str, ...], set[tuple[str, ...]]] = {}   # followed keys -> their texts in points
        self.unshared: set[str] = set()
        self.computed = self.skipped = 0

    def covered(self, point: dict[str, str]) -> bool:
        """Whether `point` would be computed exactly as a point checked already (so it passes)."""
        return any(tuple(point[k] for k in keys) in seen for keys, seen in self.passed.items())

    def check(self, point: dict[str, str]) -> Optional[Any]:
        """Check `point` ({key: text}); returns its computed configuration, or None when it was `covered`.

        Raises:
            UsageError, ConfigError, DataError: as `lazylab train` would, before writing anything.
        """
        if self.covered(point):
            self.skipped += 1
            return None
        threads = torch.get_num_threads()
        try:
            conf = make_configs(self.name, self.fixed + [f'{k}={t}' for k, t in point.items()])
            given = self._give(conf, point)
            with inspect.reads_outside(conf) as top:  # what the checks read themselves (not the plain items' listing)
                configure.check_values(conf)
                configure.compute(conf, optimizer=False, plain=False)
            configure.compute_plain(conf)
        finally:
            torch.set_num_threads(threads)
        self._learn(conf, point, given, top)
        self.computed += 1
        return conf

    def _give(self, conf: Any, point: dict[str, str]) -> dict[str, tuple[tuple, Any]]:
        """Give `conf` the kept objects that fit `point`; returns them, {item path: (followed (key, text) pairs,
        object)}. An object its item will not take as a given value (its declared type says otherwise) is
        computed instead, and no longer kept."""
        given = self._shared(point)
        try:
            apply_overrides(conf, {path: value for path, (_, value) in given.items()})
        except ConfigError:  # (all or nothing) one at a time, then
            for path, (_, value) in list(given.items()):
                try:
                    apply_overrides(conf, {path: value})
                except ConfigError:
                    del given[path], self.objects[path]
                    self.unshared.add(path)
        return given

    def _shared(self, point: dict[str, str]) -> dict[str, tuple[tuple, Any]]:
        """{item path: (followed (key, text) pairs, object)} of the kept objects that fit `point`."""
        found = {}
        for path, kept in self.objects.items():
            for follows, value in kept.items():
                if all(point.get(k) == t for k, t in follows):
                    kept.move_to_end(follows)
                    found[path] = (follows, value)
                    break
        return found

    def _learn(self, conf: Any, point: dict[str, str], given: dict[str, tuple[tuple, Any]], top: list[str]):
        """Keep the new objects of `conf` and record the keys its whole check followed."""
        record = _Record(conf, self.keys, {path: {k for k, _ in f} for path, (f, _) in given.items()})
        followed = set(record.follows_all(top))
        for path, item in record.items.items():
            if path in self.keys:  # a swept key: given, its own value checked when typed; where it lives counts
                followed |= record.follows_holders(path)
                continue
            followed |= record.follows(path)
            value = item.value
            if path in given or item.sub_config is not None or _is_plain(value) or path in record.setters \
                    or path in self.unshared:
                continue
            kept = self.objects.setdefault(path, OrderedDict())
            kept[tuple(sorted((k, point[k]) for k in record.follows(path)))] = value
            while len(kept) > KEEP:
                kept.popitem(last=False)
        keys = tuple(sorted(followed))
        self.passed.setdefault(keys, set()).add(tuple(point[k] for k in keys))


class _Record:
    """What each computed item of `conf` follows, among the swept `keys` (see the module docstring).

    `given`: {item path: the keys it follows} for the objects given to `conf` from another point (computed there).
    """

    def __init__(self, conf: Any, keys: set[str], given: dict[str, set[str]]):
        self.keys, self.given = keys, given
        self.set_by = inspect.set_by(conf)
        self.setters = set(self.set_by.values())
        self.items = {item.path: item for item in inspect.items(conf) if item.computed}
        self.memo: dict[str, frozenset] = {}

    def follows(self, path: str) -> frozenset:
        """The swept keys item `path` was computed from, transitively (itself, when it is one)."""
        if path in self.memo:
            return self.memo[path]
        self.memo[path] = frozenset()  # a computed configuration has no cycles; this only ends a bad record
        if path in self.given:
            out = frozenset(self.given[path])
        else:
            out = frozenset({path}) & self.keys | self.follows_holders(path)
            for dep in self._inputs(path):
                out |= self.follows(dep)
        self.memo[path] = out
        return out

    def follows_holders(self, path: str) -> frozenset:
        """What the sub-configs holding item `path` follow (how each was made decides what the item starts from)."""
        parts = path.split('.')
        out = frozenset()
        for i in range(1, len(parts)):
            out |= self.follows('.'.join(parts[:i]))
        return out

    def follows_all(self, paths: list[str]) -> frozenset:
        """What the items `paths` follow, together."""
        out = frozenset()
        for p in paths:
            out |= self.follows(p)
        return out

    def _inputs(self, path: str) -> list[str]:
        item = self.items.get(path)
        if item is None:
            return []
        inputs = list(item.reads)
        if path in self.set_by:
            inputs.append(self.set_by[path])
        # an aggregate's selector decides the item's value even when it selected nothing (it is then not read)
        return inputs + list(item.selectors)


def check_all(checker: PointChecker, checks: list[tuple[str, dict[str, str]]], *, where: Callable[[str], str],
              say: Callable[[str], None]) -> None:
    """Check each (label, point) of `checks` with `checker`; a line `checking point N of M…` every
    `PROGRESS_EVERY` seconds through `say`.

    Raises:
        UsageError: the first bad point: `LABEL (WHERE): message` (`where(tokens)` gives the part in brackets).
    """
    last = time.monotonic()
    for i, (label, point) in enumerate(checks, 1):
        if time.monotonic() - last >= PROGRESS_EVERY:
            say(f'checking point {i:,} of {len(checks):,}…')
            last = time.monotonic()
        try:
            checker.check(point)
        except Exception as e:
            message = user_error_message(e)
            if message is None:
                raise
            tokens = ' '.join(f'{k}={t}' for k, t in point.items())
            raise UsageError(f'{label}{where(tokens)}: {message}') from None


def describe_counts(checker: PointChecker) -> str:
    """`N points computed, M as copies of one computed` (for benchmarks and -v lines)."""
    return f'{plural(checker.computed, "point")} computed, {checker.skipped:,} as copies of one computed'
