"""`regen export --push-to-hub`'s upload (outputs/hub.py) against huggingface_hub's public API
(tests/hub_api.py): what it asks of HfApi, and one line for each way the Hub can refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.errors import ConfigError, StateError
from regen.outputs.hub import push_to_hub
from tests.hub_api import patch_public_hub

TOKEN = "hf_secret"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An export folder, and HF_ENDPOINT / HF_TOKEN set as a user sets them."""
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.test:8080")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "tokenized"
    (out / "data").mkdir(parents=True)
    (out / "README.md").write_text("---\nlicense: unknown\n---\n# Export\n")
    (out / "data" / "chat-00000.parquet").write_bytes(b"PAR1 rows PAR1")
    return out


def test_the_folder_goes_to_a_dataset_repo_with_the_environments_hub_and_token(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = patch_public_hub(monkeypatch, TOKEN)
    url = push_to_hub(folder, "me/regen-out", private=True)
    assert hub.clients == [("http://hub.test:8080", TOKEN)] * 2
    assert hub.repos == {
        "me/regen-out": {"repo_type": "dataset", "exist_ok": True, "private": True}
    }
    assert hub.files["me/regen-out"] == {
        "README.md": (folder / "README.md").read_bytes(),
        "data/chat-00000.parquet": b"PAR1 rows PAR1",
    }
    assert url == "https://huggingface.co/datasets/me/regen-out/commit/0123abcd"


def test_a_token_the_hub_refuses_is_one_line_with_the_status_and_the_next_step(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = patch_public_hub(monkeypatch, "hf_other")
    with pytest.raises(StateError) as info:
        push_to_hub(folder, "me/regen-out")
    text = str(info.value)
    assert "\n" not in text and TOKEN not in text
    assert text.startswith(f"cannot upload {folder} to the Hub dataset me/regen-out (HTTP 401): ")
    assert "upload it again with the same command" in text and "HF_TOKEN" in text
    assert hub.files == {} and (folder / "README.md").exists()


def test_an_unreachable_hub_is_one_line_too(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = patch_public_hub(monkeypatch, TOKEN)
    hub.down = True
    with pytest.raises(StateError) as info:
        push_to_hub(folder, "me/regen-out")
    assert "\n" not in str(info.value) and "HTTP" not in str(info.value)
    assert "Connection refused" in str(info.value)


@pytest.mark.parametrize("repo", ["regen-out", "me/", "/out", "me/regen/out"])
def test_a_repo_that_is_not_owner_slash_name_is_refused_before_any_call(
    folder: Path, monkeypatch: pytest.MonkeyPatch, repo: str
) -> None:
    hub = patch_public_hub(monkeypatch, TOKEN)
    with pytest.raises(ConfigError, match="takes OWNER/NAME"):
        push_to_hub(folder, repo)
    assert hub.clients == []
