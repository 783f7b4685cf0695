"""What to sweep: Hydra's multirun grammar (the override grammar, apart from the sweeper, as Hydra keeps it).

    key=a,b,c                     a choice: every value (a grid), or one of them per trial (random, tpe)
    key=choice(a,b,c)             the same
    key=range(start,stop[,step])  start, start+step, … up to but not including stop (Python's range; floats too;
                                  step= and start=/stop= may be named)
    key=interval(lo,hi)           every value in [lo, hi]: for --sampler random or tpe (an int item gives ints)
    key=tag(log, interval(lo,hi)) drawn on a log scale (also tag(log, range(…)) for ints)
    key=value                     fixed for every trial; [1,2] is one value (a list), 'a,b' (quoted) one string

Values are text until typed by the item they are given to, exactly as `key=value` on `lazylab train` (so an int
item's values stay ints, an option name stays a name, and `1e-3` for a float item is 0.001): typing is
`lazylab.sweeps.typed`'s, against an experiment's declarations; this module knows no experiment. Elements are
separated by commas outside quotes and brackets, so `(0.9,0.99),(0.8,0.9)` is a choice of two tuples; a comma
inside a value is written `\\,` or the value is quoted. glob(), shuffle(), sort() and the casts int()/float()/
str()/bool() of Hydra's grammar are not supported (each is an error naming it).

`parse_value(text)` gives a `Fixed` or a `Dimension`; `Space` is the swept dimensions with their typed values and
the zipped groups; `Space.grid()` lists the grid's points in a stable order (the keys in command-line order, the
last one fastest; a zipped group moves together, at the place of its first key).

Pure: it imports neither torch nor lazylab's configs or experiments (tests/sweeps/test_grammar.py checks it).

Raises (everywhere): `lazylab.errors.UsageError` with a one-line message naming the key and the value.
"""
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from lazylab.errors import UsageError, shown

FUNCTIONS = ('choice', 'range', 'interval', 'tag')
UNSUPPORTED = ('glob', 'shuffle', 'sort', 'int', 'float', 'str', 'bool', 'extend_list')
TAGS = ('log', 'int')
_CALL = re.compile(r'^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$', re.S)
_OPEN, _CLOSE = '([{', ')]}'


@dataclass
class Fixed:
    """A value for every trial, as text (the engine types it)."""
    text: str


@dataclass
class Dimension:
    """A swept key.

    kind 'choice': `texts`, the values as written (typed later into `values`).
    kind 'interval': `low_text`, `high_text` (typed into `low`, `high`), `log`, and `is_int` once typed.
    `written` is what the user wrote, for messages.

    Args:
        key: the config key swept (`lazylab.sweeps.plan` names it in full).
        kind: 'choice' (a list, choice() or range()) or 'interval' (interval()).
        written: the text after `key=` as the user wrote it, for messages.
        texts: a choice's values as written (outer quotes removed, escapes undone), in order.
        values: a choice's values typed by the item (`lazylab.sweeps.typed`), in the order of `texts`.
        low_text, high_text: an interval's bounds as written.
        low, high: an interval's typed bounds (ints or floats); for a range of ints, its least and greatest value.
        log: drawn on a log scale (`tag(log, …)`).
        is_int: an interval drawn as ints (an int item, or `tag(int, …)`).
        int_step: a range of ints with a positive step: --sampler random or tpe draws it as an int with this step
            (None otherwise, and for a range typed by a float item).
    """
    key: str
    kind: str
    written: str
    texts: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    low_text: str = ''
    high_text: str = ''
    low: Any = None
    high: Any = None
    log: bool = False
    is_int: bool = False
    int_step: Optional[int] = None  # a range of ints: random/tpe draw it as an int with this step

    @property
    def discrete(self) -> bool:
        """A choice of values (a list or a range), not an interval."""
        return self.kind == 'choice'

    def describe(self) -> dict[str, Any]:
        """The dimension as sweep.yaml records it."""
        if self.kind == 'choice':
            return {'choice': [plain(v) for v in self.values]}
        return {'interval': [self.low, self.high], 'log': self.log, 'int': self.is_int}

    def text_of(self, value: Any) -> str:
        """The text of `value` for a key=value override of a trial (the text written, for a choice)."""
        if self.kind == 'choice':
            for v, t in zip(self.values, self.texts):
                if same(v, value):
                    return t
            raise ValueError(f'{shown(value)} is not a value of {self.key}')
        return str(int(value)) if self.is_int else repr(float(value))


