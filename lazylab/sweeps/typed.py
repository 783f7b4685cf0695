"""A sweep's values typed and checked against an experiment's declarations, as `lazylab train` would type them.

The grammar (lazylab.sweeps.grammar) gives each swept key its values as text; here each is typed by its item —
its declared type, options and constraints — in a fresh configuration of the experiment with the fixed settings,
and every point of the grid (or each swept value, for a sampler) is checked as `lazylab train` checks a run before
it writes anything (lazylab.sweeps.points does that fast). Keys are named in full (`full_key`), and a key the
experiment does not have names the nearest ones (`unknown_key`).

Raises (everywhere): `lazylab.errors.UsageError` (or ConfigError, DataError) with a one-line message naming the key
and the value, before anything is written.
"""
import sys
from typing import Any, Callable, Optional

from lazylab.configs import ConfigError, UnknownItemError, inspect, nearest, parse_overrides
from lazylab.errors import UsageError
from lazylab.experiments import configure, discovery
from lazylab.sweeps.grammar import Dimension, Space
from lazylab.sweeps.points import PointChecker, check_all, make_configs


def full_key(conf: Any, key: str) -> str:
    """The declared path that command-line `key` names in `conf` (a fresh Configs of the experiment): the key
    itself, or the one declared path it is the end of (`ffn.glu_variant` → `transformer.ffn.glu_variant`), as
    `lazylab train` reads it (`lazylab.configs.inspect.expand_short_keys`); a key that names nothing is returned as
    it is (typing it names the nearest items: `unknown_key`).

    Raises:
        UnknownItemError: an end that several declared paths have (the message lists them, as train's does).
    """
    return next(iter(inspect.expand_short_keys(conf, {key: None})))


def unknown_key(name: str, conf: Any, key: str) -> str:
    """`NAME has no config item 'KEY'; did you mean 'PATH'?` for a key experiment NAME (its Configs, or one of
    them: `conf`) does not have: the nearest declared paths (by their ends of as many parts as the key has, so
    `glu_varant` finds `transformer.ffn.glu_variant`), as the messages about a configs.yaml dump name the
    experiment."""
    paths = inspect.declared_paths(conf)
    depth = key.count('.') + 1
    ends: dict[str, list[str]] = {}
    for p in paths:
        parts = p.split('.')
        if len(parts) >= depth:
            ends.setdefault('.'.join(parts[-depth:]), []).append(p)
    hits = []
    for end in nearest(key, ends):  # a declared path is named as it is (a top-level item), another end in full
        hits += [end] if end in paths else ends[end]
    hint = '; did you mean ' + ' or '.join(repr(h) for h in hits[:3]) + '?' if hits else ''
    return f'{name} has no config item {key!r}{hint}'


def type_space(name: str, fixed: list[str], dims: list[Dimension], checker: Optional[PointChecker] = None) -> Any:
    """Type and check every swept value against experiment NAME, as `lazylab train` would.

    Each value is first checked against its item's declaration (a fresh configuration with the fixed settings),
    then the first point's configuration is computed on the CPU (by `checker`, which keeps what later points can
    share; so that sub-configs exist and every key is known) and each value is typed by its item's declared type,
    options and constraints. Fills each dimension's `values` (or `low`, `high`, `is_int`). Every key a user can set
    can be swept, those other values are computed from included (`seq_len`, a warm-up's `seq_len_start`): a value
    is only ever given to a configuration in which nothing is computed yet.

    Args:
        name: the experiment (EXPERIMENT as written).
        fixed: the key=value tokens every trial gets (and `--config FILE`).
        dims: the swept dimensions, keys in full, values as text.
        checker: the sweep's PointChecker (a new one when None).

    Returns:
        The computed configuration of the first point.

    Raises:
        UsageError, ConfigError, DataError: one line naming the key (and the value), before anything is written.
    """
    first = {d.key: d.texts[0] if d.discrete else d.low_text for d in dims}
    conf = make_configs(name, fixed)
    for d in dims:  # what the declarations can tell before anything is computed, with the sweep named
        for text in (d.texts if d.discrete else (d.low_text, d.high_text)):
            try:
                parse_overrides([f'{d.key}={text}'], conf)
            except ConfigError as e:
                if isinstance(e, UnknownItemError) and e.path == d.key:
                    raise UsageError(f'{d.key}={d.written}: {unknown_key(name, conf, d.key)}') from None
                raise UsageError(f'{d.key}={d.written}: {str(e).splitlines()[0]}') from None
    # the device (and the dashboard) as the trials will see them, with the first point's values (so that a
    # warm-up's keys are checked together, swept or not); the points themselves are computed on the CPU
    configure.check_values(make_configs(name, fixed + [f'{k}={t}' for k, t in first.items()]))
    checker = checker or PointChecker(name, fixed, [d.key for d in dims])
    try:
        conf = checker.check(first)
    except UnknownItemError as e:  # a key below a sub-config, known once the sub-config is made
        d = next((d for d in dims if d.key == e.path), None)
        if d is None:
            raise
        declared = discovery.load_experiment(name).Configs
        raise UsageError(f'{d.key}={d.written}: {unknown_key(name, declared, d.key)}') from None
    for d in dims:
        type_dimension(d, *_owner(conf, d.key, name))
    return conf


