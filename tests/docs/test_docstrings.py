"""Every public class and function the API reference shows has a complete docstring.

The shown objects are read from the `::: NAME` directives of docs/reference/api/*.md, as mkdocstrings renders them:
a module's `members:` list (or, without one, its `__all__`, else what it defines), a class and the public methods it
defines itself (not the inherited ones). The rules:

1. **A summary line**: the docstring's first line says what the object is or does.
2. **`Args:`** for a function, method or class (its constructor) that takes arguments: an `Args:` (or `Shapes:`)
   section naming each one (`q, k:` names two). Not asked of the methods of a class whose docstring gives the
   tensors under `Shapes:` (the models' habit: one place for every shape; their `forward` may then go without a
   docstring), of a class that inherits its constructor, of an exception (its argument is the message), of private
   `_name` arguments, nor of a single argument the summary line names in backticks.
3. **`Raises:`** where the body raises a lazylab error (`lazylab.errors.LazylabError`) or a config error
   (`lazylab.configs.ConfigError`) itself, `raise X(…)` or `raise f(…)` with f annotated to return X: a `Raises:`
   section naming X or one of its lazylab bases.

Every shown object meets them; EXPECTED (empty) is where an exception would be listed, with its reason, and a name
that meets its rules while listed fails too, so the list can only shrink.
"""
import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from lazylab.configs import ConfigError
from lazylab.errors import LazylabError

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = sorted((ROOT / 'docs' / 'reference' / 'api').glob('*.md'))

#: (object, rule) pairs allowed to break a rule: none. A new public name the reference shows must come with its
#: docstring complete; an entry here would need a reason beside it.
EXPECTED: set[tuple[str, str]] = set()

_DIRECTIVE = re.compile(r'^::: ([\w.]+)[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n(?=[ \t]+\S))*)', re.M)


def directives() -> list[tuple[str, str, dict]]:
    """(page, dotted name, options) of every `::: NAME` on the API pages."""
    out = []
    for page in API_PAGES:
        text = page.read_text(encoding='utf-8')
        for m in _DIRECTIVE.finditer(text):
            block = yaml.safe_load(textwrap.dedent(m.group(2))) if m.group(2).strip() else None
            out.append((page.name, m.group(1), (block or {}).get('options', {}) or {}))
    return out


def resolve(name: str) -> Any:
    """The object a dotted name stands for: a module, or an attribute of the longest importable prefix."""
    parts = name.split('.')
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _is_shown(obj: Any) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj)


def _own_methods(cls: type, names: Optional[list[str]] = None) -> list[tuple[str, Any]]:
    out = []
    for key, value in vars(cls).items():
        if names is not None and key not in names:
            continue
        if names is None and key.startswith('_'):
            continue
        func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        func = func.fget if isinstance(func, property) else func
        if inspect.isfunction(func):
            out.append((f'{cls.__module__}.{cls.__qualname__}.{key}', func))
    return out


def shown_objects() -> dict[str, Any]:
    """Dotted name → object, for every class, function and method the API pages show."""
    shown: dict[str, Any] = {}

    def add_class(name: str, cls: type, members: Optional[list[str]] = None):
        shown[name] = cls
        shown.update(_own_methods(cls, members))

    for _, name, options in directives():
        obj = resolve(name)
        members = options.get('members')
        if inspect.ismodule(obj):
            if members is False:
                continue
            if not members:
                members = getattr(obj, '__all__', None) or [
                    k for k, v in vars(obj).items()
                    if not k.startswith('_') and _is_shown(v) and v.__module__ == obj.__name__]
            for member in members:
                value = getattr(obj, member)
                if inspect.isclass(value):
                    add_class(f'{name}.{member}', value)
                elif inspect.isfunction(value):
                    shown[f'{name}.{member}'] = value
        elif inspect.isclass(obj):
            add_class(name, obj, members if isinstance(members, list) else None)
        elif inspect.isfunction(obj):
            shown[name] = obj
    return shown


# ---- the rules ----

_SECTION = re.compile(r'^(\w[\w ]*?)(?: \([^)]*\))?:\s*$')


