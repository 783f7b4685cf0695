"""Command-line overrides: ``key=value`` and ``child.key=value`` tokens.

    parse_overrides(['d_model=256', 'optimizer.learning_rate=1e-3'])
        == {'d_model': '256', 'optimizer.learning_rate': '1e-3'}
    parse_overrides([...], conf)      # the same, typed and checked against conf (nothing applied)
    apply_overrides(conf, {...})      # type, check, then apply all (or raise and apply none)

Text is typed by the item's declared type (see :mod:`lazylab.configs.coerce`); a string naming one of an
item's options stays the option name.
"""
from typing import Any, Dict, Mapping, Optional, Sequence

from . import overrides
from .errors import OverrideSyntaxError
from .state import state_of


def parse_overrides(argv: Sequence[str], configs: Optional[Any] = None) -> Dict[str, Any]:
    """Split ``key=value`` tokens into a dict (later tokens win).

    Without ``configs`` the values are the text given. With a config object they are typed and checked
    against its declared items (nothing is applied); dotted keys for sub-configs not created yet stay text
    when their class is not known.

    Raises:
        OverrideSyntaxError: a token without ``=`` or with an empty key.
        UnknownItemError, UnknownOptionError, BadValueError, AlreadyComputedError: with ``configs``.
    """
    values: Dict[str, str] = {}
    for token in argv:
        key, eq, text = token.partition('=')
        key = key.strip()
        if not eq or not key:
            raise OverrideSyntaxError(f'expected key=value, got {token!r}')
        if key.startswith('--'):  # tolerate `--key=value`
            key = key[2:]
        values[key] = text
    if configs is None:
        return values
    checked = overrides.plan(state_of(configs), values, from_text=True)
    return _flatten(checked, '')


def _flatten(p: 'overrides.Plan', prefix: str) -> Dict[str, Any]:
    out = {prefix + k: v for k, v in p.direct.items()}
    for top, child in p.children.items():
        out.update(_flatten(child, f'{prefix}{top}.'))
    for top, sub in p.pending.items():
        out.update({f'{prefix}{top}.{k}': v for k, (v, _) in sub.items()})
    return out


def apply_overrides(configs: Any, values: Mapping[str, Any]):
    """Apply overrides given as text or YAML-parsed values (dotted keys reach sub-configs), all-or-nothing.

    Strings are parsed by each item's declared type (an option name stays a string); other values are fitted
    to it (an int for a float item, a list for a tuple item).

    Raises:
        UnknownItemError: an undeclared key (names the nearest declared ones); nothing is applied.
        UnknownOptionError: text that is neither an option nor a value of the item's type.
        BadValueError: text that does not parse as the declared type (names key, type and text).
        AlreadyComputedError: an item that was already computed.
    """
    overrides.set_overrides(state_of(configs), dict(values), from_text=True)
