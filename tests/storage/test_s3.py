"""S3-specific behaviour against a real S3 API server (moto) on loopback."""

from __future__ import annotations

import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from snapcell.errors import CheckpointNotFound, ConfigError, ObjectExists, StorageUnavailable
from snapcell.ops import cleanup
from snapcell.storage import S3Config, S3Store, install_lifecycle, open_store
from tests.s3server import TEST_CREDENTIALS, TEST_REGION

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_url_and_prefix(s3_store: S3Store, s3_client) -> None:
    assert s3_store.url == f"s3://{s3_store.bucket}/proj"
    s3_store.put("checkpoints/a", b"x")
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_store.bucket)["Contents"]]
    assert keys == ["proj/checkpoints/a"]


def test_prefix_isolates_stores(s3_bucket: str, s3_config: S3Config) -> None:
    one = S3Store(s3_bucket, "one", config=s3_config)
    one_two = S3Store(s3_bucket, "one2", config=s3_config)
    root = S3Store(s3_bucket, config=s3_config)
    one.put("k", b"1")
    one_two.put("k", b"2")
    assert [o.key for o in one.scan()] == ["k"]
    assert [o.key for o in root.scan()] == ["one/k", "one2/k"]
    assert root.url == f"s3://{s3_bucket}"


def test_expires_at_is_kept_as_metadata(s3_store: S3Store, s3_client) -> None:
    s3_store.put("k", b"x", expires_at=1234.5)
    head = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/k")
    assert head["Metadata"] == {"snapcell-expires-at": "1234.500"}


def test_open_store_s3(s3_bucket: str, s3_config: S3Config) -> None:
    store = open_store(f"s3://{s3_bucket}/a/b/", s3=s3_config)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == (s3_bucket, "a/b")
    store.put("k", b"v")
    assert store.get("k") == b"v"
    store.close()


def test_endpoint_from_environment(s3_bucket: str, s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPCELL_S3_ENDPOINT_URL", s3_server)
    store = S3Store(s3_bucket, config=S3Config(region_name=TEST_REGION, **TEST_CREDENTIALS))
    assert store.config.endpoint_url == s3_server
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_listing_and_cleanup_across_pages(s3_store: S3Store) -> None:
    # 1,500 objects: more than one 1,000-key page in both the listing and the cleanup.
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3_store.put(f"checkpoints/{i:05d}", b"x"), range(1500)))
    s3_store.put("heads/h", b"head")
    infos = list(s3_store.scan("checkpoints/"))
    assert [o.key for o in infos] == [f"checkpoints/{i:05d}" for i in range(1500)]
    report = cleanup(s3_store, now=time.time() + 8 * 86400)
    assert report.scanned_objects == 1501
    assert report.deleted_expired_objects == 1500
    assert [o.key for o in s3_store.scan()] == ["heads/h"]


def test_delete_many_ignores_missing(s3_store: S3Store) -> None:
    s3_store.put("a", b"1")
    s3_store.put("b", b"2")
    s3_store.delete_many(["a", "missing", "b"])
    assert list(s3_store.scan()) == []


def test_multipart_create_only_round_trip(s3_store: S3Store, s3_client) -> None:
    data = os.urandom(8 * MiB + 123)  # above the 8 MiB threshold: uploaded in two parts
    s3_store.put("big", data, expires_at=1e10)
    assert s3_store.get("big") == data
    head = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/big")
    assert head["ETag"].strip('"').endswith("-2")  # a multipart ETag
    with pytest.raises(ObjectExists):
        s3_store.put("big", b"y" * (9 * MiB))
    assert s3_store.get("big") == data
    uploads = s3_client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert not uploads.get("Uploads")  # the refused upload was aborted


def test_multipart_overwrite_uses_transfer_manager(s3_store: S3Store, s3_client) -> None:
    s3_store.put("big", b"small")
    data = os.urandom(9 * MiB)
    s3_store.put("big", data, overwrite=True)
    assert s3_store.get("big") == data
    head = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/big")
    assert "-" in head["ETag"]


def test_unreachable_endpoint_fails_fast() -> None:
    config = S3Config(endpoint_url=f"http://127.0.0.1:{_closed_port()}", region_name=TEST_REGION, **TEST_CREDENTIALS)
    store = S3Store("bucket", config=config)
    sent: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda **kwargs: sent.append(kwargs["request"].method))
    with pytest.raises(StorageUnavailable) as info:
        store.get("k")
    # Fast means few attempts, each refused at once: never more than max_attempts (fewer if the deadline is near).
    assert 1 <= len(sent) <= config.max_attempts == 3, sent
    message = str(info.value)
    assert "endpoint URL" in message and "127.0.0.1" in message
    assert info.value.__cause__ is not None
    with pytest.raises(StorageUnavailable):
        list(store.scan())


def test_missing_bucket_is_unavailable(s3_config: S3Config) -> None:
    store = S3Store(f"missing-{uuid.uuid4().hex[:12]}", config=s3_config)
    for call in (lambda: store.put("k", b"x"), lambda: store.get("k"), lambda: list(store.scan())):
        with pytest.raises(StorageUnavailable, match="bucket name"):
            call()


