"""TLS and token security for a real Pulsar standalone: a CA, a broker certificate and JWT tokens.

`SecuritySetup` writes into a directory (the standalone's data dir) what a secured Pulsar cluster
is configured with, as an operator would make it with `openssl` and `pulsar tokens`:

- `ca.cert.pem`: a self-signed CA; `broker.cert.pem` / `broker.key-pk8.pem`: the broker's
  certificate for 127.0.0.1 and localhost (the key in PKCS#8, which the broker's Netty wants);
- `token-secret.key`: the HS256 secret key (raw bytes, as `pulsar tokens create-secret-key`
  writes it) that `AuthenticationProviderToken` reads from `tokenSecretKey=file:///...`;
- `token(role)`: a token whose subject is `role`, signed with that key (Pulsar's own token format:
  header `{"alg":"HS256"}`, claim `sub`, no expiry).

`broker_config()` and `worker_config()` are the standalone.conf and functions_worker.yml keys that
turn on TLS, token authentication and authorization with `super_user` as the super-user role,
the broker's internal clients authenticating as that role, and the function worker running each
instance with its submitter's token (ClearTextFunctionTokenAuthProvider, as the process runtime
needs). Tests use it; it is also what docs/security.md describes for a real deployment.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["AUTH_PROVIDER_TOKEN", "AUTH_TOKEN_PLUGIN", "FUNCTION_AUTH_PROVIDER", "SecuritySetup", "make_token"]

AUTH_PROVIDER_TOKEN = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
AUTH_TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
FUNCTION_AUTH_PROVIDER = "org.apache.pulsar.functions.auth.ClearTextFunctionTokenAuthProvider"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_token(secret: bytes, subject: str, expires_at: Optional[int] = None) -> str:
    """An HS256 JWT with claim `sub` = `subject` (and `exp` when given), as `pulsar tokens create
    --secret-key` makes it: the header is `{"alg":"HS256"}`."""
    header = _b64url(json.dumps({"alg": "HS256"}, separators=(",", ":")).encode())
    claims: Dict[str, Any] = {"sub": subject}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    signature = _b64url(hmac.new(secret, signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{signature}"


@dataclass
class SecuritySetup:
    """The CA, broker certificate, token key and tokens of one secured cluster.

    Args:
        super_user: the super-user role (superUserRoles); the broker's own clients and the
            function worker authenticate as it.
        hosts: the names the broker certificate is valid for (IP addresses and DNS names).
        directory: where the files go; set by `write()` (PulsarStandalone passes `<data_dir>/security`).
    """

    super_user: str = "superuser"
    hosts: tuple = ("127.0.0.1", "localhost")
    directory: Optional[Path] = None
    _secret: bytes = field(default=b"", init=False, repr=False)

    # -- files -------------------------------------------------------------------------------
    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM) clients trust: `--tls-trust-cert-path`, `tlsTrustCertsFilePath`."""
        return self._dir() / "ca.cert.pem"

    @property
    def cert_path(self) -> Path:
        """The broker's certificate (PEM)."""
        return self._dir() / "broker.cert.pem"

    @property
    def key_path(self) -> Path:
        """The broker's private key (PKCS#8 PEM)."""
        return self._dir() / "broker.key-pk8.pem"

    @property
    def secret_key_path(self) -> Path:
        """The token secret key (raw bytes)."""
        return self._dir() / "token-secret.key"

    def _dir(self) -> Path:
        if self.directory is None:
            raise ValueError("SecuritySetup.write(directory) has not run yet")
        return Path(self.directory)

    def write(self, directory: Path) -> "SecuritySetup":
        """Create the CA, the broker certificate and the secret key in `directory`, once: files
        that are already there (a restart on the same data dir) are kept, so tokens made before
        stay valid."""
        self.directory = Path(directory)
        self._dir().mkdir(parents=True, exist_ok=True)
        if not self.secret_key_path.is_file():
            self.secret_key_path.write_bytes(os.urandom(32))
            self.secret_key_path.chmod(0o600)
        self._secret = self.secret_key_path.read_bytes()
        if not (self.ca_path.is_file() and self.cert_path.is_file() and self.key_path.is_file()):
            self._write_certificates()
        return self

    def _write_certificates(self) -> None:
        # Function-level import: `cryptography` is needed only by secured test clusters.
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pulsar-lifecycle test CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        names: list = []
        for host in self.hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.hosts[0])]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
        self.key_path.chmod(0o600)

    # -- tokens ------------------------------------------------------------------------------
    def token(self, role: str) -> str:
        """A token for `role`, signed with this cluster's secret key."""
        if not self._secret:
            self._secret = self.secret_key_path.read_bytes()
        return make_token(self._secret, role)

    def auth_params(self, role: str) -> str:
        """`--auth-params` / authParams for AuthenticationToken: `token:<jwt>`."""
        return f"token:{self.token(role)}"

    # -- configuration -----------------------------------------------------------------------
    def broker_config(self, *, broker_tls_port: int, web_tls_port: int) -> Dict[str, str]:
        """standalone.conf keys: TLS on both ports, token authentication, authorization with the
        super-user role, and the broker's internal clients (namespace bootstrap, the admin client,
        the function worker's client) authenticating as the super user over TLS."""
        return {
            "brokerServicePortTls": str(broker_tls_port),
            "webServicePortTls": str(web_tls_port),
            "tlsCertificateFilePath": str(self.cert_path),
            "tlsKeyFilePath": str(self.key_path),
            "tlsTrustCertsFilePath": str(self.ca_path),
            "tlsAllowInsecureConnection": "false",
            "tlsRequireTrustedClientCertOnConnect": "false",
            "authenticationEnabled": "true",
            "authenticationProviders": AUTH_PROVIDER_TOKEN,
            "tokenSecretKey": f"file://{self.secret_key_path}",
            "authorizationEnabled": "true",
            "superUserRoles": self.super_user,
            "brokerClientAuthenticationPlugin": AUTH_TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": self.auth_params(self.super_user),
            "brokerClientTlsEnabled": "true",
            "brokerClientTrustCertsFilePath": str(self.ca_path),
        }

    def worker_config(self, *, service_url_tls: str, admin_url_tls: str) -> Dict[str, Any]:
        """functions_worker.yml keys: the worker's clients over TLS as the super user, its REST
        API authenticated and authorized, and instances run with the submitter's token."""
        return {
            "pulsarServiceUrl": service_url_tls,
            "pulsarWebServiceUrl": admin_url_tls,
            "authenticationEnabled": True,
            "authenticationProviders": [AUTH_PROVIDER_TOKEN],
            "authorizationEnabled": True,
            "superUserRoles": [self.super_user],
            "properties": {"tokenSecretKey": f"file://{self.secret_key_path}"},
            "brokerClientAuthenticationPlugin": AUTH_TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": self.auth_params(self.super_user),
            "clientAuthenticationPlugin": AUTH_TOKEN_PLUGIN,
            "clientAuthenticationParameters": self.auth_params(self.super_user),
            "useTls": True,
            "tlsEnabled": True,
            "tlsAllowInsecureConnection": False,
            "tlsEnableHostnameVerification": False,
            "tlsTrustCertsFilePath": str(self.ca_path),
            "brokerClientTrustCertsFilePath": str(self.ca_path),
            "tlsCertificateFilePath": str(self.cert_path),
            "tlsKeyFilePath": str(self.key_path),
            "functionAuthProviderClassName": FUNCTION_AUTH_PROVIDER,
        }

    def client_conf(self, *, service_url: str, admin_url: str, role: Optional[str] = None) -> str:
        """A client.conf (as pulsar-admin reads it) for `role` (default: the super user)."""
        return (f"webServiceUrl={admin_url}/\nbrokerServiceUrl={service_url}\n"
                f"authPlugin={AUTH_TOKEN_PLUGIN}\nauthParams={self.auth_params(role or self.super_user)}\n"
                f"tlsTrustCertsFilePath={self.ca_path}\ntlsAllowInsecureConnection=false\n"
                "tlsEnableHostnameVerification=false\n")
