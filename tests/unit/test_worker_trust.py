"""A loader worker's own rule for what a plan may make it run: transforms from mdata or from the
modules its operator trusts, URLs on allowed protocols, storage options that name no local
credentials. Refusals are typed, name the source and the field, and come before any import."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass

import dask
import distributed  # noqa: F401  its config defaults must exist before dask.config.set below:
import pytest       # otherwise leaving the set would delete the whole section; so must mdata's

import mdata.config  # noqa: F401

from mdata.errors import InvalidSourceError, UntrustedSourceError
from mdata.sources import SampleTransform
from mdata.sources.fields import FieldKind
from mdata.sources.transforms import SampleOutput
from mdata.spec import SourceSpec
from mdata.spec.worker_trust import (
    BUILTIN_TRANSFORMS, DEFAULT_URL_PROTOCOLS, WorkerTrust, url_protocols, worker_trust,
)
from mdata.wire.errors import error_from_msg, error_to_msg

HERE = __name__


@dataclass(frozen=True)
class Reverse(SampleTransform):
    """A user transform defined in this module."""

    field: str = "text"

    def required_fields(self):
        return {self.field: FieldKind.TEXT}

    def transform_sample(self, values):
        return SampleOutput(tokens=[ord(c) for c in reversed(values[self.field])])


def spec(url="/data/chat/*.parquet", transform=None, storage_options=None) -> SourceSpec:
    transform = transform or {"type": "mdata.sources.transforms:TokenizeText", "args": {"field": "text"}}
    return SourceSpec("chat", url, transform=transform, storage_options=storage_options)


def refused(trust: WorkerTrust, source: SourceSpec, field: str, match: str) -> UntrustedSourceError:
    with pytest.raises(UntrustedSourceError, match=match) as info:
        trust.check(source)
    assert info.value.source == source.name and info.value.field == field
    assert f"field {field!r}" in str(info.value)
    return info.value


def test_mdatas_own_transforms_and_the_usual_stores_pass_by_default():
    trust = WorkerTrust()
    for url in ("/data/chat/*.parquet", "file:///data/chat", "s3://bucket/chat/*.parquet",
                "gs://b/x", "gcs://b/x", "az://c/x", "abfs://c/x", "hf://datasets/org/set/*.parquet"):
        trust.check(spec(url))
    trust.check(spec(transform={"type": "mdata.sources.transforms:DecodeImageCaption", "args": {}}))
    trust.check(spec("s3://b/k", storage_options={"key": "AK", "secret": "S", "anon": False,
                                                  "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}))
    assert spec().build(trust.transforms("chat")).transform.field == "text"


def test_an_untrusted_transform_is_refused_before_it_is_imported_or_called(tmp_path):
    marker = tmp_path / "ran"
    attack = spec(transform={"type": "os:system", "args": {"command": f"touch {marker}"}})
    error = refused(WorkerTrust(), attack, "transform", r"source 'chat'.*'os:system', which is not in "
                    r"a trusted module on this loader worker.*mdata.workers.trusted-modules: none")
    assert isinstance(error, InvalidSourceError)
    with pytest.raises(UntrustedSourceError):  # building under the worker's rule refuses it too
        attack.build(WorkerTrust().transforms("chat"))
    assert not marker.exists()
    nested = spec(transform={"type": "mdata.sources.transforms:TokenizeText",
                             "args": {"field": {"type": "subprocess:getoutput", "args": {"cmd": "id"}}}})
    refused(WorkerTrust(), nested, "transform", r"argument 'field' names 'subprocess:getoutput'")
    user = spec(transform={"type": f"{HERE}:Reverse", "args": {}})
    refused(WorkerTrust(), user, "transform", rf"'{HERE}:Reverse', which is not in a trusted module")


def test_trusted_modules_let_a_users_own_transform_in_but_not_what_it_reexports():
    with dask.config.set({"mdata.workers.trusted-modules": [HERE]}):
        trust = worker_trust()
    assert trust.modules == (HERE,)
    user = spec(transform={"type": f"{HERE}:Reverse", "args": {"field": "text"}})
    trust.check(user)
    assert isinstance(user.build(trust.transforms("chat")).transform, Reverse)
    reexport = spec(transform={"type": f"{HERE}:pickle", "args": {}})  # the pickle module, imported here
    trust.check(reexport)  # by name it is in the module...
    with pytest.raises(UntrustedSourceError, match=rf"'{HERE}:pickle', which names <module 'pickle'"):
        reexport.build(trust.transforms("chat"))  # ...but it is not defined there
    assert sys.modules[HERE].pickle is pickle


def test_urls_on_protocols_outside_the_allow_list_are_refused():
    assert url_protocols("s3://b/k") == ["s3"]
    assert url_protocols("/data/x.parquet") == ["file"] and url_protocols("C:\\data\\x") == ["file"]
    assert url_protocols("simplecache::s3://b/k") == ["simplecache", "s3"]
    assert url_protocols("zip://inner.jsonl::file:///tmp/a.zip") == ["zip", "file"]
    trust = WorkerTrust()
    refused(trust, spec("http://169.254.169.254/latest/meta-data"), "url",
            r"uses protocol 'http', which this loader worker does not open \(mdata.workers.url-protocols: file, s3")
    refused(trust, spec("simplecache::s3://b/k"), "url", r"protocol 'simplecache'")
    refused(trust, spec("ssh://host/etc/passwd"), "url", r"protocol 'ssh'")
    refused(trust, spec("memory://x/*.parquet"), "url", r"protocol 'memory'")
    tok = spec(transform={"type": "mdata.sources.transforms:TokenizeText",
                          "args": {"tokenizer": "https://internal/tokenizer.json"}})
    refused(trust, tok, "transform.args.tokenizer", r"protocol 'https'")
    WorkerTrust(protocols=("memory", "https")).check(spec("memory://x/*.parquet"))
    with dask.config.set({"mdata.workers.url-protocols": ["file", "memory"]}):
        worker_trust().check(spec("memory://x/*.parquet"))
        refused(worker_trust(), spec("s3://b/k"), "url", r"protocol 's3'.*url-protocols: file, memory")


def test_storage_options_that_name_local_credentials_or_pick_the_filesystem_are_refused():
    trust = WorkerTrust()
    cases = [
        ({"profile": "prod"}, "storage_options.profile", r"names local credentials"),
        ({"token": "/home/op/.config/gcloud/sa.json"}, "storage_options.token",
         r"is '/home/op/.config/gcloud/sa.json', a local file of the worker"),
        ({"token": "~/sa.json"}, "storage_options.token", r"a local file"),
        ({"config_kwargs": {"credentials_file": "x"}}, "storage_options.config_kwargs.credentials_file",
         r"names local credentials"),
        ({"client_kwargs": {"key_filename": "id_rsa"}}, "storage_options.client_kwargs.key_filename",
         r"names local credentials"),
        ({"protocol": "ssh"}, "storage_options.protocol", r"picks the filesystem itself"),
        ({"target_protocol": "file"}, "storage_options.target_protocol", r"picks the filesystem"),
        ({"certs": ["ok", "file:///etc/shadow"]}, "storage_options.certs[1]", r"a local file"),
    ]
    for options, field, match in cases:
        refused(trust, spec("s3://b/k", storage_options=options), field, match)
    lenient = WorkerTrust(allow_local_credentials=True)
    lenient.check(spec("s3://b/k", storage_options={"profile": "prod"}))
    with dask.config.set({"mdata.workers.allow-local-credentials": True}):
        worker_trust().check(spec("s3://b/k", storage_options={"token": "/sa.json"}))


def test_a_built_source_is_checked_by_its_url_options_and_transform_class(tmp_path):
    from mdata.sources import Source

    trust = WorkerTrust()
    trust.check(Source("chat", str(tmp_path)))
    with pytest.raises(UntrustedSourceError, match=rf"'{HERE}:Reverse'"):
        trust.check(Source("chat", str(tmp_path), transform=Reverse()))
    with pytest.raises(UntrustedSourceError, match=r"protocol 'http'"):
        trust.check(Source("chat", "http://x/a.parquet"))


def test_the_refusal_keeps_its_type_source_and_field_across_processes():
    error = UntrustedSourceError("field 'url': no", source="chat", field="url", hint="h")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is UntrustedSourceError and (again.source, again.field) == ("chat", "url")
    wired = error_from_msg(error_to_msg(error))
    assert type(wired) is UntrustedSourceError and (wired.source, wired.field) == ("chat", "url")
    assert str(wired) == str(error)


def test_the_defaults_are_the_documented_ones():
    trust = worker_trust()
    assert trust.protocols == DEFAULT_URL_PROTOCOLS and trust.modules == ()
    assert not trust.allow_local_credentials
    from mdata.sources import transforms, video_document, video_transform

    mine = {f"{module.__name__}:{name}" for module in (transforms, video_transform, video_document)
            for name in module.__all__
            if isinstance(getattr(module, name), type)
            and issubclass(getattr(module, name), transforms.SampleTransform)
            and getattr(module, name) is not transforms.SampleTransform}
    assert mine == BUILTIN_TRANSFORMS


def test_the_loaders_apply_their_rule_on_every_task(tmp_path):
    from workers.loader import build_source, load_chunk_task

    attack = spec(str(tmp_path), transform={"type": "os:system", "args": {"command": "true"}})
    with pytest.raises(UntrustedSourceError, match=r"'os:system'"):
        build_source(attack)
    with pytest.raises(UntrustedSourceError, match=r"protocol 'http'"):
        load_chunk_task(spec("http://example.com/a.parquet"), 0, 0, 1)


def test_local_roots_keep_local_paths_under_the_folders_the_operator_names():
    trust = WorkerTrust(local_roots=("/data", "/scratch/corpus/"))
    for url in ("/data/chat/*.parquet", "file:///data/chat", "/scratch/corpus/x.jsonl", "/data"):
        trust.check(spec(url))
    trust.check(spec("s3://b/k"))  # not a local path
    refused(trust, spec("/data/../home/op/.aws/credentials"), "url",
            r"reads '/home/op/.aws/credentials', outside the folders this loader worker reads "
            r"\(mdata.workers.local-roots: /data, /scratch/corpus/\)")
    refused(trust, spec("file:///etc/passwd"), "url", r"reads '/etc/passwd'")
    refused(trust, spec("/database/x"), "url", r"outside the folders")  # a prefix is not a folder
    refused(trust, spec("relative/x.parquet"), "url", r"reads 'relative/x.parquet'")
    tok = spec(transform={"type": "mdata.sources.transforms:TokenizeText",
                          "args": {"tokenizer": "/home/op/secret.json"}})
    refused(trust, tok, "transform.args.tokenizer", r"reads '/home/op/secret.json'")
    WorkerTrust().check(spec("/anywhere/at/all"))  # the default: any path the worker can read
    with dask.config.set({"mdata.workers.local-roots": ["/data"]}):
        assert worker_trust().local_roots == ("/data",)
        refused(worker_trust(), spec("/etc/x"), "url", r"local-roots: /data")
