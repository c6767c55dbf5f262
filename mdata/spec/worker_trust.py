"""What a loader worker agrees to run for a plan: its transforms, its URLs, its storage options.

A plan is data, chosen by whoever registers a job (a trainer, a driver, a plan file passed from
team to team). The scheduler imports only trusted code (:func:`mdata.spec.refs.scheduler_trust`);
the loader workers are where a source's transform is imported and called and its URL opened, so
they apply a rule of their own, read from *their* configuration, never from the plan:

- **transforms**, and every reference inside their arguments: mdata's own
  (:data:`BUILTIN_TRANSFORMS`) and objects *defined* in a module listed in
  ``mdata.workers.trusted-modules`` (or below one);
- **URLs**: every protocol of the source's URL (each link of a chained ``a::b://...`` URL; a plain
  path is ``file``) must be in ``mdata.workers.url-protocols``; so must a built-in transform's
  tokenizer when it is given as a URL. With ``mdata.workers.local-roots`` set, a local path (the
  URL's or the tokenizer's) must also lie under one of those folders (after ``..`` is resolved;
  symbolic links are not followed here);
- **storage options**, at any depth: no key that picks the filesystem (``protocol``,
  ``target_protocol``, ``fo``...), no key that names local credentials (``profile``,
  ``profile_name``, ``key_filename``, ``pkey``, ``client_keys``, and any key ending in ``_file``,
  ``_filename``, ``_path`` or ``_dir``), and no string that names a local file (``/...``,
  ``~...``, ``./...``, ``file:...``: a gcsfs ``token`` pointing at a service-account file). The
  workers' own credentials (environment, instance role, their own config files) still apply, as
  they do for every source; a plan may bring inline credentials (``key``/``secret``). Set
  ``mdata.workers.allow-local-credentials: true`` to lift this rule.

A refusal is an :class:`~mdata.errors.UntrustedSourceError` naming the source and the field. At
registration the listing runs on a loader of the source's pool, so the trainer or driver that
registered the plan gets it, and the job is not registered.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mdata.errors import UntrustedSourceError
from mdata.spec.refs import Trust, is_reference

__all__ = ["BUILTIN_TRANSFORMS", "DEFAULT_URL_PROTOCOLS", "WorkerTrust", "url_protocols",
           "worker_trust"]

#: The transforms every loader builds without configuration: mdata's own.
BUILTIN_TRANSFORMS = frozenset({
    "mdata.sources.transforms:TokenizeText", "mdata.sources.transforms:DecodeImageCaption",
    "mdata.sources.video_transform:DecodeVideoCaption",
    "mdata.sources.video_document:DecodeVideoDocument",
})
#: What training data lives on: local and network filesystems, the three clouds' object stores,
#: the Hugging Face Hub. Not http(s) (a plan could make every loader fetch internal endpoints, such
#: as a cloud's metadata service), nor wrappers that reach other stores or local archives.
DEFAULT_URL_PROTOCOLS = ("file", "s3", "gs", "gcs", "az", "abfs", "abfss", "hf")

_FILESYSTEM_KEYS = frozenset({"protocol", "target_protocol", "target_options", "remote_protocol",
                              "remote_options", "fo", "fs"})
_CREDENTIAL_KEYS = frozenset({"profile", "profile_name", "key_filename", "pkey", "client_keys"})
_CREDENTIAL_SUFFIXES = ("_file", "_filename", "_path", "_dir")
_LOCAL_PATH = re.compile(r"^(/|~|\.\.?[/\\]|file:|local:|[A-Za-z]:[/\\])")
_PROTOCOL_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9+._-]*$")


def url_protocols(url: str) -> list[str]:
    """The fsspec protocols ``url`` goes through, outermost first, lowercased:
    ``"s3://b/k"`` -> ``["s3"]``, ``"simplecache::s3://b/k"`` -> ``["simplecache", "s3"]``,
    ``"/data/x"`` -> ``["file"]``. A link that is a bare word counts as a protocol (fsspec may
    read it as one), so the answer is never narrower than what fsspec would open."""
    links = url.split("::")
    out = []
    for link in links:
        if "://" in link and len(link.split("://", 1)[0]) > 1:  # one letter: a Windows drive
            out.append(link.split("://", 1)[0].lower())
        elif len(links) > 1 and _PROTOCOL_WORD.match(link):
            out.append(link.lower())
        elif link.startswith("data:"):
            out.append("data")
        else:
            out.append("file")
    return out


@dataclass(frozen=True)
class WorkerTrust:
    """A loader worker's rule (see the module docstring); :func:`worker_trust` reads it from the
    worker's configuration."""

    modules: tuple[str, ...] = ()
    protocols: tuple[str, ...] = DEFAULT_URL_PROTOCOLS
    allow_local_credentials: bool = False
    local_roots: tuple[str, ...] | None = None  # None: any local path the worker can read

    def transforms(self, source: str) -> Trust:
        """The :class:`Trust` a source's transform is resolved under on this worker: its
        refusals are :class:`UntrustedSourceError` naming ``source`` and the ``transform``."""
        trusted = ", ".join(self.modules) or "none"

        def refuse(path: str, what: str, reason: str) -> UntrustedSourceError:
            return UntrustedSourceError(
                f"field 'transform': {what} names {path!r}, which {reason} on this loader worker: "
                "loaders build mdata's own transforms and objects defined in the modules their "
                f"operator trusts (mdata.workers.trusted-modules: {trusted})",
                source=source, field="transform",
                hint="install the module on the source's loader workers and list it in their "
                "mdata.workers.trusted-modules")

        return Trust(self.modules, where="on this loader worker", builtins=BUILTIN_TRANSFORMS,
                     refuse=refuse)

    def check(self, source: Any) -> None:
        """Raise :class:`UntrustedSourceError` unless this worker may open ``source`` (a
        :class:`~mdata.spec.SourceSpec` or a built :class:`~mdata.sources.Source`): its URL, its
        storage options, its transform's references (checked by name, before any import)."""
        name = str(source.name)
        self._check_url(name, "url", source.url)
        if source.storage_options and not self.allow_local_credentials:
            _check_options(name, "storage_options", source.storage_options)
        transform = source.transform
        if isinstance(transform, Mapping):
            tokenizer = dict(transform.get("args") or {}).get("tokenizer")
        else:  # a built Source: its transform is an object, its class is what it names
            tokenizer = getattr(transform, "tokenizer", None)
            cls = type(transform)
            transform = {"type": f"{cls.__module__}:{cls.__qualname__}", "args": {}}
        trust = self.transforms(name)
        for path, what in _references(transform, f"transform of source {name!r}"):
            trust.check(path, what)
        if transform["type"] in BUILTIN_TRANSFORMS and isinstance(tokenizer, str) and (
                "://" in tokenizer or "::" in tokenizer or "/" in tokenizer or "\\" in tokenizer):
            self._check_url(name, "transform.args.tokenizer", tokenizer)

    def _check_url(self, source: str, field: str, url: str) -> None:
        allowed = {p.lower() for p in self.protocols}
        refused = [p for p in url_protocols(url) if p not in allowed]
        if refused:
            raise UntrustedSourceError(
                f"field {field!r}: {url!r} uses protocol {refused[0]!r}, which this loader worker "
                f"does not open (mdata.workers.url-protocols: {', '.join(self.protocols) or 'none'})",
                source=source, field=field,
                hint="use a protocol the workers allow, or have their operator add it to "
                "mdata.workers.url-protocols")
        if self.local_roots is not None:
            for path in _local_paths(url):
                if not any(path == root or path.startswith(root.rstrip("/") + "/")
                           for root in map(_normalized, self.local_roots)):
                    raise UntrustedSourceError(
                        f"field {field!r}: {url!r} reads {path!r}, outside the folders this loader "
                        f"worker reads (mdata.workers.local-roots: {', '.join(self.local_roots) or 'none'})",
                        source=source, field=field,
                        hint="put the data under one of those folders, or have the workers' operator "
                        "add its folder to mdata.workers.local-roots")