def same(a: Any, b: Any) -> bool:
    """Equal as Optuna stores them, type included (1 is not 1.0)."""
    pa, pb = plain(a), plain(b)
    return type(pa) is type(pb) and pa == pb


def plain(v: Any) -> Any:
    """A value as Optuna can store it (None, bool, int, float, str); anything else as its text."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


# --- parsing ------------------------------------------------------------------------------------------------

def split_top(text: str, sep: str = ',') -> list[str]:
    """`text` split at `sep` outside quotes and brackets; a backslash escapes the next character.

    Raises:
        UsageError: unbalanced quotes or brackets (the caller adds the key).
    """
    parts, depth, quote, cur, i = [], [], None, [], 0
    while i < len(text):
        ch = text[i]
        if ch == '\\' and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = None
        elif ch in '\'"':
            quote = ch
        elif ch in _OPEN:
            depth.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not depth or depth.pop() != ch:
                raise UsageError(f'unbalanced {ch!r}')
        elif ch == sep and not depth:
            parts.append(''.join(cur))
            cur = []
            i += 1
            continue
        cur.append(ch)
        i += 1
    if quote or depth:
        raise UsageError(f'unclosed {quote or "bracket"}')
    parts.append(''.join(cur))
    return parts


def element_text(raw: str) -> str:
    """One element as the engine should read it: outer quotes removed (a quoted element is a string), escapes
    undone, spaces around it dropped."""
    t = raw.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in '\'"':
        return t[1:-1].replace('\\' + t[0], t[0])
    return re.sub(r'\\(.)', r'\1', t)


def parse_value(key: str, text: str) -> Union[Fixed, Dimension]:
    """The text after `key=`: a fixed value or a swept dimension (see the module docstring).

    Args:
        key: the key as written before `=` (the dimension's key, and the start of a message).
        text: what follows `=`, e.g. `1,2,3`, `range(2,8,2)`, `tag(log, interval(1e-4,1e-2))` or a fixed value.

    Raises:
        UsageError: a bad sweep, e.g. `range(1,a)`, an unknown or unsupported function, an empty element.
    """
    try:
        return _parse(key, text)
    except UsageError as e:
        message = str(e)
        if message.startswith(f'{key}='):
            raise
        raise UsageError(f'{key}={text}: {message}') from None


def _parse(key: str, text: str) -> Union[Fixed, Dimension]:
    call = _CALL.match(text)
    if call and call.group(1) in FUNCTIONS + UNSUPPORTED and _is_one_call(text):
        return _function(key, text, call.group(1), call.group(2))
    parts = split_top(text)
    if len(parts) == 1:  # one value: as written (spaces kept), but unquoted and unescaped
        quoted = text.strip()[:1] in '\'"' and len(text.strip()) >= 2 and text.strip()[-1] == text.strip()[0]
        return Fixed(element_text(text) if quoted else re.sub(r'\\([,()\[\]{}\'"\\])', r'\1', text))
    return _choice(key, text, parts)


def _is_one_call(text: str) -> bool:
    """Whether `name(…)` spans the whole text (not `f(1),g(2)`)."""
    try:
        return len(split_top(text)) == 1
    except UsageError:
        return False


def _choice(key: str, written: str, parts: list[str]) -> Dimension:
    texts = []
    for p in parts:
        if not p.strip():
            raise UsageError('an empty value in the list (a trailing or doubled comma?)')
        if _CALL.match(p) and _CALL.match(p).group(1) in FUNCTIONS + UNSUPPORTED:
            raise UsageError(f'{p.strip()} cannot be an element of a list')
        texts.append(element_text(p))
    return Dimension(key, 'choice', written, texts=texts)


def _function(key: str, written: str, name: str, body: str) -> Dimension:
    if name in UNSUPPORTED:
        raise UsageError(f'{name}() is not supported by lazylab sweep (use a,b,c, choice(), range(), interval() or '
                         f'tag(log, …))')
    args = [a for a in split_top(body)] if body.strip() else []
    if name == 'choice':
        if not args:
            raise UsageError('choice() needs at least one value')
        return _choice(key, written, args)
    if name == 'tag':
        if len(args) < 2:
            raise UsageError('tag() needs tags and a sweep: tag(log, interval(lo,hi))')
        tags = [a.strip() for a in args[:-1]]
        for t in tags:
            if t not in TAGS:
                raise UsageError(f'unknown tag {t!r} (tags: {", ".join(TAGS)})')
        inner = _parse(key, args[-1].strip())
        if not isinstance(inner, Dimension) or inner.kind == 'choice' and inner.int_step is None and 'log' in tags:
            raise UsageError('tag(log, …) needs interval(lo,hi) or a range of ints')
        inner.written = written
        inner.log = inner.log or 'log' in tags
        if 'int' in tags:
            inner.is_int = True
        return inner
    if name == 'interval':
        if len(args) != 2 or any(not a.strip() or '=' in a for a in args):
            raise UsageError('interval() needs two bounds: interval(lo,hi)')
        for a in args:
            _number(a)
        return Dimension(key, 'interval', written, low_text=args[0].strip(), high_text=args[1].strip())
    return _range(key, written, args)


def _number(text: str) -> Union[int, float]:
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
    except ValueError:
        raise UsageError(f'{t!r} is not a number') from None
    if not math.isfinite(v):
        raise UsageError(f'{t!r} is not a finite number')
    return v


def _range(key: str, written: str, args: list[str]) -> Dimension:
    named: dict[str, str] = {}
    positional: list[str] = []
    for a in args:
        k, eq, v = a.partition('=')
        if eq:
            if k.strip() not in ('start', 'stop', 'step') or k.strip() in named:
                raise UsageError(f'range() takes start, stop, step; got {a.strip()!r}')
            named[k.strip()] = v
        elif named:
            raise UsageError('range(): a positional argument after a named one')
        else:
            positional.append(a)
    if len(positional) > 3 or not (positional or named):
        raise UsageError('range() needs range(start,stop[,step])')
    if len(positional) == 1 and 'stop' not in named:
        positional = ['0'] + positional  # range(stop), as in Python
    slots = dict(zip(('start', 'stop', 'step'), positional))
    for k, v in named.items():
        if k in slots:
            raise UsageError(f'range() got {k} twice')
        slots[k] = v
    if 'stop' not in slots:
        raise UsageError('range() needs a stop')
    start, stop, step = (_number(slots.get(k, d)) for k, d in (('start', '0'), ('stop', ''), ('step', '1')))
    if step == 0:
        raise UsageError('range() step must not be 0')
    ints = all(isinstance(v, int) for v in (start, stop, step))
    # floats: round the count first, so that range(0.1,0.4,0.1) stops before 0.4 (0.3/0.1 is 3.0000000000000004)
    n = math.ceil((stop - start) / step if ints else round((stop - start) / step, 9))
    if n <= 0:
        raise UsageError('range() is empty')
    if n > 100_000:
        raise UsageError(f'range() has {n:,} values; that is not a grid to run')
    values = [start + i * step if ints else float(f'{start + i * step:.12g}') for i in range(n)]
    d = Dimension(key, 'choice', written, texts=[str(v) if ints else repr(v) for v in values])
    if ints:
        d.int_step = step if step > 0 else None
        d.low, d.high = (values[0], values[-1]) if step > 0 else (values[-1], values[0])
    return d


# --- the space --------------------------------------------------------------------------------------------

class Space:
    """The swept dimensions (typed), in command-line order, and the zipped groups.

    Args:
        dims: the dimensions, values already typed (see `type_values`).
        zips: groups of keys that move together in the grid (each key in one group at most).

    Raises:
        UsageError: a zipped key that is not swept or not a choice; zipped keys of unequal lengths; a key in two
            groups; a duplicate value in a choice.
    """

    def __init__(self, dims: list[Dimension], zips: list[list[str]] = ()):
        self.dims = dims
        self.by_key = {d.key: d for d in dims}
        seen: set[str] = set()
        for group in zips:
            for k in group:
                if k not in self.by_key:
                    raise UsageError(f'--zip {",".join(group)}: {k} is not swept')
                if not self.by_key[k].discrete:
                    raise UsageError(f'--zip {",".join(group)}: {k} is an interval; only lists and ranges zip')
                if k in seen:
                    raise UsageError(f'--zip: {k} is in two groups')
                seen.add(k)
            if len(group) < 2:
                raise UsageError(f'--zip {",".join(group)}: give two or more keys')
            lengths = {k: len(self.by_key[k].values) for k in group}
            if len(set(lengths.values())) > 1:
                raise UsageError(f'--zip {",".join(group)}: the keys have different numbers of values ('
                                 + ', '.join(f'{k}: {n}' for k, n in lengths.items()) + ')')
        self.zips = [list(g) for g in zips]
        for d in dims:
            if d.discrete:
                for i, v in enumerate(d.values):
                    if any(same(v, w) for w in d.values[:i]):
                        raise UsageError(f'{d.key}={d.written}: {d.texts[i]} is given twice')

    @property
    def discrete(self) -> bool:
        """Every dimension a choice: the space is a grid."""
        return all(d.discrete for d in self.dims)

    def axes(self) -> list[list[str]]:
        """The grid's axes: one key, or a zipped group of keys, at the place of its first key."""
        axes, done = [], set()
        for d in self.dims:
            if d.key in done:
                continue
            group = next((g for g in self.zips if d.key in g), [d.key])
            axes.append(group)
            done.update(group)
        return axes

    def grid(self) -> list[dict[str, Any]]:
        """Every point of the grid, {key: typed value}, in the stable order of the module docstring."""
        axes = self.axes()
        choices = [[{k: self.by_key[k].values[i] for k in group}
                    for i in range(len(self.by_key[group[0]].values))] for group in axes]
        return [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*choices)]

    def size(self) -> Optional[int]:
        """The number of grid points (None when a dimension is continuous)."""
        return len(self.grid()) if self.discrete else None

    def describe(self) -> dict[str, Any]:
        """{key: its dimension as sweep.yaml records it}."""
        return {d.key: d.describe() for d in self.dims}

    def overrides(self, params: dict[str, Any]) -> list[str]:
        """The key=value tokens of a trial with these params (typed values, as Optuna holds them).

        Args:
            params: {key: typed value} for every swept key.
        """
        return [f'{k}={t}' for k, t in self.texts(params).items()]

    def texts(self, params: dict[str, Any]) -> dict[str, str]:
        """{key: the text a trial with these params is given}, in the dimensions' order.

        Args:
            params: {key: typed value} for every swept key (a choice's value must be one of its values).
        """
        return {d.key: d.text_of(params[d.key]) for d in self.dims}

    def shown(self, params: dict[str, Any]) -> list[str]:
        """The key=value tokens of a trial as its progress lines show them: `overrides`, but a float drawn from an
        interval with 4 significant digits (`optimizer.learning_rate=0.001235`; the trial gets, and its records
        keep, the full value).

        Args:
            params: {key: typed value} for every swept key.
        """
        return [f'{d.key}={params[d.key]:.4g}' if d.kind == 'interval' and not d.is_int
                else f'{d.key}={d.text_of(params[d.key])}' for d in self.dims]