def type_dimension(d: Dimension, view: Any, last: str) -> None:
    """Type the values (or the bounds) of `d` by its item, `last` (a key, dotted or not) of the config object
    `view`: fills `d.values`, or `d.low`, `d.high` and `d.is_int`.

    Raises:
        UsageError: a value the item does not take; an interval of an item that is not a number, empty, or on a log
            scale from lo ≤ 0 (naming `d.key` and what was written).
    """

    def typed(text: str) -> Any:
        try:
            return parse_overrides([f'{last}={text}'], view)[last]
        except ConfigError as e:
            raise UsageError(f'{d.key}={d.written}: {str(e).splitlines()[0]}') from None
    if d.discrete:
        d.values = [typed(t) for t in d.texts]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in d.values):
            d.int_step = None  # a range typed by a float item: drawn from its values
        return
    d.low, d.high = typed(d.low_text), typed(d.high_text)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (d.low, d.high)):
        raise UsageError(f'{d.key}={d.written}: interval() needs a number item; {d.key} takes '
                         f'{type(d.low).__name__} values')
    d.is_int = d.is_int or isinstance(d.low, int) and isinstance(d.high, int)
    if d.is_int:
        d.low, d.high = int(d.low), int(d.high)
    if not d.low < d.high:
        raise UsageError(f'{d.key}={d.written}: the interval is empty (lo must be < hi)')
    if d.log and d.low <= 0:
        raise UsageError(f'{d.key}={d.written}: tag(log, …) needs lo > 0')


def check_points(name: str, fixed: list[str], space: Space, grid: bool, checker: Optional[PointChecker] = None,
                 say: Optional[Callable[[str], None]] = None) -> None:
    """Check the sweep's other points as `type_space` checks its first (as `lazylab train` checks a run before it
    writes anything, on the CPU), so that a point that would fail in its trial (a text file that does not exist, a
    width its heads do not divide, a model too big for the memory) is an error before the sweep directory is made.

    Args:
        name, fixed: as for `type_space`.
        space: the typed space.
        grid: check every point of the grid; else (a sampler's) each value of a list or range, and the high end of
            each interval, with the other swept keys at their first values (what it will draw is not known yet).
        checker: the PointChecker of `type_space` (what the points share: see lazylab.sweeps.points).
        say: where the progress lines go (`checking point 1,200 of 5,000…` every few seconds; stderr by default).

    Raises:
        UsageError: the first bad point, in one line: `grid point 2 of 4 (text=b.txt): text file not found: b.txt`.
    """
    first = {d.key: d.texts[0] if d.discrete else d.low_text for d in space.dims}
    if grid:
        points = space.grid()[1:]
        checks = [(f'grid point {i} of {len(points) + 1}', space.texts(p)) for i, p in enumerate(points, 2)]
    else:
        others = ' (the other swept keys at their first values)' if len(space.dims) > 1 else ''
        checks = [(f'{d.key}={text}{others}', {**first, d.key: text})
                  for d in space.dims for text in (d.texts[1:] if d.discrete else [d.high_text])]
    checker = checker or PointChecker(name, fixed, [d.key for d in space.dims])
    check_all(checker, checks, where=(lambda tokens: f' ({tokens})') if grid else (lambda tokens: ''),
              say=say or (lambda line: print(line, file=sys.stderr, flush=True)))


def _owner(conf: Any, key: str, name: str) -> tuple[Any, str]:
    """A fresh config object of the class that holds `key` in the computed `conf`, which names its items by their
    full paths (so errors name the full key), and the key's last part.

    Raises:
        UsageError: no such key (a sub-config that the experiment does not have).
    """
    *parents, last = key.split('.')
    subs = inspect.sub_configs(conf)
    for i in range(len(parents)):
        if '.'.join(parents[:i + 1]) not in subs:
            raise UsageError(f'unknown key {key}: {".".join(parents[:i + 1])} is not a sub-config of {name} '
                             f'(see: lazylab options {name})')
    try:
        return inspect.fresh_sub_config(conf, '.'.join(parents)), last
    except TypeError:  # a class that cannot be made without arguments: typed by the computed configuration
        return conf, key
