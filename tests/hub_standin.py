"""A local aiohttp stand-in for the Hugging Face Hub's repo-creation and upload endpoints.

It mirrors the requests that `huggingface_hub` **2.4.0** makes for
`HfApi.create_repo(...)` and `HfApi.upload_folder(...)` (and so `create_commit`), read from the
installed client source. It was NOT checked against the real Hub: field names and status codes
are what that client sends and parses, plus the Hub behaviour its comments describe.

Endpoints, and where their shape comes from (paths relative to `huggingface_hub/`):

- `POST /api/repos/create`: `hf_api.py`, `HfApi.create_repo`. Body `{"name", "organization",
  "type", "visibility"?}`; answer `{"url"}`. 409 when the repo exists, still with `{"url"}`:
  with `exist_ok=True` the client swallows the 409 and then reads `r.json()["url"]`.
- `GET /api/{type}s/{ns}/{name}[/revision/{rev}]`: `hf_api.py`, `HfApi.dataset_info` (through
  `repo_info`). Called by `create_repo(exist_ok=True)` after a 401/402/403, and by
  `create_commit` when every file is unchanged (no-op commit). Answer parsed by `DatasetInfo`.
- `POST /api/validate-yaml`: `hf_api.py`, `HfApi._validate_yaml`, called by
  `_prepare_upload_folder_additions` and `create_commit` when `README.md` is uploaded. The
  client calls `.json()` before checking the status, so every answer (401 too) is JSON.
- `POST /api/{type}s/{ns}/{name}/preupload/{rev}`: `_commit_api.py`, `_fetch_upload_modes`.
  Body `{"files": [{"path", "sample" (base64 of the first 512 bytes), "size"}], "gitIgnore"?}`;
  answer `{"files": [{"path", "uploadMode": "lfs"|"regular", "shouldIgnore", "oid"?}]}` (checked by
  `_validate_preupload_info`). `oid` is the remote file's oid (git blob sha1 for regular files,
  sha256 for LFS ones, as `CommitOperationAdd._local_oid` computes them): an equal oid makes the
  client drop the file from the commit.
- `POST /[{type}s/]{ns}/{name}.git/info/lfs/objects/batch`: `lfs.py`, `post_lfs_batch_info`
  (git-lfs batch API). Body `{"operation": "upload", "transfers": ["basic", "multipart"],
  "objects": [{"oid", "size"}], "hash_algo": "sha256", "ref": {"name"}}`; answer
  `{"transfer": "basic", "objects": [{"oid", "size", "actions": {"upload": {"href"},
  "verify": {"href"}}}]}`; an object already stored gets no `actions` (the client then skips it).
- `PUT {upload href}`: `lfs.py`, `_upload_single_part`. The body is the raw file; the client
  sends NO Authorization header (a pre-signed storage URL), so this route is authorised by the
  random token in its URL instead, and refuses a request that carries an Authorization header
  (as S3 pre-signed URLs do). The stand-in checks size and sha256 against the batch's oid.
  No `chunk_size` header is returned, so the multipart path (`_upload_multi_part`) is never used.
- `POST {verify href}`: `lfs.py`, `lfs_upload`, body `{"oid", "size"}`, with the Hub headers.
- `POST /api/{type}s/{ns}/{name}/commit/{rev}`: `_commit_api.py`, `_send_commit` and
  `_prepare_commit_payload`. NDJSON body: a `header` line `{"summary", "description",
  "parentCommit"?}`, then `file` (`{"path", "content", "encoding": "base64"}`), `lfsFile`
  (`{"path", "algo": "sha256", "oid", "size"}`), `deletedFile` / `deletedFolder` (`{"path"}`)
  lines. Answer `{"commitOid", "commitUrl", "pullRequestUrl"}`, parsed into `CommitInfo`.
- `GET /api/{type}s/{ns}/{name}/xet-write-token/{rev}`: `utils/_xet.py`,
  `xet_connection_info_refresh_url`. Not implemented: answered 501 with an explanation, and
  recorded in `.xet_token_requests`.

Xet. In 2.4.0 the server cannot steer the client away from xet: the client decides alone with
`utils/_runtime.py::is_xet_available()` (`hf_xet` importable and not
`constants.HF_HUB_DISABLE_XET`). When it is true, `HfApi.upload_folder` goes through
`_upload_pipeline.py::pipelined_upload` (and `create_commit` through
`_commit_api.py::_upload_files` -> `_upload_xet_files`) and every file the preupload answer
marks `lfs` is sent with xet; the LFS batch endpoint is not even called (the batch response's
`transfer` field is not consulted for this). So either disable xet in the client
(`isolate_hub_client` below sets `constants.HF_HUB_DISABLE_XET = True`; the env variable
`HF_HUB_DISABLE_XET=1` only works if set before `huggingface_hub` is imported), or build the
stand-in with `lfs_patterns=(), lfs_threshold=None` so that every file is answered `regular`
and no xet (nor LFS) upload ever happens.

Usage: `async with running_hub_standin() as hub:` in an async test (call the sync client with
`asyncio.to_thread`), or `with hub_standin_in_thread() as hub:` in sync code; call
`isolate_hub_client(monkeypatch, tmp_path)` first, and mark LFS-path tests with
`pytest.mark.filterwarnings(IGNORE_HTTPX_DATA_DEPRECATION)`. State: `.url`, `.repos`
(repo_id -> type/private), `.files` (repo_id -> path -> bytes after the latest commit),
`.commits` (message, oid, added files, LFS paths, deletions), `.requests` (arrival order).

Simplifications: one branch (`main`; other revisions get 404 `RevisionNotFound`), no pull
requests (`create_pr` -> 400), no `.gitattributes` commit at creation (so `.files` holds exactly
what was uploaded), `shouldIgnore` always false, and the LFS decision is path patterns plus a
size threshold (the Hub's default `.gitattributes` patterns and its 10 MB limit), not the Hub's
own rules (which also look at the `sample` for binary content).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fnmatch
import hashlib
import json
import os
import re
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

PLAYED = ((1, 31), (2, 6))
"""The huggingface_hub versions whose private upload requests this stand-in plays, from the
first to before the second: read from 2.4.0's source, run at 1.31 (the lowest pyproject.toml
allows), 2.4.0 and 2.5.0 (released since; the tests below pass on it unchanged, 7 December
2026). regen's own hub code is tested at the public API (tests/hub_api.py); the
tests that drive the real client on this stand-in run only here."""


def _minor(text: str) -> tuple[int, int]:
    major, minor = (re.match(r"\d+", part) for part in text.split(".")[:2])
    return (int(major.group()) if major else 0, int(minor.group()) if minor else 0)


HUB_VERSION = version("huggingface_hub")
PLAYED_CLIENT = pytest.mark.skipif(
    not PLAYED[0] <= _minor(HUB_VERSION) < PLAYED[1],
    reason=f"huggingface_hub {HUB_VERSION} is outside the versions tests/hub_standin.py plays "
    f"({'.'.join(map(str, PLAYED[0]))} to before {'.'.join(map(str, PLAYED[1]))}): read the "
    "new client's upload requests into it, then widen PLAYED",
)
"""Marks a test that drives the real client on the stand-in."""

DEFAULT_TOKEN = "hf_test"
DEFAULT_REVISION = "main"
# A subset of the Hub's default `.gitattributes` LFS patterns for dataset repos.
DEFAULT_LFS_PATTERNS: tuple[str, ...] = (
    "*.7z",
    "*.arrow",
    "*.bin",
    "*.bz2",
    "*.gz",
    "*.npy",
    "*.npz",
    "*.parquet",
    "*.pkl",
    "*.pt",
    "*.safetensors",
    "*.tar",
    "*.xz",
    "*.zip",
    "*.zst",
)
DEFAULT_LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub's limit for regular (non-LFS) files
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
# `lfs.py::_upload_single_part` PUTs the file with `data=fileobj`, which `httpx2` deprecates; under
# `filterwarnings = error` that warning fails the upload. Tests that go the LFS way need:
# `pytest.mark.filterwarnings(IGNORE_HTTPX_DATA_DEPRECATION)`.
IGNORE_HTTPX_DATA_DEPRECATION = (
    "ignore:Use 'content=<...>' to upload raw bytes/text content.:DeprecationWarning:httpx2"
)
_TYPE_PLURALS = {"models": "model", "datasets": "dataset", "spaces": "space", "kernels": "kernel"}
_TYPES = "models|datasets|spaces|kernels"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class RepoRecord:
    repo_id: str
    repo_type: str
    private: bool


@dataclass
class CommitRecord:
    repo_id: str
    repo_type: str
    oid: str
    parent: str | None
    message: str
    description: str
    added: dict[str, bytes]  # path -> bytes, regular and LFS files of this commit
    lfs_paths: set[str]  # the paths of `added` that came as `lfsFile` lines
    deleted: list[str]


def git_blob_sha1(data: bytes) -> str:
    """The git oid of a blob: what the client compares a regular file's remote `oid` with."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _error(status: int, message: str, code: str | None = None) -> web.Response:
    headers = {"X-Error-Message": message}
    if code is not None:
        headers["X-Error-Code"] = code
    return web.json_response({"error": message}, status=status, headers=headers)


