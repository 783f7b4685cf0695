"""Value types for config items: the constraints this project's items share, under the field's names.

Each is a ``typing.Annotated`` type with constraints from the annotated-types package, so the engine checks every
value an item is given (override, ``--config`` file, assignment, class default, computed value) and
``lazylab options`` shows the rule (``int ≥ 1``)::

    class Configs(BaseConfigs):
        batch_size: PositiveInt = 16
        dropout: Probability = 0.1

A bad value is one line naming the key: ``bad value for batch_size: must be ≥ 1, got 0``. Torch-free.
"""
from typing import Annotated

from annotated_types import Ge, Gt, Interval, IsFinite, MinLen, Predicate

from lazylab.user_files import control_character

__all__ = ['PositiveInt', 'NonNegativeInt', 'LayerCount', 'ThreadCount', 'PositiveFloat', 'NonNegativeFloat',
           'Probability', 'Fraction', 'NonEmptyStr', 'PathStr', 'printable']

#: a count or size: ≥ 1 (layers, heads, widths, batch sizes, sequence lengths)
PositiveInt = Annotated[int, Ge(1)]
#: a count where 0 means "none" or "off": ≥ 0
NonNegativeInt = Annotated[int, Ge(0)]
#: a number of layers: 1 … 1024 (the layers are built one by one: a mistyped 10**18 would never finish building)
LayerCount = Annotated[int, Interval(ge=1, le=1024)]
#: CPU threads for torch: 0 (torch's default) … 1024 (torch cannot take more than a C int; this many is a mistake)
ThreadCount = Annotated[int, Interval(ge=0, le=1024)]
#: a finite number > 0 (a learning rate)
PositiveFloat = Annotated[IsFinite[float], Gt(0)]
#: a finite number ≥ 0 (minutes, a norm bound, a temperature, weight decay)
NonNegativeFloat = Annotated[IsFinite[float], Ge(0)]
#: a dropout probability: 0 ≤ p < 1
Probability = Annotated[float, Interval(ge=0, lt=1)]
#: a ratio in [0, 1]
Fraction = Annotated[float, Interval(ge=0, le=1)]
#: text that must not be empty (a path, a prompt)
NonEmptyStr = Annotated[str, MinLen(1)]


def printable(text: str) -> bool:
    """Whether `text` holds no control character (C0 such as \\n, \\r, \\t and NUL; DEL; C1): a folder whose name
    holds a newline splits every line that shows it (the run's directory, a compare table), and a NUL cuts it short.
    (`constraint_text` is how listings and errors name the rule.)"""
    return isinstance(text, str) and control_character(text) is None


printable.constraint_text = 'free of control characters'  # type: ignore[attr-defined]

#: a file or folder path (a run's folder, a text file): not empty, and free of control characters
PathStr = Annotated[str, MinLen(1), Predicate(printable)]
