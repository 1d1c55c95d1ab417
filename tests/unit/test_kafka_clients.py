"""Kafka TLS and SASL/SCRAM from settings: one builder for aiokafka and Faust, clear errors.

The embedded broker (Tansu) speaks neither SASL nor TLS, so these check what the
clients are handed; Faust's own converter (``credentials_to_aiokafka_auth``) is the
reference for what the worker's clients receive.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from quantdrift.config import KafkaSettings, Settings
from quantdrift.errors import ConfigError
from quantdrift.kafka_clients import consumer_kwargs, faust_credentials, producer_kwargs

SECURITY_KEYS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real self-signed CA certificate (openssl), so the SSL context really loads it."""
    d = tmp_path_factory.mktemp("tls")
    key, pem = str(d / "ca.key"), str(d / "ca.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=quantdrift-test-ca", "-keyout", key, "-out", pem],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return d / "ca.pem"


def test_plaintext_by_default() -> None:
    k = KafkaSettings()
    assert producer_kwargs(k)["security_protocol"] == "PLAINTEXT"
    assert "sasl_mechanism" not in consumer_kwargs(k) and "ssl_context" not in consumer_kwargs(k)
    assert faust_credentials(k) is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl_from_the_environment_reaches_aiokafka_and_faust_alike(
    mechanism: str, ca_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "SECURITY_PROTOCOL": "SASL_SSL",
        "SASL_MECHANISM": mechanism,
        "SASL_USERNAME": "quantdrift-worker",
        "SASL_PASSWORD": "s3cret-scram-password",
        "SSL_CAFILE": str(ca_file),
    }.items():
        monkeypatch.setenv(f"QUANTDRIFT_KAFKA__{name}", value)
    k = Settings().kafka
    assert "s3cret" not in repr(k)  # a SecretStr until the client needs it
    for kwargs in (producer_kwargs(k), consumer_kwargs(k)):
        assert {key: kwargs[key] for key in SECURITY_KEYS} == {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": "quantdrift-worker",
            "sasl_plain_password": "s3cret-scram-password",
        }
        context = kwargs["ssl_context"]
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        ca_names = [c["subject"] for c in context.get_ca_certs()]
        assert ((("commonName", "quantdrift-test-ca"),),) in ca_names
    credentials = faust_credentials(k)
    assert "s3cret" not in repr(credentials)
    faust_side = credentials_to_aiokafka_auth(credentials)
    assert {key: faust_side[key] for key in SECURITY_KEYS} == {
        key: producer_kwargs(k)[key] for key in SECURITY_KEYS
    }
    assert isinstance(faust_side["ssl_context"], ssl.SSLContext)


def test_ssl_alone(ca_file: Path) -> None:
    k = KafkaSettings(security_protocol="SSL", ssl_cafile=ca_file)
    assert producer_kwargs(k)["security_protocol"] == "SSL"
    faust_side = credentials_to_aiokafka_auth(faust_credentials(k))
    assert faust_side["security_protocol"] == "SSL"
    assert isinstance(faust_side["ssl_context"], ssl.SSLContext)


def test_sasl_plaintext_scram() -> None:
    k = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password="p",  # type: ignore[arg-type]
    )
    kwargs = producer_kwargs(k)
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-256" and "ssl_context" not in kwargs
    assert credentials_to_aiokafka_auth(faust_credentials(k))["security_protocol"] == (
        "SASL_PLAINTEXT"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-1", "sasl_username": "u",
          "sasl_password": "p"}, "'SCRAM-SHA-1' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u"},
         "SCRAM-SHA-512 needs sasl_username and sasl_password"),
        ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u", "sasl_password": "p"},
         "security_protocol is PLAINTEXT: set SASL_SSL"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
         "kafka.ssl_cafile /nonexistent/ca.pem is not a readable file"),
        ({"security_protocol": "SSL", "ssl_keyfile": "/nonexistent/k.pem"},
         "ssl_keyfile is set without kafka.ssl_certfile"),
    ],
)  # fmt: skip
def test_inconsistent_settings_are_one_clear_config_error(
    fields: dict[str, str], message: str
) -> None:
    k = KafkaSettings.model_validate(fields)
    for build in (producer_kwargs, consumer_kwargs, faust_credentials):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            build(k)