def test_missing_key_not_found(s3_store: S3Store) -> None:
    with pytest.raises(CheckpointNotFound) as info:
        s3_store.get("checkpoints/none")
    assert info.value.key == "checkpoints/none"
    assert info.value.__cause__ is not None


def test_install_lifecycle(s3_store: S3Store, s3_client) -> None:
    other = {"ID": "someone-else", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 30}}
    s3_client.put_bucket_lifecycle_configuration(Bucket=s3_store.bucket, LifecycleConfiguration={"Rules": [other]})
    rule, blob_rule = install_lifecycle(s3_store, ttl_days=7)
    assert rule["Filter"] == {"Prefix": "proj/checkpoints/"}
    assert rule["Expiration"] == {"Days": 8}
    assert blob_rule["Filter"] == {"Prefix": "proj/blobs/"}
    assert blob_rule["Expiration"] == {"Days": 9}
    install_lifecycle(s3_store, ttl_days=3)  # same IDs: replaced, not duplicated
    rules = s3_client.get_bucket_lifecycle_configuration(Bucket=s3_store.bucket)["Rules"]
    by_id = {r["ID"]: r for r in rules}
    assert set(by_id) == {"someone-else", rule["ID"], blob_rule["ID"]}
    assert by_id[rule["ID"]]["Expiration"]["Days"] == 4
    assert by_id[blob_rule["ID"]]["Expiration"]["Days"] == 5
    assert by_id[rule["ID"]]["Filter"]["Prefix"] == "proj/checkpoints/"
    assert by_id["someone-else"]["Expiration"]["Days"] == 30


def test_install_lifecycle_on_bucket_without_rules(s3_store: S3Store, s3_client) -> None:
    installed = install_lifecycle(s3_store)
    rules = s3_client.get_bucket_lifecycle_configuration(Bucket=s3_store.bucket)["Rules"]
    assert [r["ID"] for r in rules] == [r["ID"] for r in installed]
    with pytest.raises(ConfigError):
        install_lifecycle(s3_store, ttl_days=0)


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        S3Config(max_attempts=0)
    with pytest.raises(ConfigError):
        S3Config(aws_access_key_id="only-half")
    with pytest.raises(ConfigError):
        S3Store("bad/bucket", config=S3Config(**TEST_CREDENTIALS, region_name=TEST_REGION))


def test_touch_keeps_the_objects_metadata(s3_store: S3Store, s3_client) -> None:
    s3_store.put("checkpoints/k", b"payload", expires_at=1234.5)
    before = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/checkpoints/k")
    s3_store.touch("checkpoints/k")
    head = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/checkpoints/k")
    assert head["Metadata"] == {"snapcell-expires-at": "1234.500", "snapcell-touched": "1"}
    assert head["LastModified"] >= before["LastModified"]
    s3_store.touch("checkpoints/k")  # touching twice keeps working (S3 refuses a copy that changes nothing)
    head = s3_client.head_object(Bucket=s3_store.bucket, Key="proj/checkpoints/k")
    assert head["Metadata"] == {"snapcell-expires-at": "1234.500", "snapcell-touched": "1"}
    assert s3_store.get("checkpoints/k") == b"payload"


def test_touch_of_a_missing_key(s3_store: S3Store) -> None:
    with pytest.raises(CheckpointNotFound):
        s3_store.touch("checkpoints/missing")


@pytest.fixture
def sessions_made(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The boto3 sessions made from now on (their keyword arguments)."""
    import boto3

    made: list[object] = []
    real = boto3.session.Session

    def counted(*args: object, **kwargs: object) -> object:
        made.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(boto3.session, "Session", counted)
    return made


def test_stores_with_the_same_explicit_credentials_share_one_boto3_session(
    s3_server: str, s3_bucket: str, sessions_made: list[object]
) -> None:
    """A store's client comes from a kept session (a new one reads botocore's service data again); each client
    keeps its own event hooks, so one store's deadline and retry hooks never run for another's calls."""
    # Credentials no other test uses: the kept sessions are the process's.
    keys = {"aws_access_key_id": f"key-{uuid.uuid4().hex}", "aws_secret_access_key": "secret"}
    config = S3Config(endpoint_url=s3_server, region_name=TEST_REGION, **keys)
    first, second = S3Store(s3_bucket, "a", config=config), S3Store(s3_bucket, "b", config=config)
    other = S3Store(s3_bucket, "c", config=S3Config(endpoint_url=s3_server, region_name="eu-west-1", **keys))
    try:
        assert len(sessions_made) == 2  # one session for the first two stores, one for the other region
        assert first.client.meta.events is not second.client.meta.events
        first.put("k", b"1")  # moto takes any credentials
        assert first.get("k") == b"1"
        with pytest.raises(CheckpointNotFound):
            second.get("k")  # its own prefix
    finally:
        for store in (first, second, other):
            store.close()


def test_stores_from_the_default_credential_chain_each_read_it_again(
    s3_server: str, s3_bucket: str, sessions_made: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_CREDENTIALS["aws_secret_access_key"])
    config = S3Config(endpoint_url=s3_server, region_name=TEST_REGION)
    stores = [S3Store(s3_bucket, "a", config=config), S3Store(s3_bucket, "b", config=config)]
    for store in stores:
        store.close()
    assert len(sessions_made) == 2  # credentials changed in the environment would be seen by the next store
