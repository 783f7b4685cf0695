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
    """Take every placeholder out of ``sys.modules`` again (a later ``import`` tries the real package)."""
    for name in [n for n, m in sys.modules.items() if is_placeholder(m)]:
        del sys.modules[name]
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
