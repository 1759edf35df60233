"""store_client.own_store_client: a second client of the job's TCPStore, under the attempt's prefix, whose
long waits hold no other client (c10d's TCPStore client runs one operation at a time)."""

import concurrent.futures
import datetime

import pytest
import torch.distributed as dist

from distflow.distributed.store_client import own_store_client


@pytest.fixture
def job_store(monkeypatch):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    own_store_client.cache_clear()
    yield server
    own_store_client.cache_clear()


def test_the_own_client_shares_the_job_store_under_the_attempt_prefix(job_store):
    client = own_store_client("board", 10)
    assert own_store_client("board", 10) is client  # one per name and process
    client.set("k", b"v")
    assert dist.PrefixStore("distflow/attempt_3/board", job_store).get("k") == b"v"


def test_a_long_wait_on_the_own_client_holds_no_other_client(job_store):
    client = own_store_client("board", 10)
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
        client.wait, ["event/0"], datetime.timedelta(seconds=10)
    )
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.3)
    # meanwhile the job's other client (the failure watch's) still works, and wakes the waiter
    job_store.set("distflow/failure-check", b"")
    assert job_store.check(["distflow/failure-check"])
    dist.PrefixStore("distflow/attempt_3/board", job_store).set("event/0", b"")
    assert waiting.result(timeout=10) is None


def test_without_a_job_store_there_is_no_own_client(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    own_store_client.cache_clear()
    assert own_store_client("board", 10) is None
    own_store_client.cache_clear()
