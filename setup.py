"""setuptools' build (pyproject.toml says the rest), plus the dashboard page's third-party files: d3 and Bootstrap's
CSS fetched by pinned version and sha256 into the built package (lazylab/dashboard/assets.py), never committed."""
import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithPageAssets(build_py):
    """build_py, then lazylab/dashboard/vendor/ filled in the build folder (from the source tree's when there)."""

    def run(self):
        super().run()
        spec = importlib.util.spec_from_file_location('_page_assets', HERE / 'lazylab' / 'dashboard' / 'assets.py')
        assets = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(assets)  # standard library only: lazylab is not installed yet
        vendor = Path(self.build_lib) / 'lazylab' / 'dashboard' / 'vendor'
        if assets.VENDOR.is_dir():
            shutil.copytree(assets.VENDOR, vendor, dirs_exist_ok=True)
        assets.fetch(vendor)


setup(cmdclass={'build_py': BuildPyWithPageAssets})
