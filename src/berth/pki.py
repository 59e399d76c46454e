"""berth's certificates: a local certificate authority, the certificates it issues, and the
TLS contexts built from them — for NATS (clients and cluster routes, mutual TLS) and HTTPS.

A berth cluster that runs with TLS needs three kinds of certificate, all from one CA:

* **servers** (a nats-server, the API's HTTPS endpoint) — ``serverAuth``, with the names and
  addresses clients dial as subject alternative names (a NATS route between two servers
  dials too, so a NATS server's certificate is also ``clientAuth``);
* **clients** (an agent, a scheduler, the CLI) — ``clientAuth``, named by their role (and
  node) in the common name: the server refuses a client without one signed by the CA;
* **the CA** itself — a self-signed, path-length-0 authority whose key signs nothing else.

:class:`CertificateAuthority` creates or loads the CA (``ca.pem``, ``ca-key.pem``) and
issues certificates (:meth:`CertificateAuthority.issue`) as :class:`Issued` PEM pairs;
:func:`write_pair` writes one beside the CA.  Every private key is written ``0600`` from its
creation (:func:`berth.private.write_private`).  Keys are ECDSA P-256 (small, fast
handshakes; what the Go TLS stack of nats-server and Python's ``ssl`` both prefer),
signatures SHA-256, validity bounded (:data:`MAX_DAYS`).

:class:`TlsFiles` names the three files a process is given on its command line (``--tls-ca``,
``--tls-cert``, ``--tls-key``), checked once at that edge — each must exist and parse, the
key must belong to the certificate and the certificate must be signed by the CA — with an
``Invalid`` naming the flag; :meth:`TlsFiles.client_context` and
:meth:`TlsFiles.server_context` are the :class:`ssl.SSLContext` objects nats-py and uvicorn
take.  Everything cryptographic is the ``cryptography`` library's; nothing here parses ASN.1.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from berth.errors import Invalid
from berth.private import write_private
from berth.validation import shown

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "MAX_DAYS",
    "TLS_FLAGS",
    "CertificateAuthority",
    "Issued",
    "TlsFiles",
    "check_pair",
    "write_pair",
]

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
DEFAULT_DAYS = 825
"""How long an issued certificate is valid by default (the CA/Browser Forum's old ceiling)."""
CA_DAYS = 3650
MAX_DAYS = 3650
"""The longest validity :meth:`CertificateAuthority.issue` accepts."""
_BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start a little in the past, so a peer whose clock lags still accepts them."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    certificate: bytes
    key: bytes

    @property
    def x509(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.certificate)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _alternative_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    """DNS names and IP addresses for a certificate's subject alternative names."""
    general: list[x509.GeneralName] = []
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 253:
            raise Invalid(f"a certificate name must be a host name or address, got {shown(name)}")
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            try:
                name.encode("ascii")
            except UnicodeEncodeError:
                raise Invalid(f"a host name must be ASCII, got {shown(name)}") from None
            general.append(x509.DNSName(name))
    return general


class CertificateAuthority:
    """A CA's certificate and key (see the module docstring)."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.certificate = certificate
        self.key = key

    @classmethod
    def create(cls, common_name: str = "berth local CA") -> CertificateAuthority:
        key = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA written in ``directory`` (``ca.pem``, ``ca-key.pem``)."""
        certificate = _read_certificate(directory / CA_CERT, "ca")
        key = _read_key(directory / CA_KEY, "ca")
        if key.public_key() != certificate.public_key():
            raise Invalid(f"{directory / CA_KEY} is not the key of {directory / CA_CERT}")
        return cls(certificate, key)

    @classmethod
    def load_or_create(cls, directory: Path) -> CertificateAuthority:
        """The CA in ``directory``, created (and written) when there is none."""
        if (directory / CA_CERT).exists() or (directory / CA_KEY).exists():
            return cls.load(directory)
        authority = cls.create()
        authority.write(directory)
        return authority

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(directory / CA_KEY, _key_pem(self.key))
        (directory / CA_CERT).write_bytes(self.pem)

    def issue(
        self,
        common_name: str,
        *,
        names: tuple[str, ...] = (),
        server: bool = False,
        client: bool = True,
        days: int = DEFAULT_DAYS,
    ) -> Issued:
        """A certificate for ``common_name`` signed by this CA: ``server`` (``serverAuth``,
        valid for ``names`` — DNS names or IP addresses — which a server needs at least one
        of) and/or ``client`` (``clientAuth``), valid ``days`` days."""
        if not isinstance(common_name, str) or not 0 < len(common_name) <= 64:
            raise Invalid(f"a common name is 1 to 64 characters, got {shown(common_name)}")
        if isinstance(days, bool) or not isinstance(days, int) or not 0 < days <= MAX_DAYS:
            raise Invalid(f"days must be an integer from 1 to {MAX_DAYS}, got {shown(days)}")
        if not (server or client):
            raise Invalid("a certificate is for a server, a client or both")
        alternative = _alternative_names(names)
        if server and not alternative:
            raise Invalid("a server certificate needs the names clients dial it by")
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if alternative:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternative), critical=False
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        return Issued(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_pair(directory: Path, stem: str, issued: Issued) -> TlsFiles:
    """Write ``issued`` as ``<stem>.pem`` and ``<stem>-key.pem`` (``0600``) in ``directory``,
    beside the CA's ``ca.pem``; the three files as :class:`TlsFiles`."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(directory / f"{stem}-key.pem", issued.key)
    (directory / f"{stem}.pem").write_bytes(issued.certificate)
    return TlsFiles(
        ca=directory / CA_CERT, cert=directory / f"{stem}.pem", key=directory / f"{stem}-key.pem"
    )


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise Invalid(f"cannot read {path}: {error.strerror or error}", field=flag) from None


def _read_certificate(path: Path, flag: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_read(path, flag))
    except ValueError:
        raise Invalid(f"{path} is not a PEM certificate", field=flag) from None


def _read_key(path: Path, flag: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(_read(path, flag), password=None)
    except (ValueError, TypeError):
        raise Invalid(f"{path} is not an unencrypted PEM private key", field=flag) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise Invalid(f"{path} is not an EC private key (berth issues P-256)", field=flag)
    return key


def check_pair(cert: Path, key: Path, *, cert_flag: str, key_flag: str) -> x509.Certificate:
    """``cert`` a readable PEM certificate valid now and ``key`` its unencrypted private key;
    the certificate, else ``Invalid`` naming ``cert_flag`` or ``key_flag``."""
    certificate = _read_certificate(cert, cert_flag)
    if _read_key(key, key_flag).public_key() != certificate.public_key():
        raise Invalid(f"{key} is not the key of {cert}", field=key_flag)
    now = datetime.datetime.now(datetime.UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise Invalid(
            f"{cert} is valid from {certificate.not_valid_before_utc:%Y-%m-%d} to "
            f"{certificate.not_valid_after_utc:%Y-%m-%d}, not now",
            field=cert_flag,
        )
    return certificate


TLS_FLAGS = ("--tls-ca", "--tls-cert", "--tls-key")
"""The flags that give a process its :class:`TlsFiles`, all three or none."""


@dataclass(frozen=True)
class TlsFiles:
    """The CA, certificate and key files one process is given (``--tls-ca``,
    ``--tls-cert``, ``--tls-key``)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_flags(cls, ca: Path | None, cert: Path | None, key: Path | None) -> TlsFiles | None:
        """The files of ``--tls-ca``, ``--tls-cert`` and ``--tls-key``, checked
        (:meth:`check`, errors naming the flag); ``None`` when none is given, ``Invalid``
        naming the first one missing when only some are."""
        given = (ca, cert, key)
        if all(path is None for path in given):
            return None
        for flag, path in zip(TLS_FLAGS, given, strict=True):
            if path is None:
                raise Invalid(f"{', '.join(TLS_FLAGS)} go together: {flag} is missing", field=flag)
        assert ca is not None and cert is not None and key is not None
        return cls(ca, cert, key).check(flags=TLS_FLAGS)

    def check(self, *, flags: tuple[str, str, str] = ("tls_ca", "tls_cert", "tls_key")) -> TlsFiles:
        """Each file readable and well-formed, the key the certificate's, the certificate
        signed by the CA and valid now; else ``Invalid`` naming the flag (``flags``: the CA's,
        the certificate's and the key's names)."""
        ca_flag, cert_flag, key_flag = flags
        authority = _read_certificate(self.ca, ca_flag)
        certificate = check_pair(self.cert, self.key, cert_flag=cert_flag, key_flag=key_flag)
        try:
            certificate.verify_directly_issued_by(authority)
        except (ValueError, TypeError, InvalidSignature):
            raise Invalid(
                f"{self.cert} is not signed by the CA {self.ca}", field=cert_flag
            ) from None
        return self

    def client_context(self) -> ssl.SSLContext:
        """A client's context: verifies the server against the CA (and its name), presents
        this certificate."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def server_context(self, *, require_client: bool = True) -> ssl.SSLContext:
        """A server's context: presents this certificate; with ``require_client`` (mutual
        TLS) refuses a client without a certificate the CA signed."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        context.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_OPTIONAL
        return context
