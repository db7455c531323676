"""A rota that asks for a token, over plaintext, TLS and mTLS, with certificates made for the run.

The certificates come from ``scripts/make-test-certs.sh`` (openssl): a CA for rota's certificate
(for 127.0.0.1), a second CA rota trusts for client certificates, a client certificate it signed,
and one from a CA rota does not trust.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rota_harness import REPO_ROOT, RotaServer

#: The token rota accepts (the pick scope and every service's register scope).
TOKEN = "py-client-token-0123456789"
#: A token rota does not know.
WRONG_TOKEN = "py-unknown-token-0123456789"
#: rota's messages for a call without a token and with one it does not know.
NO_TOKEN_MESSAGE = "no token: send `authorization: Bearer TOKEN`"
INVALID_TOKEN_MESSAGE = "the token is not valid"

MAKE_CERTS_TIMEOUT = 60.0


@dataclass(frozen=True)
class Certificates:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    @property
    def other_cert(self) -> Path:
        return self.dir / "other.pem"

    @property
    def other_key(self) -> Path:
        return self.dir / "other.key"


def make_certificates(dir: Path) -> Certificates:
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "make-test-certs.sh"), str(dir)],
        check=True,
        timeout=MAKE_CERTS_TIMEOUT,
    )
    return Certificates(dir)


def auth_config(dir: Path) -> Path:
    """A config file with :data:`TOKEN`, read from a token file next to it."""
    token_file = dir / "client.token"
    token_file.write_text(TOKEN)
    config = dir / "auth.toml"
    config.write_text(
        f'[[auth.tokens]]\nname = "python-client"\ntoken_file = "{token_file}"\nscopes = ["pick", "register:*"]\n'
    )
    return config


def start_secured(
    start: Callable[..., RotaServer], dir: Path, certs: Certificates, tls: bool, mtls: bool
) -> RotaServer:
    """rota with :data:`TOKEN`; with ``tls`` its listener serves TLS, with ``mtls`` it asks for a client certificate."""
    args = ["--config", str(auth_config(dir))]
    if tls:
        args += ["--tls-cert", str(certs.dir / "server.pem"), "--tls-key", str(certs.dir / "server.key")]
    if mtls:
        args += ["--tls-client-ca", str(certs.dir / "client-ca.pem")]
    return start(*args)