def sections(doc: str) -> dict[str, str]:
    """Google-style sections of a docstring: title → body (dedented)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in inspect.cleandoc(doc).splitlines():
        m = _SECTION.match(line)
        if m and not line.startswith(' '):
            current = m.group(1)
            out[current] = []
        elif current is not None:
            if line and not line.startswith(' '):
                current = None
            else:
                out[current].append(line)
    return {k: textwrap.dedent('\n'.join(v)) for k, v in out.items()}


def documented_args(doc: str) -> set[str]:
    """The names an `Args:` (or `Shapes:`) section of `doc` documents: `name:`, `a, b:`, `name (type):`."""
    names: set[str] = set()
    found = sections(doc)
    for line in (found.get('Args', '') + '\n' + found.get('Shapes', '')).splitlines():
        m = re.match(r'^([\w*][\w*, ]*?)(?: \([^)]*\))?:', line)
        if m and not line.startswith(' '):
            names.update(n.strip().lstrip('*') for n in m.group(1).split(','))
    return names


def parameters(func: Any) -> list[str]:
    """The arguments a caller gives: not self/cls, not *args/**kwargs, not the private `_name` ones."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params and params[0].name in ('self', 'cls'):
        params = params[1:]
    return [p.name for p in params if not p.name.startswith('_')]


def _owner_class(name: str, obj: Any, shown: dict[str, Any]) -> Optional[type]:
    owner = shown.get(name.rsplit('.', 1)[0])
    return owner if inspect.isclass(owner) and not inspect.isclass(obj) else None


def missing_args(name: str, obj: Any, shown: dict[str, Any]) -> list[str]:
    func = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj) and (func is object.__init__ or issubclass(obj, BaseException)):
        return []  # an exception's arguments are its message
    if inspect.isclass(obj) and '__init__' not in vars(obj):
        return []  # the constructor is a base class's, documented (and checked) there
    params = parameters(func)
    if not params:
        return []
    doc = obj.__doc__ or ''
    owner = _owner_class(name, obj, shown)
    if owner is not None and 'Shapes' in sections(owner.__doc__ or ''):
        return []
    if inspect.isclass(obj) and func.__doc__ and func.__qualname__.startswith(obj.__qualname__ + '.'):
        doc += '\n' + func.__doc__  # the constructor's own docstring counts (mkdocstrings merges it)
    summary = (doc.strip().splitlines() or [''])[0]
    if len(params) == 1 and f'`{params[0]}`' in summary:
        return []
    return [p for p in params if p not in documented_args(doc)]


def _user_error(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, (LazylabError, ConfigError))


def raised_errors(obj: Any) -> list[type]:
    """The lazylab and config errors the body raises itself (`raise X(…)`, or `raise f(…)` with f → X)."""
    func = obj.__init__ if inspect.isclass(obj) else obj
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return []
    scope = getattr(inspect.unwrap(func), '__globals__', {})
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Raise) and node.exc is not None):
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if not isinstance(target, ast.Name):
            continue
        value = scope.get(target.id)
        if inspect.isfunction(value):
            value = getattr(value, '__annotations__', {}).get('return')
        if _user_error(value) and value not in found:
            found.append(value)
    return found


def missing_raises(obj: Any) -> list[str]:
    errors = raised_errors(obj)
    if not errors:
        return []
    doc = (obj.__doc__ or '') + ('\n' + (obj.__init__.__doc__ or '') if inspect.isclass(obj) else '')
    told = {title: body for title, body in sections(doc).items() if title.startswith('Raises')}
    text = ' '.join(told.values())
    return [e.__name__ for e in errors
            if not any(re.search(rf'\b{b.__name__}\b', text) for b in e.__mro__ if _user_error(b))]


def _is_call_of_documented_module(name: str, obj: Any, shown: dict[str, Any]) -> bool:
    """`forward` without a docstring of a module whose class docstring gives the call's tensors under `Shapes:`."""
    owner = _owner_class(name, obj, shown)
    return (name.endswith('.forward') and not (obj.__doc__ or '').strip() and owner is not None
            and 'Shapes' in sections(owner.__doc__ or ''))


def problems() -> dict[tuple[str, str], str]:
    """(name, rule) → what is missing, for every shown object that breaks a rule."""
    shown = shown_objects()
    out: dict[tuple[str, str], str] = {}
    for name, obj in shown.items():
        doc = obj.__doc__
        if _is_call_of_documented_module(name, obj, shown):
            continue
        if not doc or not doc.strip() or not doc.strip().splitlines()[0].strip():
            out[(name, 'summary')] = 'no docstring, or no summary line'
            continue
        args = missing_args(name, obj, shown)
        if args:
            out[(name, 'args')] = 'Args: does not name ' + ', '.join(args)
        raises = missing_raises(obj)
        if raises:
            out[(name, 'raises')] = 'Raises: does not name ' + ', '.join(raises)
    return out


# ---- the tests ----

def test_the_api_pages_show_the_public_modules():
    names = {name for _, name, _ in directives()}
    for module in ('lazylab.configs', 'lazylab.experiments', 'lazylab.models.feedback', 'lazylab.models.fast_weights',
                   'lazylab.models.fast_weights.feature_maps', 'lazylab.models.fast_weights.gated_delta_rule',
                   'lazylab.models.fast_weights.delta_product', 'lazylab.models.mha'):
        assert module in names
    shown = shown_objects()
    for name in ('lazylab.configs.BaseConfigs', 'lazylab.models.feedback.FeedbackTransformerKV',
                 'lazylab.experiments.TrainerConfigs', 'lazylab.experiments.Task', 'lazylab.experiments.main',
                 'lazylab.models.fast_weights.gated_delta_rule.gated_delta_rule_chunked'):
        assert name in shown, name
    assert len(shown) > 170, len(shown)


def test_every_shown_object_has_a_summary_args_and_raises():
    found = problems()
    new = {k: v for k, v in found.items() if k not in EXPECTED}
    assert new == {}, '\n'.join(f'{n} [{r}]: {why}' for (n, r), why in sorted(new.items()))
    fixed = sorted(k for k in EXPECTED if k not in found)
    assert fixed == [], f'these meet their rule now: take them out of EXPECTED: {fixed}'


def _example(**kwargs):
    pass


@pytest.mark.parametrize('doc, args, expected', [
    ('Summary.\n\nArgs:\n    a: one.\n    b, c: two and three.\n', ['a', 'b', 'c'], []),
    ('Summary.\n\nArgs:\n    a (int): one.\n\nRaises:\n    ValueError: never.\n', ['a', 'b'], ['b']),
    ('Summary naming `a`.', ['a'], []),
    ('Summary.', ['a'], ['a']),
])
def test_the_args_rule_reads_google_sections(doc, args, expected):
    def f(*names):
        pass

    f.__doc__ = doc
    f.__signature__ = inspect.Signature([inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args])
    assert missing_args('m.f', f, {}) == expected


def test_the_raises_rule_finds_errors_raised_directly_and_through_factories():
    from lazylab.configs.engine.overrides import assign, set_default

    assert {e.__name__ for e in raised_errors(assign)} == {'UnknownItemError', 'AlreadyComputedError'}
    assert missing_raises(assign) == []
    assert {e.__name__ for e in raised_errors(set_default)} >= {'UnknownItemError', 'AlreadyComputedError'}
