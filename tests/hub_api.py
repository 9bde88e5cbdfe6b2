"""huggingface_hub at its public boundary: `HfApi.create_repo` and `HfApi.upload_folder`, the two
calls regen makes, replaced by a recorder that answers as the Hub does (a `CommitInfo`, or an
`HfHubHTTPError` with the Hub's status). regen's hub code is tested against this, so that a new
huggingface_hub, whose private upload protocol tests/hub_standin.py plays, cannot break those
tests with no change in regen; one end-to-end test still drives the real client on the stand-in.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import CommitInfo, HfApi, get_session
from huggingface_hub.errors import HfHubHTTPError


@dataclass
class PublicHub:
    """What regen asked of the Hub through HfApi, and the Hub's side: the token it accepts, the
    repositories made and the files each received. `down` makes every call fail as an
    unreachable Hub does (the transport's own error, no HTTP status)."""

    token: str
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    clients: list[tuple[str | None, str | None]] = field(default_factory=list)
    """(endpoint, token) of each HfApi regen used, as it was constructed."""
    down: bool = False

    def create_repo(self, api: HfApi, repo_id: str, **kwargs: Any) -> str:
        self._check(api, "POST", "api/repos/create")
        self.repos[repo_id] = kwargs
        return f"{api.endpoint}/datasets/{repo_id}"

    def upload_folder(self, api: HfApi, *, folder_path: str, repo_id: str, **kw: Any) -> CommitInfo:
        self._check(api, "POST", f"api/datasets/{repo_id}/commit/main")
        assert repo_id in self.repos, "upload_folder before create_repo"
        root = Path(folder_path)
        files = (p for p in root.rglob("*") if p.is_file())
        self.files[repo_id] = {p.relative_to(root).as_posix(): p.read_bytes() for p in files}
        # The Hub's own address: CommitInfo parses it as a Hub URL (a stand-in's host fails).
        url = f"https://huggingface.co/datasets/{repo_id}/commit/0123abcd"
        return CommitInfo(
            commit_url=url,
            commit_message=kw.get("commit_message", ""),
            commit_description="",
            oid="0123abcd",
        )

    def _check(self, api: HfApi, method: str, path: str) -> None:
        self.clients.append((api.endpoint, api.token if isinstance(api.token, str) else None))
        if self.down:
            raise ConnectionError(f"[Errno 111] Connection refused: {api.endpoint}")
        if api.token != self.token:
            raise _http_error(401, method, f"{api.endpoint}/{path}", "Invalid credentials")


def _http_error(status: int, method: str, url: str, message: str) -> HfHubHTTPError:
    """The error huggingface_hub raises for an HTTP status, with a response of the HTTP library
    that version of huggingface_hub uses (httpx or its successor), found from its own session."""
    http = importlib.import_module(type(get_session()).__module__.split(".")[0])
    response = http.Response(status, request=http.Request(method, url), json={"error": message})
    return HfHubHTTPError(f"{status} Client Error for url: {url} ({message})", response=response)


def patch_public_hub(monkeypatch: pytest.MonkeyPatch, token: str) -> PublicHub:
    """Route regen's HfApi calls to a PublicHub that accepts `token` (monkeypatch undoes it)."""
    hub = PublicHub(token)

    def create_repo(api: HfApi, repo_id: str, **kwargs: Any) -> str:
        return hub.create_repo(api, repo_id, **kwargs)

    def upload_folder(api: HfApi, **kwargs: Any) -> CommitInfo:
        return hub.upload_folder(api, **kwargs)

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return hub
