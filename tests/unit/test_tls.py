"""The throwaway CA of ``mdata cluster up --tls-auto``, and the TLS options the printed dask CLI
lines and Kubernetes manifests carry."""

from __future__ import annotations

import argparse
import ipaddress
import stat

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from mdata.driver.tls import make_certificates, tls_files_from_args, trainer_env
from mdata.errors import PlanError
from mdata.pools.layout import LayoutPool, PoolLayout
from mdata.pools.layout_text import TLS_MOUNT, dask_worker_commands, kubernetes_manifest


def _load(path: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(open(path, "rb").read())


def test_the_ca_signs_both_certificates_and_the_cluster_san_names_the_host(tmp_path):
    files = make_certificates(tmp_path / "tls", ["10.1.2.3", "sched.example"])
    ca = _load(files.ca_file)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for cert_path in (files.cert, files.client_cert):
        cert = _load(cert_path)
        assert cert.issuer == ca.subject
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                               ec.ECDSA(cert.signature_hash_algorithm))  # raises if not signed by the CA
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = _load(files.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in san.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert {"sched.example", "localhost"} <= set(san.get_values_for_type(x509.DNSName))


def test_keys_are_readable_by_their_owner_only_and_certificates_by_all(tmp_path):
    (tmp_path / "key.pem").write_text("old")  # an existing world-readable file is tightened too
    (tmp_path / "key.pem").chmod(0o644)
    files = make_certificates(tmp_path)
    for key in (files.key, files.client_key):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.pem").stat().st_mode) & 0o044  # public
    assert not list(tmp_path.glob("ca-key*"))  # the CA's key is never written: nothing more is signed


def _args(**kw) -> argparse.Namespace:
    base = dict(tls_ca_file=None, tls_cert=None, tls_key=None, tls_auto=False, tls_dir=None, host="127.0.0.1")
    return argparse.Namespace(**{**base, **kw})


def test_tls_options_of_cluster_up(tmp_path):
    assert tls_files_from_args(_args()) is None
    files = tls_files_from_args(_args(tls_auto=True, tls_dir=str(tmp_path / "d")))
    assert files.ca_file == str(tmp_path / "d" / "ca.pem") and files.trainer_key.endswith("client-key.pem")
    env = trainer_env(files)
    assert env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"] == files.ca_file
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    with pytest.raises(PlanError, match="missing"):
        tls_files_from_args(_args(tls_ca_file=files.ca_file))
    with pytest.raises(PlanError, match="not both"):
        tls_files_from_args(_args(tls_auto=True, tls_cert=files.cert))
    with pytest.raises(PlanError, match="not found"):
        tls_files_from_args(_args(tls_ca_file="nope.pem", tls_cert=files.cert, tls_key=files.key))


def _layout() -> PoolLayout:
    pools = [LayoutPool(name="text", sources=("chat", "code"), workers=2, threads=1, demand=1.0, reason="cheap"),
             LayoutPool(name="images", sources=("images",), workers=1, threads=2, demand=2.0, reason="costly")]
    return PoolLayout(pools=tuple(pools), rate=1.0, samples_per_step=8, stage="cpu")


def test_dask_worker_lines_carry_tls_on_every_line_and_a_tls_address():
    tls = ("/c/ca.pem", "/c/cert.pem", "/c/key.pem")
    plain = dask_worker_commands(_layout(), "tcp://sched:8786")
    lines = dask_worker_commands(_layout(), "tcp://sched:8786", tls=tls)
    assert not any("--tls" in line for line in plain)
    assert len(lines) == len(plain) == 4
    assert "--protocol tls" in lines[0]
    for line in lines:
        assert "--tls-ca-file /c/ca.pem --tls-cert /c/cert.pem --tls-key /c/key.pem" in line
    assert all(line.startswith("dask worker tls://sched:8786 ") for line in lines[1:])


def test_kubernetes_manifest_with_tls_mounts_the_secret_in_every_pod():
    docs = list(yaml.safe_load_all(kubernetes_manifest(_layout(), tls=True)))
    assert not any("--tls" in str(d) for d in yaml.safe_load_all(kubernetes_manifest(_layout())))
    pods = [docs[0]["spec"]["scheduler"]["spec"], docs[0]["spec"]["worker"]["spec"],
            *(d["spec"]["worker"]["spec"] for d in docs[1:])]
    assert len(pods) == 4
    for pod in pods:
        assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "mdata-tls", "defaultMode": 0o400}}]
        container = pod["containers"][0]
        assert container["volumeMounts"][0]["mountPath"] == TLS_MOUNT
        args = container["args"]
        assert args[args.index("--tls-ca-file") + 1] == f"{TLS_MOUNT}/ca.pem"
        assert args[args.index("--tls-key") + 1] == f"{TLS_MOUNT}/key.pem"
    assert "--protocol" in pods[0]["containers"][0]["args"]
    assert all(p["containers"][0]["args"][2] == "tls://mdata-scheduler:8786" for p in pods[1:])
