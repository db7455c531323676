"""How the clients and channels choose their connection to rota (rota._rota_connection): arguments
over ``ROTA_TOKEN`` and ``ROTA_TLS_*``, plaintext or TLS by the address and the CA, and the
refusals of settings that cannot work."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from rota._rota_connection import rota_connection
from rota._settings import CHANNEL_OPTIONS


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    # ssl_channel_credentials only keeps the bytes; the handshake would parse them.
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_the_token_argument_wins_over_rota_token() -> None:
    env = {"ROTA_TOKEN": "from-the-environment"}
    assert rota_connection("h:1", token="from-the-argument", env=env).token == "from-the-argument"
    assert rota_connection("h:1", env=env).metadata() == (("authorization", "Bearer from-the-environment"),)
    # An empty argument means no token, whatever the environment says; an empty variable is unset.
    assert rota_connection("h:1", token="", env=env).metadata() == ()
    assert rota_connection("h:1", env={"ROTA_TOKEN": ""}).token is None


def test_a_ca_makes_the_connection_tls(pem: Path) -> None:
    assert rota_connection("h:1", env={}).credentials is None
    assert rota_connection("h:1", tls_ca=pem, env={}).credentials is not None
    assert rota_connection("h:1", env={"ROTA_TLS_CA": str(pem)}).credentials is not None
    # http:// says plaintext, a CA in the environment notwithstanding.
    plain = rota_connection("http://h:1/", env={"ROTA_TLS_CA": str(pem)})
    assert (plain.target, plain.credentials) == ("h:1", None)
    secure = rota_connection("https://h:1", env={"ROTA_TLS_CA": str(pem)})
    assert (secure.target, secure.credentials is not None) == ("h:1", True)


def test_https_needs_a_ca() -> None:
    with pytest.raises(ValueError, match=r"an https:// server needs tls_ca \(or ROTA_TLS_CA\)"):
        rota_connection("https://h:1", env={})


@pytest.mark.parametrize("given", ["tls_cert", "tls_key"])
def test_a_certificate_and_its_key_go_together(pem: Path, given: str) -> None:
    cert, key = (pem, None) if given == "tls_cert" else (None, pem)
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        rota_connection("h:1", tls_ca=pem, tls_cert=cert, tls_key=key, env={})
    variable = "ROTA_TLS_CERT" if given == "tls_cert" else "ROTA_TLS_KEY"
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        rota_connection("h:1", tls_ca=pem, env={variable: str(pem)})


def test_a_tls_file_that_cannot_be_read_is_named(tmp_path: Path, pem: Path) -> None:
    missing = tmp_path / "client.key"
    with pytest.raises(ValueError, match=f"cannot read tls_key {missing}: No such file"):
        rota_connection("h:1", tls_ca=pem, tls_cert=pem, tls_key=missing, env={})


def test_own_credentials_replace_the_tls_settings(pem: Path) -> None:
    own = grpc.ssl_channel_credentials()
    chosen = rota_connection("h:1", credentials=own, env={"ROTA_TLS_CA": "/nowhere", "ROTA_TOKEN": "t"})
    assert (chosen.credentials, chosen.token) == (own, "t")
    with pytest.raises(ValueError, match="either credentials or tls_ca"):
        rota_connection("h:1", credentials=own, tls_ca=pem, env={})


def test_a_connection_attempt_has_time_for_a_tls_handshake() -> None:
    # grpc-core takes grpc.min_reconnect_backoff_ms as the time one connection attempt may take
    # (20 s when unset); a TLS handshake with a busy rota can take longer than 100 ms.
    assert dict(CHANNEL_OPTIONS).get("grpc.min_reconnect_backoff_ms", 20_000) >= 5_000
