"""TLS for an mdata cluster: a throwaway certificate authority, the ``Security`` every process
uses, and what a trainer needs to attach.

Dask's TLS is mutual: every peer (scheduler, nanny, worker, client) presents a certificate the
same CA signed and refuses one that has none. ``mdata cluster up --tls-auto`` makes such a CA for
one cluster, so TLS is one flag away on a laptop or across hosts; for production, bring your own
CA (``--tls-ca-file``/``--tls-cert``/``--tls-key``, the dask CLI's names). Keys are written
readable by their owner only (0600).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mdata.errors import PlanError

__all__ = ["TlsFiles", "make_certificates", "cluster_security", "trainer_env", "trainer_usage",
           "tls_files_from_args"]


@dataclass(frozen=True)
class TlsFiles:
    """The CA, and the certificate and key a cluster's processes present (paths). ``client_cert``
    and ``client_key`` are what trainers present: the cluster's own pair unless a separate one was
    made (``--tls-auto`` makes one, so trainers never hold the cluster's key)."""

    ca_file: str
    cert: str
    key: str
    client_cert: str | None = None
    client_key: str | None = None

    @property
    def trainer_cert(self) -> str:
        return self.client_cert or self.cert

    @property
    def trainer_key(self) -> str:
        return self.client_key or self.key


def _write_private(path: Path, data: bytes) -> None:
    """Write a key so that it is never readable by anyone but its owner, not even briefly."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT: set it


def _san(hosts: Iterable[str]) -> list:
    from cryptography import x509

    names: list = []
    for host in dict.fromkeys(h for h in hosts if h and h not in ("0.0.0.0", "::")):
        try:
            entry = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            entry = x509.DNSName(host)
        if entry not in names:
            names.append(entry)
    return names


def make_certificates(folder: str | Path, hosts: Iterable[str] = ("127.0.0.1",), *,
                      days: int = 30, client: bool = True) -> TlsFiles:
    """A new CA in ``folder`` (``ca.pem``; its key is not kept: nothing more can be signed) and a
    certificate it signs for the cluster (``cert.pem``/``key.pem``), whose subject alternative
    names are ``hosts`` plus ``localhost``, ``127.0.0.1`` and this machine's name. With
    ``client``, a second pair for trainers (``client-cert.pem``/``client-key.pem``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: x509.Name, issuer: x509.Name, public_key):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=days)))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("mdata cluster CA (throwaway)")
    ca = (builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM

    def leaf(cn: str, cert_path: Path, key_path: Path, san: list) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (builder(name(cn), ca.subject, key.public_key())
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert_path.write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(pem))
        _write_private(key_path, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))

    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    hosts = [*hosts, "localhost", "127.0.0.1", socket.gethostname()]
    leaf("mdata-cluster", folder / "cert.pem", folder / "key.pem", _san(hosts))
    files = {"ca_file": str(folder / "ca.pem"), "cert": str(folder / "cert.pem"),
             "key": str(folder / "key.pem")}
    if client:
        leaf("mdata-trainer", folder / "client-cert.pem", folder / "client-key.pem", [])
        files.update(client_cert=str(folder / "client-cert.pem"), client_key=str(folder / "client-key.pem"))
    return TlsFiles(**files)


def cluster_security(files: TlsFiles, *, role: str = "cluster"):
    """The ``Security`` of the cluster's processes (``role="cluster"``: scheduler, nannies and
    workers present the cluster's pair, and so does the driver inside them) or of a trainer
    (``role="trainer"``); encryption required, so no plain-TCP peer is ever accepted."""
    from distributed.security import Security

    if role == "trainer":
        return Security(tls_ca_file=files.ca_file, tls_client_cert=files.trainer_cert,
                        tls_client_key=files.trainer_key, require_encryption=True)
    pair = {"cert": files.cert, "key": files.key}
    return Security(tls_ca_file=files.ca_file, require_encryption=True,
                    **{f"tls_{r}_{k}": v for r in ("scheduler", "worker", "client") for k, v in pair.items()})


def tls_files_from_args(args) -> TlsFiles | None:
    """The TLS files of ``mdata cluster up``'s options: ``--tls-auto`` makes them in ``--tls-dir``
    (default ``./.mdata-tls``), ``--tls-ca-file``/``--tls-cert``/``--tls-key`` name existing ones
    (all three, or none); None for a plain-TCP cluster."""
    given = {k: getattr(args, k, None) for k in ("tls_ca_file", "tls_cert", "tls_key")}
    if getattr(args, "tls_auto", False):
        if any(given.values()):
            raise PlanError("--tls-auto makes its own CA and certificates: give it or "
                            "--tls-ca-file/--tls-cert/--tls-key, not both")
        folder = Path(getattr(args, "tls_dir", None) or ".mdata-tls").resolve()
        return make_certificates(folder, [getattr(args, "host", "127.0.0.1")])
    if not any(given.values()):
        return None
    missing = [f"--{k.replace('_', '-')}" for k, v in given.items() if not v]
    if missing:
        raise PlanError(f"TLS needs --tls-ca-file, --tls-cert and --tls-key; missing {missing}")
    absent = [v for v in given.values() if not Path(v).is_file()]
    if absent:
        raise PlanError(f"TLS files not found: {absent}")
    return TlsFiles(ca_file=given["tls_ca_file"], cert=given["tls_cert"], key=given["tls_key"])


def trainer_env(files: TlsFiles) -> dict[str, str]:
    """Dask's configuration a trainer process sets (as environment variables) so that every
    ``Client``, hence every ``Loader``, uses TLS with no code change."""
    return {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": files.ca_file,
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": files.trainer_cert,
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": files.trainer_key,
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
    }


def trainer_usage(files: TlsFiles, address: str) -> str:
    """What ``mdata cluster up`` prints for trainers: the ``Security`` snippet, the environment
    variables (Dask config keys ``distributed.comm.tls.*``) and the dask CLI options of a worker
    started by hand on another host."""
    env = trainer_env(files)
    return "\n".join([
        f"tls: {Path(files.ca_file).parent} (CA {Path(files.ca_file).name})",
        "# trainers attach over TLS, in code:",
        "#   from distributed.security import Security",
        f"#   sec = Security(tls_ca_file={files.ca_file!r}, tls_client_cert={files.trainer_cert!r},",
        f"#                  tls_client_key={files.trainer_key!r}, require_encryption=True)",
        f"#   Loader({address!r}, job=..., security=sec)",
        "# or with no code change (torchrun), Dask config distributed.comm.tls.* in the environment:",
        *(f"export {k}={v}" for k, v in env.items()),
        "# more workers on other hosts (copy the folder there):",
        f"#   dask worker {address} --tls-ca-file {files.ca_file} --tls-cert {files.cert} "
        f"--tls-key {files.key}",
    ])
