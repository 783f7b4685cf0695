"""The labml page's third-party files, on this machine: the dashboard needs no internet and no CDN at run time.

labml-app 0.5.14's index.html loads three files from CDNs (:data:`lazylab.dashboard.server.CDN_ASSETS`). lazylab
serves them itself, from:

- **Font Awesome 5** (``all.css`` and its webfonts): the PyPI package ``fontawesomefree`` 5.15.4, which the
  ``dashboard`` extra installs (5.15 is 5.9's successor in the same major version: the page's ``fas`` icons);
- **d3 6.7.0** and **Bootstrap 5.0.0-beta2's CSS**, the versions the page names: no PyPI package carries them (PyPI
  has Bootstrap 5.3 only, d3 not at all), so their npm tarballs are fetched when lazylab is built or installed —
  pinned by version and sha256 (:data:`PINNED`), with their licences — into ``lazylab/dashboard/vendor/``, which a
  wheel ships and git ignores. ``make install`` (and a wheel's build, through setup.py) runs this file, ``python
  lazylab/dashboard/assets.py``; it fetches only what is missing.

``lazylab dashboard`` then serves the page's folder with index.html rewritten to load them from ``/vendor/``
(:func:`lazylab.dashboard.server.create_app`); ``--assets DIR`` still serves other copies instead.

This module imports only the standard library: setup.py runs it by its file path, before lazylab is installed.
"""
import hashlib
import io
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Optional

#: where the fetched files live: lazylab/dashboard/vendor/ (git ignores it; a wheel ships it)
VENDOR = Path(__file__).resolve().parent / 'vendor'
NPM_REGISTRY = 'https://registry.npmjs.org'
#: npm package, version, the tarball's sha256, and tarball member → file under VENDOR (its licence included)
PINNED = [
    ('d3', '6.7.0', '0f4883d05b20b1ec95ad57e38bd3df5e4856c6366cd3e6efb294fe7c695250a9',
     {'package/dist/d3.min.js': 'd3.v6.min.js', 'package/LICENSE': 'licenses/d3-LICENSE'}),
    ('bootstrap', '5.0.0-beta2', 'e6f28b012d828d64cb809ebb9b713d7c43f289f841049cbedae3c15f12327168',
     {'package/dist/css/bootstrap.min.css': 'bootstrap.min.css', 'package/LICENSE': 'licenses/bootstrap-LICENSE'}),
]
#: the installed PyPI package that carries Font Awesome, and its folder of static files
FONT_AWESOME_PACKAGE = 'fontawesomefree'
FONT_AWESOME_STATIC = ('static', 'fontawesomefree')
#: the versions served, as the page's files say them (the browser test reads them back from the files served)
VERSIONS = {'d3': '6.7.0', 'bootstrap': '5.0.0-beta2', 'fontawesome': '5.15.4'}


def tarball_url(name: str, version: str) -> str:
    return f'{NPM_REGISTRY}/{name}/-/{name.rsplit("/", 1)[-1]}-{version}.tgz'


def fetch(vendor: Path = VENDOR, opener=urllib.request.urlopen) -> list[str]:
    """Fetch the pinned files into `vendor` (those missing only); returns the names written.

    Raises:
        RuntimeError: a tarball whose sha256 is not the pinned one (nothing of it is written), or one that lacks
            a file.
        OSError: the registry cannot be reached (the message names the URL).
    """
    written = []
    for name, version, sha256, members in PINNED:
        if all((vendor / target).is_file() for target in members.values()):
            continue
        url = tarball_url(name, version)
        try:
            with opener(url, timeout=60) as answer:
                data = answer.read()
        except OSError as e:
            raise OSError(f'cannot fetch {url}: {e}') from None
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise RuntimeError(f'{url}: sha256 {got}, expected {sha256}; nothing written')
        with tarfile.open(fileobj=io.BytesIO(data), mode='r:gz') as tar:
            for member, target in members.items():
                f = tar.extractfile(member)
                if f is None:
                    raise RuntimeError(f'{url} has no file {member}')
                (vendor / target).parent.mkdir(parents=True, exist_ok=True)
                (vendor / target).write_bytes(f.read())
                written.append(target)
    return written


def font_awesome() -> Optional[Path]:
    """The folder of the installed ``fontawesomefree`` package's files (css/, webfonts/, LICENSE.txt); None when
    it is not installed."""
    try:
        import fontawesomefree  # a package of static files: importing it runs nothing
    except ImportError:
        return None
    return Path(fontawesomefree.__file__).resolve().parent.joinpath(*FONT_AWESOME_STATIC)


def missing(vendor: Path = VENDOR) -> list[str]:
    """What the page's files lack here: a line each ([] when all are there)."""
    out = [f'{target} (npm {name} {version})' for name, version, _, members in PINNED
           for target in members.values() if not (vendor / target).is_file()]
    if font_awesome() is None:
        out.append(f'Font Awesome (the PyPI package {FONT_AWESOME_PACKAGE})')
    return out


def assemble(dest: Path, vendor: Path = VENDOR) -> Path:
    """A folder in the layout of ``--assets`` (d3.v6.min.js, bootstrap.min.css, fontawesome/css/all.css,
    fontawesome/webfonts/, licenses/) made of links to the files here; `dest` is made anew."""
    if dest.exists() or dest.is_symlink():
        shutil.rmtree(dest) if dest.is_dir() and not dest.is_symlink() else dest.unlink()
    dest.mkdir(parents=True)
    for name in ('d3.v6.min.js', 'bootstrap.min.css', 'licenses'):
        (dest / name).symlink_to(vendor / name)
    fa = font_awesome()
    (dest / 'fontawesome').symlink_to(fa)
    return dest


def main() -> int:
    """``python lazylab/dashboard/assets.py``: fetch what is missing (make install)."""
    written = fetch()
    print(f'lazylab dashboard assets: {", ".join(written) if written else "all present"} in {VENDOR}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
