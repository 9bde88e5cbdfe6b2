"""`huggingface_hub`'s real upload client against the local Hub stand-in (no network), for the
client versions the stand-in plays (hub_standin.PLAYED; skipped by name outside them)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import close_session

from tests.hub_standin import (
    IGNORE_HTTPX_DATA_DEPRECATION,
    INVALID_CREDENTIALS,
    PLAYED_CLIENT,
    HubStandin,
    hub_standin_in_thread,
    isolate_hub_client,
    running_hub_standin,
)

# huggingface_hub 2.4.0's own LFS PUT triggers an httpx2 DeprecationWarning (see hub_standin).
pytestmark = [pytest.mark.filterwarnings(IGNORE_HTTPX_DATA_DEPRECATION), PLAYED_CLIENT]

REPO = "regen-test/exported"
TOKEN = "hf_test"


@pytest.fixture
def client_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    isolate_hub_client(monkeypatch, tmp_path)
    yield
    close_session()  # drop pooled connections to this test's (now closed) port


@pytest.fixture
async def hub(client_env: None) -> AsyncIterator[HubStandin]:
    async with running_hub_standin(TOKEN) as standin:
        yield standin


def make_folder(root: Path) -> dict[str, bytes]:
    """README.md, a JSONL in a subfolder and a Parquet file; returns path -> bytes."""
    root.mkdir()
    (root / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Exported\n")
    (root / "data").mkdir()
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(3)]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = pa.table({"id": list(range(50)), "text": [f"row {i}" for i in range(50)]})
    pq.write_table(table, root / "data" / "train.parquet")
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_upload_folder_commits_exactly_the_folder(hub: HubStandin, tmp_path: Path) -> None:
    expected = make_folder(tmp_path / "out")
    api = HfApi(endpoint=hub.url, token=TOKEN)

    url = await asyncio.to_thread(api.create_repo, REPO, repo_type="dataset", exist_ok=True)
    assert url.repo_id == REPO and url.repo_type == "dataset"
    # exist_ok: a second create is answered 409 and accepted.
    await asyncio.to_thread(api.create_repo, REPO, repo_type="dataset", exist_ok=True)
    assert {k: (r.repo_type, r.private) for k, r in hub.repos.items()} == {REPO: ("dataset", False)}

    info = await asyncio.to_thread(
        api.upload_folder,
        folder_path=tmp_path / "out",
        repo_id=REPO,
        repo_type="dataset",
        commit_message="Export 3 rows",
    )

    assert hub.files[REPO] == expected
    assert sorted(expected) == ["README.md", "data/train.jsonl", "data/train.parquet"]
    [commit] = hub.commits
    assert commit.message == "Export 3 rows" and info.oid == commit.oid
    # The Parquet file went the LFS way (batch, PUT, verify), the text files inline.
    assert commit.lfs_paths == {"data/train.parquet"}
    parquet = expected["data/train.parquet"]
    assert hub.lfs_objects == {hashlib.sha256(parquet).hexdigest(): parquet}
    assert "PUT /__lfs_upload__/…" in hub.requests
    assert hub.xet_token_requests == [] and hub.unhandled == []

    # Same folder again: every file is unchanged (remote oids), no new commit.
    await asyncio.to_thread(
        api.upload_folder,
        folder_path=tmp_path / "out",
        repo_id=REPO,
        repo_type="dataset",
        commit_message="again",
    )
    assert len(hub.commits) == 1 and hub.files[REPO] == expected


async def test_wrong_token_is_refused(hub: HubStandin, tmp_path: Path) -> None:
    make_folder(tmp_path / "out")
    good = HfApi(endpoint=hub.url, token=TOKEN)
    await asyncio.to_thread(good.create_repo, REPO, repo_type="dataset")

    bad = HfApi(endpoint=hub.url, token="hf_wrong")
    with pytest.raises(HfHubHTTPError) as create_error:
        await asyncio.to_thread(bad.create_repo, "regen-test/other", repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as upload_error:
        await asyncio.to_thread(
            bad.upload_folder,
            folder_path=tmp_path / "out",
            repo_id=REPO,
            repo_type="dataset",
            commit_message="nope",
        )
    for error in (create_error.value, upload_error.value):
        assert error.response is not None and error.response.status_code == 401
        assert INVALID_CREDENTIALS in str(error)
    assert list(hub.repos) == [REPO] and hub.commits == [] and hub.files[REPO] == {}


def test_regular_only_standin_serves_a_xet_enabled_client(
    client_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Thread-hosted stand-in answering `regular` for every file: no LFS, so no xet either.

    With `hf_xet` installed and xet enabled, `upload_folder` takes the pipelined (xet) path,
    which would send any `lfs` file through xet; all-regular keeps it on the stand-in.
    """
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    expected = make_folder(tmp_path / "out")
    with hub_standin_in_thread(TOKEN, lfs_patterns=(), lfs_threshold=None) as hub:
        api = HfApi(endpoint=hub.url, token=TOKEN)
        api.create_repo(REPO, repo_type="dataset", private=True, exist_ok=True)
        api.upload_folder(
            folder_path=tmp_path / "out", repo_id=REPO, repo_type="dataset", commit_message="m"
        )
        assert hub.repos[REPO].private is True
        assert hub.files[REPO] == expected
        assert [c.lfs_paths for c in hub.commits] == [set()] and hub.lfs_objects == {}
        assert hub.xet_token_requests == [] and hub.unhandled == []
