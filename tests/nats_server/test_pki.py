"""berth.pki: the local CA, the certificates it issues, and mutual TLS with a real nats-server."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from berth.errors import Invalid
from berth.pki import CA_KEY, CertificateAuthority, TlsFiles, write_pair
from berth.testing.nats import running_server


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ca_is_written_private_and_loads_back(tmp_path: Path) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path / "pki")
    assert _mode(tmp_path / "pki" / CA_KEY) == 0o600
    assert _mode(tmp_path / "pki") == 0o700
    again = CertificateAuthority.load_or_create(tmp_path / "pki")
    assert again.pem == authority.pem  # loaded, not a second CA
    constraints = authority.certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.value.ca and constraints.value.path_length == 0


def test_issued_certificates_carry_their_usages_and_names(tmp_path: Path) -> None:
    authority = CertificateAuthority.create()
    server = authority.issue("nats-1", names=("127.0.0.1", "localhost"), server=True).x509
    usages = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages and ExtendedKeyUsageOID.CLIENT_AUTH in usages
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    server.verify_directly_issued_by(authority.certificate)
    client = authority.issue("agent.node-1", client=True).x509
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"common_name": ""}, "common name"),
        ({"common_name": "x" * 65}, "common name"),
        ({"common_name": "s", "server": True, "client": False}, "names clients dial"),
        ({"common_name": "s", "server": False, "client": False}, "a server, a client"),
        ({"common_name": "s", "days": 0}, "days"),
        ({"common_name": "s", "days": True}, "days"),
        ({"common_name": "s", "names": ("héllo",), "server": True}, "ASCII"),
    ],
)
def test_bad_requests_for_certificates_are_refused(kwargs: dict[str, object], message: str) -> None:
    authority = CertificateAuthority.create()
    with pytest.raises(Invalid, match=message):
        authority.issue(**kwargs)  # type: ignore[arg-type]


def test_tls_files_are_checked_naming_the_flag(tmp_path: Path) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path)
    files = write_pair(tmp_path, "client", authority.issue("client"))
    assert _mode(files.key) == 0o600
    assert files.check() == files
    with pytest.raises(Invalid) as missing:
        TlsFiles(ca=tmp_path / "nope.pem", cert=files.cert, key=files.key).check()
    assert missing.value.field == "tls_ca"
    other = CertificateAuthority.create()
    foreign = write_pair(tmp_path / "other", "client", other.issue("client"))
    with pytest.raises(Invalid, match="not signed by the CA") as unsigned:
        TlsFiles(ca=files.ca, cert=foreign.cert, key=foreign.key).check()
    assert unsigned.value.field == "tls_cert"
    with pytest.raises(Invalid, match="not the key") as mismatched:
        TlsFiles(ca=files.ca, cert=files.cert, key=foreign.key).check()
    assert mismatched.value.field == "tls_key"
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(Invalid, match="not a PEM certificate") as junk:
        TlsFiles(ca=files.ca, cert=tmp_path / "junk.pem", key=files.key).check()
    assert junk.value.field == "tls_cert"


def test_mutual_tls_over_loopback(tmp_path: Path) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path)
    server = write_pair(
        tmp_path, "server", authority.issue("api", names=("127.0.0.1",), server=True)
    )
    client = write_pair(tmp_path, "client", authority.issue("cli"))

    async def run() -> tuple[bytes, bool]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                writer.write(await reader.readexactly(4))
                await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        listener = await asyncio.start_server(
            answer, "127.0.0.1", 0, ssl=server.server_context(require_client=True)
        )
        port = listener.sockets[0].getsockname()[1]
        async with listener:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client.client_context()
            )
            writer.write(b"ping")
            echoed = await reader.readexactly(4)
            writer.close()
            # without a client certificate: the server refuses the handshake
            anonymous = ssl.create_default_context(cafile=str(server.ca))
            refused = False
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=anonymous)
                writer.write(b"ping")
                await reader.readexactly(4)
            except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
                refused = True
            return echoed, refused

    echoed, refused = asyncio.run(run())
    assert echoed == b"ping"
    assert refused


def test_a_nats_server_with_mutual_tls_refuses_a_client_without_a_certificate(
    tmp_path: Path,
) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path / "pki")
    server = write_pair(
        tmp_path / "pki", "nats", authority.issue("nats-1", names=("127.0.0.1",), server=True)
    )
    client = write_pair(tmp_path / "pki", "agent", authority.issue("agent.node-1"))
    config = tmp_path / "server.conf"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(
            "tls {\n"
            f'  cert_file: "{server.cert}"\n  key_file: "{server.key}"\n'
            f'  ca_file: "{server.ca}"\n  verify: true\n  timeout: 2\n'
            "}\n"
        )

    async def run(url: str) -> tuple[bool, str]:
        connection = await nats.connect(url, tls=client.client_context(), connect_timeout=3)
        try:
            await connection.publish("hello", b"x")
            await connection.flush()
            with_certificate = connection.is_connected
        finally:
            await connection.close()
        anonymous = ssl.create_default_context(cafile=str(server.ca))
        try:
            other = await nats.connect(
                url,
                tls=anonymous,
                connect_timeout=2,
                max_reconnect_attempts=0,
                allow_reconnect=False,
            )
        except Exception as error:  # nats-py raises the handshake's or the server's error
            return with_certificate, f"{type(error).__name__}: {error}"
        await other.close()
        return with_certificate, "connected"

    with running_server(store_dir=tmp_path / "store", config_file=config) as nats_server:
        with_certificate, without = asyncio.run(run(f"tls://127.0.0.1:{nats_server.port}"))
    assert with_certificate
    assert without != "connected", without


def test_the_tls_flags_go_together_and_are_named(tmp_path: Path) -> None:
    authority = CertificateAuthority.load_or_create(tmp_path)
    files = write_pair(tmp_path, "client", authority.issue("client"))
    assert TlsFiles.from_flags(None, None, None) is None
    assert TlsFiles.from_flags(files.ca, files.cert, files.key) == files
    with pytest.raises(Invalid, match="--tls-key is missing") as missing:
        TlsFiles.from_flags(files.ca, files.cert, None)
    assert missing.value.field == "--tls-key"
    with pytest.raises(Invalid) as unreadable:
        TlsFiles.from_flags(tmp_path / "nope.pem", files.cert, files.key)
    assert unreadable.value.field == "--tls-ca"
    other = write_pair(tmp_path / "other", "client", CertificateAuthority.create().issue("x"))
    with pytest.raises(Invalid, match="not the key") as mismatched:
        TlsFiles.from_flags(files.ca, files.cert, other.key)
    assert mismatched.value.field == "--tls-key"


def test_the_https_flags_go_together_and_are_named(tmp_path: Path) -> None:
    from berth.api.server import HttpsFiles

    authority = CertificateAuthority.load_or_create(tmp_path)
    api = write_pair(tmp_path, "api", authority.issue("api", names=("127.0.0.1",), server=True))
    assert HttpsFiles.from_flags(None, None) is None
    assert HttpsFiles.from_flags(api.cert, api.key) == HttpsFiles(api.cert, api.key)
    with pytest.raises(Invalid, match="--https-key is missing") as missing:
        HttpsFiles.from_flags(api.cert, None)
    assert missing.value.field == "--https-key"
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(Invalid, match="not an unencrypted PEM private key") as junk:
        HttpsFiles.from_flags(api.cert, tmp_path / "junk.pem")
    assert junk.value.field == "--https-key"
