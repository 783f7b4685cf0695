"""Registering options, aggregates and flags on config classes (labml.configs' module-level API).

    @option(Configs.activation, 'GELU')
    def _gelu(): return nn.GELU()

    calculate(Configs.encoder_attn, 'mha', _mha)
    aggregate(Configs.glu_variant, 'SwiGLU', (Configs.is_gated, True), (Configs.activation, nn.SiLU()))
    hyperparams(Configs.d_model); meta_config(Configs.parameters)

Each records on the class the item reference was taken from (see :class:`~.declarations.ItemRef`).
"""
from collections import OrderedDict
from typing import Any, Callable

from .declarations import Calculator, ItemRef, bump_version, item_keys, own_decl, param_keys
from .errors import DeclarationError


def _register(func: Callable, items: Any, option_name: Any, pass_params: Any, what: str) -> Callable:
    cls, keys, _ = item_keys(items, what)
    calc = Calculator(func, keys, option_name, param_keys(pass_params))
    decl = own_decl(cls)
    for key in keys:
        decl.options.setdefault(key, OrderedDict())[calc.option_name] = calc
    bump_version()
    return func


def option(items: Any, *args: Any) -> Callable[[Callable], Callable]:
    """Decorator registering a calculator for an item (or a list of items computed together).

    Forms: ``option(item)``, ``option(item, 'name')``, ``option(item, [Cls.a, Cls.b])`` (pass_params),
    ``option(item, 'name', [Cls.a, Cls.b])``. The option name defaults to the function's name. The function
    takes the config object, nothing, or (with pass_params) the values of those items; for a list of items it
    returns a tuple/list with one value per item.

    Args:
        items: the item the option computes (``Configs.item``), or a list of items it computes together.
        *args: optionally the option's name (a ``str``; default: the function's name) and a list of items whose
            values are passed to the function instead of the config object (labml's ``pass_params``).

    Returns:
        The decorator; it registers the function and returns it unchanged.

    Raises:
        DeclarationError: no config items given, or a function with an unusable signature.
    """
    option_name, pass_params = _split_args(args, allow_func=False)[:2]
    item_keys(items, 'option')  # fail at the decorator line, not at decoration time

    def decorator(func: Callable) -> Callable:
        return _register(func, items, option_name, pass_params, 'option')

    return decorator


def calculate(items: Any, *args: Any) -> Callable:
    """Register ``func`` as a calculator; the non-decorator form of :func:`option`.

    Forms: ``calculate(item, func)``, ``calculate(item, 'name', func)``, ``calculate(item, [params], func)``,
    ``calculate(item, 'name', [params], func)``. ``func`` may be a class (constructed with the config object
    when its constructor takes one argument). Returns ``func``.

    Args:
        items: the item ``func`` computes (``Configs.item``), or a list of items it computes together.
        *args: ``func`` last; before it, optionally the option's name (a ``str``; default: ``func``'s name) and
            a list of items whose values are passed to ``func`` (labml's ``pass_params``).

    Raises:
        DeclarationError: no function given, an argument that is neither a name, a list nor a function, or no
            config items.
    """
    option_name, pass_params, func = _split_args(args, allow_func=True)
    if func is None:
        raise DeclarationError(f'calculate({items!r}, ...) needs the function that computes the item')
    return _register(func, items, option_name, pass_params, 'calculate')


def _split_args(args: tuple[Any, ...], allow_func: bool):
    option_name = pass_params = func = None
    for arg in args:
        if isinstance(arg, str):
            option_name = arg
        elif isinstance(arg, list):
            pass_params = arg
        elif allow_func and callable(arg):
            func = arg
        else:
            raise DeclarationError(f'unexpected argument {arg!r}: give an option name (str), a list of '
                                   f'pass_params' + (', and the function' if allow_func else ''))
    return option_name, pass_params, func


def aggregate(selector: ItemRef, option_name: str, *pairs: tuple[ItemRef, Any]):
    """Declare that selecting ``option_name`` for ``selector`` implies values for other items.

    When the selector's value equals ``option_name`` and an implied item was not set explicitly (override,
    assignment or ``set_default``), that item takes the value given here.

    Args:
        selector: the item whose value selects (``Configs.glu_variant``).
        option_name: the selector's value this aggregate applies to (``'SwiGLU'``).
        *pairs: ``(Configs.item, value)`` pairs: the values implied for other items of the same class.

    Raises:
        DeclarationError: no pairs, or a pair that is not ``(Configs.item, value)``.
    """
    cls, keys, is_list = item_keys(selector, 'aggregate')
    if is_list:
        raise DeclarationError('aggregate takes one selector item')
    if not pairs:
        raise DeclarationError(f'aggregate({selector!r}, {option_name!r}) needs (Configs.item, value) pairs')
    implied = OrderedDict()
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], ItemRef)):
            raise DeclarationError(f'aggregate({selector!r}, {option_name!r}): {pair!r} is not '
                                   f'(Configs.item, value)')
        implied[pair[0].key] = pair[1]
    own_decl(cls).aggregates.setdefault(keys[0], OrderedDict())[option_name] = implied
    bump_version()


def _flag(items: tuple[Any, ...], attribute: str, value: bool, what: str):
    for item in items:
        cls, keys, _ = item_keys(item, what)
        flags = getattr(own_decl(cls), attribute)
        for key in keys:
            flags[key] = value
    bump_version()


def hyperparams(*items: Any, is_hyperparam: bool = True):
    """Mark items as hyperparameters (``is_hyperparam=False`` unmarks); the flag is kept in dumps.

    Args:
        *items: the items to mark (``Configs.d_model``, …).
        is_hyperparam: ``True`` marks them, ``False`` unmarks them.
    """
    _flag(items, 'hyperparams', is_hyperparam, 'hyperparams')


def meta_config(*items: Any, is_meta: bool = True):
    """Mark items as meta configuration (not part of the experiment's identity); kept in dumps.

    Args:
        *items: the items to mark.
        is_meta: ``True`` marks them, ``False`` unmarks them.
    """
    _flag(items, 'meta', is_meta, 'meta_config')


__all__: list[str] = ['option', 'calculate', 'aggregate', 'hyperparams', 'meta_config']
