"""Authentication options against servers configured for them."""

from __future__ import annotations

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..certs import make_pki
from ..helpers import jetstream_writer, user_nkey_seed_file


def _write_one(spark, url, **options):
    # ensureStream=create makes the stream through the authenticated connection; the write
    # succeeding means every PubAck came back from it.
    df = spark.createDataFrame([("hello",)], "data string")
    jetstream_writer(df, url, subject="auth.x", stream="AUTH", ensureStream="create", **options).save()


def test_nkey_seed_file(spark, tmp_path):
    seed, public, seed_file = user_nkey_seed_file(tmp_path)
    with EmbeddedNatsServer(config=f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}') as server:
        _write_one(spark, server.url, nkeySeedFile=seed_file)
        _, _, other = user_nkey_seed_file(tmp_path)  # a user the server does not know
        with pytest.raises(Exception, match="refused the credentials") as info:
            _write_one(spark, server.url, nkeySeedFile=other)
        assert seed.decode() not in str(info.value)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_with_ca(spark, pki):
    config = f'tls {{ cert_file: "{pki["server_cert"]}", key_file: "{pki["server_key"]}" }}'
    with EmbeddedNatsServer(config=config) as server:
        _write_one(spark, server.url, tlsCaFile=pki["ca"])
        with pytest.raises(Exception, match="Cannot connect to NATS.*TLS handshake failed.*CERTIFICATE_VERIFY_FAILED"):
            _write_one(spark, server.url, connectTimeout="2s")  # no CA: the server's certificate is not trusted


def test_mutual_tls(spark, pki):
    config = (f'tls {{ cert_file: "{pki["server_cert"]}", key_file: "{pki["server_key"]}", '
              f'ca_file: "{pki["ca"]}", verify: true }}')
    with EmbeddedNatsServer(config=config) as server:
        _write_one(spark, server.url, tlsCaFile=pki["ca"], tlsCertFile=pki["client_cert"], tlsKeyFile=pki["client_key"])
        with pytest.raises(Exception, match="Cannot connect to NATS"):
            _write_one(spark, server.url, tlsCaFile=pki["ca"], connectTimeout="2s")  # no client certificate


def test_creds_file_in_operator_mode(spark, tmp_path):
    from ..jwt_auth import make_operator_setup

    setup = make_operator_setup()
    creds = tmp_path / "user.creds"
    creds.write_text(setup["creds"])
    with EmbeddedNatsServer(config=setup["config"]) as server:
        _write_one(spark, server.url, credsFile=str(creds))
        rows = (spark.read.format("jetstream").option("servers", server.url).option("credsFile", str(creds))
                .option("stream", "AUTH").load().collect())
        assert [r.data for r in rows] == [b"hello"]
        stranger = make_operator_setup("other")  # a user of an operator this server does not trust
        wrong = tmp_path / "wrong.creds"
        wrong.write_text(stranger["creds"])
        with pytest.raises(Exception, match="refused the credentials") as info:
            _write_one(spark, server.url, credsFile=str(wrong), connectTimeout="2s")
        assert stranger["user_seed"] not in str(info.value)