class HubStandin:
    """The stand-in's state and aiohttp app; start it with `start()` or `running_hub_standin`."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        lfs_patterns: tuple[str, ...] = DEFAULT_LFS_PATTERNS,
        lfs_threshold: int | None = DEFAULT_LFS_THRESHOLD,
    ) -> None:
        self.token = token
        self.lfs_patterns = lfs_patterns
        self.lfs_threshold = lfs_threshold
        self.url = ""
        self.repos: dict[str, RepoRecord] = {}
        # repo_id -> path -> bytes: the tree after the latest commit.
        self.files: dict[str, dict[str, bytes]] = {}
        self.commits: list[CommitRecord] = []
        # "METHOD /path" of every request, in arrival order (the PUT's secret token left out).
        self.requests: list[str] = []
        self.xet_token_requests: list[str] = []
        self.unhandled: list[str] = []
        self.lfs_objects: dict[str, bytes] = {}  # sha256 hex -> bytes
        self._lfs_paths: dict[str, set[str]] = {}  # repo_id -> paths stored as LFS
        self._heads: dict[str, str] = {}  # repo_id -> head commit oid
        self._pending: dict[str, tuple[str, int]] = {}  # upload token -> (oid, size)
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        # Regular files come base64-encoded inside the commit body: allow big bodies.
        app = web.Application(client_max_size=1 << 30, middlewares=[self._log_and_auth])
        r = app.router
        r.add_post("/api/repos/create", self._create_repo)
        r.add_post("/api/validate-yaml", self._validate_yaml)
        repo = "/api/{type:" + _TYPES + "}/{ns}/{name}"
        r.add_get(repo, self._repo_info)
        r.add_get(repo + "/revision/{rev}", self._repo_info)
        r.add_post(repo + "/preupload/{rev}", self._preupload)
        r.add_post(repo + "/commit/{rev}", self._commit)
        r.add_get(repo + "/xet-write-token/{rev}", self._xet_token)
        git = "/{ns}/{name_git:[^/]+\\.git}/info/lfs/objects"
        for prefix in ("", "/{prefix:" + _TYPES + "}"):
            r.add_post(prefix + git + "/batch", self._lfs_batch)
            r.add_post(prefix + git + "/verify", self._lfs_verify)
        r.add_put("/__lfs_upload__/{upload_token}", self._lfs_put)
        r.add_route("*", "/{tail:.*}", self._unhandled)
        return app

    async def start(self, host: str = "127.0.0.1") -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ helpers

    @web.middleware
    async def _log_and_auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        is_upload = request.path.startswith("/__lfs_upload__/")
        self.requests.append(
            f"{request.method} {'/__lfs_upload__/…' if is_upload else request.path}"
        )
        if not is_upload and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, INVALID_CREDENTIALS)
        response: web.StreamResponse = await handler(request)
        return response

    def _is_lfs(self, path: str, size: int) -> bool:
        if size == 0:  # the client sends empty files as regular whatever the answer
            return False
        if self.lfs_threshold is not None and size >= self.lfs_threshold:
            return True
        name = path.rsplit("/", 1)[-1]
        return any(
            fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in self.lfs_patterns
        )

    def _repo(self, request: web.Request) -> RepoRecord | web.Response:
        """The repo named by the route; a 404 answer when unknown or of another type."""
        info = request.match_info
        if "name_git" in info:
            name = info["name_git"].removesuffix(".git")
            repo_type = _TYPE_PLURALS[info["prefix"]] if "prefix" in info else "model"
        else:
            name, repo_type = info["name"], _TYPE_PLURALS[info["type"]]
        repo_id = f"{info['ns']}/{name}"
        record = self.repos.get(repo_id)
        if record is None or record.repo_type != repo_type:
            return _error(404, "Repository not found", "RepoNotFound")
        if "rev" in info and info["rev"] != DEFAULT_REVISION:
            return _error(404, f"Invalid rev id: {info['rev']}", "RevisionNotFound")
        return record

    def _repo_url(self, record: RepoRecord) -> str:
        prefix = "" if record.repo_type == "model" else f"{record.repo_type}s/"
        return f"{self.url}/{prefix}{record.repo_id}"

    def _remote_oid(self, repo_id: str, path: str) -> str | None:
        data = self.files.get(repo_id, {}).get(path)
        if data is None:
            return None
        if path in self._lfs_paths.get(repo_id, set()):
            return hashlib.sha256(data).hexdigest()
        return git_blob_sha1(data)

    # ------------------------------------------------------------------ handlers

    async def _create_repo(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, org = body.get("name"), body.get("organization")
        if not isinstance(name, str) or not name or not isinstance(org, str) or not org:
            return _error(400, "The stand-in needs a namespaced repo id ('org/name')")
        repo_type = body.get("type") or "model"
        if repo_type not in _TYPE_PLURALS.values():
            return _error(400, f"Invalid repo type {repo_type!r}")
        repo_id = f"{org}/{name}"
        private = body.get("visibility") == "private" or body.get("private") is True
        existing = self.repos.get(repo_id)
        if existing is not None:
            return web.json_response(
                {"error": "You already created this repo", "url": self._repo_url(existing)},
                status=409,
            )
        record = RepoRecord(repo_id=repo_id, repo_type=repo_type, private=private)
        self.repos[repo_id] = record
        self.files[repo_id] = {}
        return web.json_response({"url": self._repo_url(record), "name": repo_id})

    async def _validate_yaml(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body.get("content"), str):
            return web.json_response({"errors": [{"message": "no content"}]}, status=400)
        return web.json_response({"errors": [], "warnings": []})

    async def _repo_info(self, request: web.Request) -> web.Response:
        record = self._repo(request)
        if isinstance(record, web.Response):
            return record
        files = self.files[record.repo_id]
        return web.json_response(
            {
                "_id": hashlib.sha1(record.repo_id.encode()).hexdigest()[:24],
                "id": record.repo_id,
                "private": record.private,
                "sha": self._heads.get(record.repo_id),
                "siblings": [{"rfilename": p} for p in sorted(files)],
            }
        )

    async def _preupload(self, request: web.Request) -> web.Response:
        record = self._repo(request)
        if isinstance(record, web.Response):
            return record
        if request.query.get("create_pr"):
            return _error(400, "The stand-in does not do pull requests")
        body = await request.json()
        answers = []
        for item in body.get("files", []):
            path, size = item["path"], item["size"]
            base64.b64decode(item["sample"], validate=True)  # as sent by the client
            answer: dict[str, Any] = {
                "path": path,
                "uploadMode": "lfs" if self._is_lfs(path, size) else "regular",
                "shouldIgnore": False,
            }
            oid = self._remote_oid(record.repo_id, path)
            if oid is not None:
                answer["oid"] = oid
            answers.append(answer)
        return web.json_response({"files": answers, "commitOid": self._heads.get(record.repo_id)})

    async def _lfs_batch(self, request: web.Request) -> web.Response:
        record = self._repo(request)
        if isinstance(record, web.Response):
            return record
        body = await request.json()
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            return _error(400, "The stand-in only does 'upload' with the 'basic' transfer")
        if body.get("hash_algo", "sha256") != "sha256":
            return _error(400, "Only sha256")
        ref = body.get("ref", {}).get("name", DEFAULT_REVISION)
        if ref != DEFAULT_REVISION:
            return _error(404, f"Invalid rev id: {ref}", "RevisionNotFound")
        git = self._repo_url(record).removeprefix(self.url) + ".git/info/lfs/objects"
        objects = []
        for obj in body["objects"]:
            oid, size = obj["oid"], obj["size"]
            if not (isinstance(oid, str) and _HEX64.match(oid) and isinstance(size, int)):
                return _error(400, f"Invalid LFS object {obj!r}")
            stored = self.lfs_objects.get(oid)
            if stored is not None and len(stored) == size:
                objects.append({"oid": oid, "size": size})  # no actions: already uploaded
                continue
            upload_token = secrets.token_urlsafe(16)
            self._pending[upload_token] = (oid, size)
            objects.append(
                {
                    "oid": oid,
                    "size": size,
                    "authenticated": True,
                    "actions": {
                        "upload": {"href": f"{self.url}/__lfs_upload__/{upload_token}"},
                        "verify": {"href": f"{self.url}{git}/verify"},
                    },
                }
            )
        return web.json_response(
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            content_type="application/vnd.git-lfs+json",
        )

    async def _lfs_put(self, request: web.Request) -> web.Response:
        pending = self._pending.get(request.match_info["upload_token"])
        if pending is None:
            return _error(403, "Unknown or used upload URL")
        if "Authorization" in request.headers:
            # S3 refuses a pre-signed URL sent with a second authentication mechanism.
            return _error(400, "Only one auth mechanism allowed")
        oid, size = pending
        data = await request.read()
        if len(data) != size:
            return _error(400, f"Size mismatch: announced {size}, received {len(data)}")
        if hashlib.sha256(data).hexdigest() != oid:
            return _error(400, "sha256 mismatch")
        del self._pending[request.match_info["upload_token"]]
        self.lfs_objects[oid] = data
        return web.Response(status=200, headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})

    async def _lfs_verify(self, request: web.Request) -> web.Response:
        record = self._repo(request)
        if isinstance(record, web.Response):
            return record
        body = await request.json()
        stored = self.lfs_objects.get(body.get("oid", ""))
        if stored is None or len(stored) != body.get("size"):
            return _error(404, "LFS object not found")
        return web.json_response({"success": True})

    async def _commit(self, request: web.Request) -> web.Response:
        record = self._repo(request)
        if isinstance(record, web.Response):
            return record
        if request.query.get("create_pr"):
            return _error(400, "The stand-in does not do pull requests")
        lines = [json.loads(line) for line in (await request.read()).splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return _error(400, "The first NDJSON line must be the header")
        header = lines[0]["value"]
        head = self._heads.get(record.repo_id)
        parent = header.get("parentCommit")
        if parent is not None and (head is None or not head.startswith(parent)):
            return _error(412, "A commit has happened since. Please refresh and try again.")
        tree = dict(self.files[record.repo_id])
        lfs_tree = set(self._lfs_paths.get(record.repo_id, set()))
        added: dict[str, bytes] = {}
        lfs_added: set[str] = set()
        deleted: list[str] = []
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value", {})
            path = value.get("path")
            if not isinstance(path, str) or not path or path.startswith("/"):
                return _error(400, f"Invalid path in {key} line")
            if key == "file":
                if value.get("encoding") != "base64":
                    return _error(400, "Only base64 content")
                try:
                    data = base64.b64decode(value["content"], validate=True)
                except (binascii.Error, KeyError):
                    return _error(400, f"Invalid base64 content for {path}")
                if self._is_lfs(path, len(data)):
                    return _error(400, f"{path} must be uploaded with LFS")
                tree[path] = added[path] = data
                lfs_tree.discard(path)
            elif key == "lfsFile":
                if value.get("algo") != "sha256":
                    return _error(400, "Only sha256")
                stored = self.lfs_objects.get(value.get("oid", ""))
                if stored is None or ("size" in value and len(stored) != value["size"]):
                    return _error(400, f"LFS object of {path} was not uploaded")
                tree[path] = added[path] = stored
                lfs_tree.add(path)
                lfs_added.add(path)
            elif key == "deletedFile":
                if path not in tree:
                    return _error(404, "A file with this name doesn't exist", "EntryNotFound")
                del tree[path]
                lfs_tree.discard(path)
                deleted.append(path)
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                gone = [p for p in tree if p.startswith(prefix)]
                if not gone:
                    return _error(404, "A folder with this name doesn't exist", "EntryNotFound")
                for p in gone:
                    del tree[p]
                    lfs_tree.discard(p)
                deleted.extend(gone)
            else:
                return _error(400, f"Unknown NDJSON key {key!r}")
        digest = hashlib.sha1()
        digest.update(json.dumps([head, header.get("summary"), header.get("description")]).encode())
        for p in sorted(tree):
            digest.update(p.encode() + b"\0" + hashlib.sha256(tree[p]).digest())
        oid = digest.hexdigest()
        self.files[record.repo_id] = tree
        self._lfs_paths[record.repo_id] = lfs_tree
        self._heads[record.repo_id] = oid
        self.commits.append(
            CommitRecord(
                repo_id=record.repo_id,
                repo_type=record.repo_type,
                oid=oid,
                parent=head,
                message=header.get("summary", ""),
                description=header.get("description", ""),
                added=added,
                lfs_paths=lfs_added,
                deleted=deleted,
            )
        )
        return web.json_response(
            {
                "success": True,
                "commitOid": oid,
                "commitUrl": f"{self._repo_url(record)}/commit/{oid}",
                "hookOutput": "",
                "pullRequestUrl": None,
            }
        )

    async def _xet_token(self, request: web.Request) -> web.Response:
        self.xet_token_requests.append(request.path)
        return _error(
            501,
            "The Hub stand-in does not implement xet: disable it in the client "
            "(huggingface_hub.constants.HF_HUB_DISABLE_XET = True) or build the stand-in "
            "with lfs_patterns=() and lfs_threshold=None",
        )

    async def _unhandled(self, request: web.Request) -> web.Response:
        self.unhandled.append(f"{request.method} {request.path}")
        return _error(404, f"Not implemented by the Hub stand-in: {request.method} {request.path}")


@asynccontextmanager
async def running_hub_standin(
    token: str = DEFAULT_TOKEN,
    *,
    lfs_patterns: tuple[str, ...] = DEFAULT_LFS_PATTERNS,
    lfs_threshold: int | None = DEFAULT_LFS_THRESHOLD,
) -> AsyncIterator[HubStandin]:
    """The stand-in on 127.0.0.1 (ephemeral port) in the current event loop.

    Call the (sync) client from another thread, e.g. `await asyncio.to_thread(api.upload_folder,
    ...)`, so that this loop stays free to answer.
    """
    hub = HubStandin(token, lfs_patterns=lfs_patterns, lfs_threshold=lfs_threshold)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.close()


@contextmanager
def hub_standin_in_thread(
    token: str = DEFAULT_TOKEN,
    *,
    lfs_patterns: tuple[str, ...] = DEFAULT_LFS_PATTERNS,
    lfs_threshold: int | None = DEFAULT_LFS_THRESHOLD,
) -> Iterator[HubStandin]:
    """The stand-in on its own event loop in a daemon thread, for sync tests and fixtures.

    Read its state after the client call returned (the answer orders the writes before it).
    """
    hub = HubStandin(token, lfs_patterns=lfs_patterns, lfs_threshold=lfs_threshold)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    error: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(hub.start())
        except BaseException as exc:  # surfaced to the caller below
            error.append(exc)
            started.set()
            loop.close()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(hub.close())
        loop.close()

    thread = threading.Thread(target=serve, name="hub-standin", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if error:
        raise error[0]
    try:
        yield hub
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def isolate_hub_client(monkeypatch: Any, tmp_path: Path) -> None:
    """Make `huggingface_hub` talk to an explicit endpoint only, with the explicit token only.

    `huggingface_hub.constants` reads the environment once, at import: setting env variables is
    not enough, so the constants are patched too (`monkeypatch` undoes both).

    - offline mode off (`HF_HUB_OFFLINE=1` blocks every request, even to 127.0.0.1);
    - telemetry off; xet off (see the module docstring); progress bars off;
    - no implicit token: `HF_TOKEN`, OIDC variables and the token files on the machine are
      hidden (`lfs.py::lfs_upload` builds the verify request's headers with `token=None`, which
      would otherwise read, and for an OAuth token possibly refresh, the machine's token).
    """
    import importlib

    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_OIDC_ID_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_TOKEN_PATH": str(tmp_path / "hf-home" / "token"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    patched: dict[str, Any] = {
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": True,
        "HF_HOME": env["HF_HOME"],
        "HF_TOKEN_PATH": env["HF_TOKEN_PATH"],
        "HF_STORED_TOKENS_PATH": os.path.join(env["HF_HOME"], "stored_tokens"),
    }
    for name, value in patched.items():
        monkeypatch.setattr(constants, name, value)
    tqdm_module = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(tqdm_module, "HF_HUB_DISABLE_PROGRESS_BARS", True)
