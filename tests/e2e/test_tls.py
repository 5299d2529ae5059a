"""TLS: `tls = { cert, key }` serves HTTPS and WSS; a non-loopback listen needs it."""

import datetime as dt
import ipaddress
import ssl

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.procs import Server, Worker, wait_for


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "berth-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


class TestTls:
    def test_https_and_wss(self, tmp_path, sync_db_url):
        """With tls cert/key the API is HTTPS, and workers attach over WSS trusting the cert."""
        cert, key = self_signed(tmp_path)
        s = Server(
            home=tmp_path / "home",
            db_url=sync_db_url,
            scheme="https",
            verify=ssl.create_default_context(cafile=cert),
            extra_env={"SSL_CERT_FILE": cert},
            config={
                "network": {"tls": {"cert": cert, "key": key}},
                "pools": {"gpu": {"slots": {"default": 1}}},
            },
        )
        try:
            s.start()
            r = s.cli("job", "submit", "--wait", "--", "echo", "over-tls")
            assert (r.code, r.out) == (0, "over-tls\n"), r.err  # the built-in worker dials wss
            w = Worker(s, s.worker_token("w1"), "gpu", tmp_path / "w").start()
            try:
                wait_for(
                    lambda: any(
                        x["name"] == "w1" and x["attached"]
                        for x in s.api("GET", "/api/v1/workers").json()
                    ),
                    20,
                    "w1 over wss",
                )
                r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--", "echo", "remote")
                assert (r.code, r.out) == (0, "remote\n"), r.err
            finally:
                w.stop()
            plain = s.url.replace("https", "http")
            try:
                httpx.get(plain + "/healthz", timeout=5)
                served_plain = True
            except httpx.HTTPError:
                served_plain = False
            assert not served_plain
        finally:
            s.stop()

    def test_non_loopback_with_tls_is_allowed(self, tmp_path, sync_db_url):
        """A non-loopback listen starts when tls is set (here: "proxy", a proxy ends TLS)."""
        s = Server(
            home=tmp_path / "home",
            db_url=sync_db_url,
            builtin_worker=False,
            config={"network": {"tls": "proxy"}},
        )
        s.start()  # listens on 127.0.0.1 in tests; the refusal case is in test_bad_input
        s.stop()
        assert s.proc is not None and s.proc.returncode == 0
