"""Placeholder modules for optional packages labml_nn imports at module level but the text experiments never use.

``labml_nn.helpers.datasets`` (which every labml_nn trainer imports) does ``from torchvision import datasets,
transforms`` and names ``transforms.Compose`` and ``datasets.MNIST`` in class annotations, for its image datasets.
The registry's torchvision wheels are built against a CUDA torch; next to a CPU torch, importing one fails
(``operator torchvision::nms does not exist``). Where torchvision cannot be imported, :func:`install_placeholder`
puts a stand-in in ``sys.modules``: attribute access and submodule imports work (so the imports and annotations
evaluate), and *using* anything from it (calling, instantiating) raises :class:`MissingPackageError` naming the
package to install.

    install_placeholder('torchvision')      # True when the stand-in was installed; False when the real one imports
    remove_placeholders()                   # sys.modules without them again

Names a module of labml_nn 0.5.1 imports from another that lacks them are supplied too: ``labml_nn.transformers.xl``
and ``.compressive`` import ``SimpleStateModule`` from ``labml_nn.helpers.metrics``, which no longer defines it, and
fail on labml's own engine. :func:`install_missing_names` adds a :class:`SimpleStateModule` of lazylab's own to that
module when it is imported (and only if it lacks one)::

    install_missing_names()                 # from now on; remove_placeholders() takes the hook out again
"""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Optional

from lazylab.errors import LazylabError


class MissingPackageError(LazylabError, ImportError):
    """An optional package the running code needs is not importable here; the message names what to install."""


def _missing(package: str, name: str, reason: str) -> MissingPackageError:
    return MissingPackageError(f'{name} needs {package}, which cannot be imported here ({reason}); install a '
                               f'{package} build that matches your torch, e.g. pip install {package}')


class _PlaceholderMeta(type):
    """Attribute access on a placeholder gives another placeholder (``transforms.Compose``, ``datasets.MNIST``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith('__'):
            raise AttributeError(name)
        return _placeholder_class(cls._package, f'{cls._qualname}.{name}', cls._reason)

    def __repr__(cls) -> str:
        return f'<placeholder {cls._qualname} ({cls._package} is not importable)>'


class _Placeholder(metaclass=_PlaceholderMeta):
    _package = ''
    _qualname = ''
    _reason = ''

    def __new__(cls, *args, **kwargs):
        raise _missing(cls._package, cls._qualname, cls._reason)


def _placeholder_class(package: str, qualname: str, reason: str) -> type:
    return _PlaceholderMeta(qualname.rsplit('.', 1)[-1], (_Placeholder,),
                            {'_package': package, '_qualname': qualname, '_reason': reason})


class PlaceholderModule(types.ModuleType):
    """A module whose every attribute is a placeholder class; using one raises :class:`MissingPackageError`."""

    def __init__(self, name: str, package: str, reason: str):
        super().__init__(name, f'placeholder for {package} ({reason})')
        self.__lazylab_placeholder__ = package
        self.__path__ = []  # a package, so `import torchvision.transforms.functional` reaches _Finder
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        if name.startswith('__'):
            raise AttributeError(name)
        value = _placeholder_class(self.__lazylab_placeholder__, f'{self.__name__}.{name}', self._reason)
        setattr(self, name, value)
        return value


def is_placeholder(module: Any) -> bool:
    return isinstance(module, PlaceholderModule)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports any submodule of a placeholder package as another placeholder."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        parent = sys.modules.get(fullname.rpartition('.')[0])
        if not is_placeholder(parent):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        parent = sys.modules[spec.name.rpartition('.')[0]]
        return PlaceholderModule(spec.name, parent.__lazylab_placeholder__, parent._reason)

    def exec_module(self, module):
        pass


_FINDER = _Finder()


def install_placeholder(package: str) -> bool:
    """Make ``import package`` work even where the package cannot be imported.

    Tries the real import first; when it fails (not installed, or installed but broken), removes what the failed
    import left in ``sys.modules`` and installs :class:`PlaceholderModule` objects for the package and its usual
    submodules. Returns True when placeholders were installed.
    """
    existing = sys.modules.get(package)
    if existing is not None:
        return is_placeholder(existing)
    try:
        importlib.import_module(package)
        return False
    except Exception as e:  # ImportError, or the RuntimeError a torchvision built for another torch raises
        reason = 'not installed' if isinstance(e, ModuleNotFoundError) and e.name == package else \
            ' '.join(f'{type(e).__name__}: {e}'.split())[:200]
    for name in [n for n in sys.modules if n == package or n.startswith(package + '.')]:
        del sys.modules[name]
    sys.modules[package] = PlaceholderModule(package, package, reason)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return True


def remove_placeholders() -> None:
    """Take every placeholder out of ``sys.modules`` again (a later ``import`` tries the real package), and the hook
    of :func:`install_missing_names` out of the import system (names it added stay)."""
    for name in [n for n, m in sys.modules.items() if is_placeholder(m)]:
        del sys.modules[name]
    for finder in (_FINDER, _FILLER):
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


# ---- names labml_nn 0.5.1 imports that its own modules lack ------------------------------------------------------

def _simple_state_module(metrics: types.ModuleType) -> type:
    """``SimpleStateModule`` as labml_nn's Transformer-XL and Compressive Transformer experiments use it: one value
    (their memory) per trainer that ``get()`` reads and ``set(value)`` replaces.

    labml_nn's ``Trainer`` gives each of its state modules one state per trainer (``create_state()``), switches to
    the trainer's own before each pass (``set_state``), and calls ``on_epoch_start()`` when it begins a new pass
    over its data: so training and validation each keep their own memory, which lasts across the inner
    iterations of an epoch and starts empty (None) at each epoch.
    """

    class Slot:
        """One trainer's value."""

        def __init__(self):
            self.value = None

    class SimpleStateModule(metrics.StateModule):
        def __init__(self):
            super().__init__()
            self._slot = Slot()  # usable before a trainer gives it one (a script's own loop)

        def get(self):
            return self._slot.value

        def set(self, value) -> None:
            self._slot.value = value

        def create_state(self) -> Slot:
            return Slot()

        def set_state(self, slot: Slot) -> None:
            self._slot = slot

        def on_epoch_start(self) -> None:
            self._slot.value = None

        def on_epoch_end(self) -> None:
            pass

    SimpleStateModule.__module__ = metrics.__name__
    SimpleStateModule.__qualname__ = 'SimpleStateModule'
    SimpleStateModule.__doc__ = _simple_state_module.__doc__
    return SimpleStateModule


#: module -> {name: function making the missing attribute from the module}
_MISSING_NAMES = {'labml_nn.helpers.metrics': {'SimpleStateModule': _simple_state_module}}


def _add_missing_names(module: types.ModuleType) -> None:
    for name, make in _MISSING_NAMES.get(module.__name__, {}).items():
        if not hasattr(module, name):
            setattr(module, name, make(module))


class _Filler(importlib.abc.MetaPathFinder):
    """Finds a module of :data:`_MISSING_NAMES` as the rest of the import system would, and adds the missing names
    once the module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _MISSING_NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _FillingLoader(spec.loader)
        return spec


class _FillingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _add_missing_names(module)


_FILLER = _Filler()


def install_missing_names() -> None:
    """Add the names of :data:`_MISSING_NAMES` to their modules: now, to those imported already, and from now on
    when each is imported. Idempotent."""
    for name in _MISSING_NAMES:
        if name in sys.modules:
            _add_missing_names(sys.modules[name])
    if _FILLER not in sys.meta_path:
        sys.meta_path.insert(0, _FILLER)