def _normalized(path: str) -> str:
    return posixpath.normpath(path.replace("\\", "/"))


def _local_paths(url: str) -> list[str]:
    """The local paths ``url`` names (its ``file`` links), normalized; a relative path (whose
    meaning depends on the worker's folder) as it is, so that no root contains it."""
    out = []
    for link, protocol in zip(url.split("::"), url_protocols(url)):
        if protocol != "file":
            continue
        for prefix in ("file://", "local://"):
            if link.startswith(prefix):
                link = link[len(prefix):]
        out.append(_normalized(link) if link.startswith("/") else link)
    return out


def _references(value: Any, what: str) -> Iterable[tuple[str, str]]:
    """Every ``(module:name, what)`` a transform spec names, its arguments' references too."""
    if is_reference(value):
        yield value["type"], what
        for key, arg in dict(value.get("args") or {}).items():
            yield from _references(arg, f"{what} {value['type']!r} argument {key!r}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _references(item, what)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _references(item, what)


def _check_options(source: str, where: str, value: Any) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            field = f"{where}.{key}"
            low = str(key).lower()
            if low in _FILESYSTEM_KEYS:
                raise _refused(source, field, "picks the filesystem itself, which only the URL may "
                               "name (its protocol is checked against mdata.workers.url-protocols)")
            if low in _CREDENTIAL_KEYS or low.endswith(_CREDENTIAL_SUFFIXES):
                raise _refused(source, field, "names local credentials or files of the worker")
            _check_options(source, field, item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_options(source, f"{where}[{i}]", item)
    elif isinstance(value, str) and _LOCAL_PATH.match(value):
        raise _refused(source, where, f"is {value!r}, a local file of the worker")


def _refused(source: str, field: str, why: str) -> UntrustedSourceError:
    return UntrustedSourceError(
        f"field {field!r} {why}: a plan may not make loaders use their local credential files",
        source=source, field=field,
        hint="give the workers their credentials (environment, instance role, their own config "
        "files), pass inline keys, or have their operator set mdata.workers.allow-local-credentials")


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(m for m in value.replace(",", " ").split() if m)
    return tuple(str(m) for m in value)


def worker_trust() -> WorkerTrust:
    """This worker's rule, from its own ``mdata.workers.*`` configuration (never the plan's)."""
    from mdata import config

    protocols = config.get("workers.url-protocols")
    return WorkerTrust(
        modules=_names(config.get("workers.trusted-modules")),
        protocols=DEFAULT_URL_PROTOCOLS if protocols is None else _names(protocols),
        allow_local_credentials=bool(config.get("workers.allow-local-credentials")),
        local_roots=None if config.get("workers.local-roots") is None
        else _names(config.get("workers.local-roots")),
    )
