"""A small, offline Hugging Face Hub for tests (standard library only).

It speaks the subset of the Hub protocol that `huggingface_hub` 1.x/2.x uses to create repositories, upload
folders (regular files inline in the commit, or LFS files through the batch API and a PUT), create branches,
list trees and download files (`hf_hub_download`, `snapshot_download`, `from_pretrained`), and to check a token
(`whoami`, `auth_check`, with or without `write`). State lives in memory: repositories with commits and
branches, nothing on disk.

Test helpers:
  - `fail(...)` / `recover()`: answer HTTP 500 (or another status) to every request, or only to some kinds of
    requests (e.g. "commit"), for a number of seconds or requests;
  - `hold(...)`: park requests of some kinds until the test releases them (a deterministic "slow server");
  - `stall(...)`: accept requests (of some kinds) and never answer them, like a dead proxy, until `reset()`;
  - `requests(...)`: the request log; `files(...)` / `commits(...)`: the repository state.
  - `add_convert_ref(...)`: a `refs/convert/parquet` export, as the Hub writes beside a dataset's branches.
  - `namespaces` / `token_role`: where the token may create and write repos (403 elsewhere), and its role.

`huggingface_hub` reads `HF_ENDPOINT` once, at import: point it here before anything imports it
(tests/conftest.py does).
Run standalone with `python tests/hub_server.py --port 8765` for manual experiments.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
REPO_ACTIONS = {
    "revision",
    "tree",
    "paths-info",
    "preupload",
    "commit",
    "branch",
    "refs",
    "commits",
    "xet-write-token",
    "xet-read-token",
    "auth-check",
}
GITATTRIBUTES = (
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"
)
USER = "kiln-test"


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        """What git stores: the content itself, or the LFS pointer to it."""
        return git_blob_oid(lfs_pointer(self.sha256, self.size) if self.lfs else self.data)

    @property
    def upload_oid(self) -> str:
        """What the preupload endpoint reports, compared client-side with the local file's oid."""
        return self.sha256 if self.lfs else self.git_oid

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str = field(default_factory=_now)
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    lfs_objects: dict[str, bytes] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if revision in self.commits:
            return self.commits[revision]
        if len(revision) >= 7:
            matches = [oid for oid in self.commits if oid.startswith(revision)]
            if len(matches) == 1:
                return self.commits[matches[0]]
        return None


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    kind: str
    status: int
    authorized: bool
    """Whether the request carried an Authorization header (the token itself is never logged)."""


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class Gate:
    """Parks matching requests until released; `entered` is set when the first one arrives."""

    def __init__(self, kinds: set[str]):
        self.kinds = kinds
        self.entered = threading.Event()
        self._opened = threading.Event()

    def release(self) -> None:
        self._opened.set()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class _Fault:
    kinds: set[str] | None
    status: int
    until: float | None
    remaining: int | None

    def applies(self, kind: str) -> bool:
        if self.until is not None and time.monotonic() >= self.until:
            return False
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.kinds is None or kind in self.kinds


class HubServer:
    """The in-memory Hub. `start()` serves it from a background thread on `host:port` (port 0: any free)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None, cdn_host: str = "localhost"
    ):
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.hub = self  # type: ignore[attr-defined]
        self.host, self.port = self.httpd.server_address[:2]
        self.cdn_host = cdn_host
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.reset(token=token)

    # ---------------------------------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for gate in self._gates:
            gate.release()
        self._stall_released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self, *, token: str | None = None) -> None:
        """Forget all repositories, faults, gates and logged requests; restore the default settings."""
        with self._lock:
            for gate in getattr(self, "_gates", []):
                gate.release()
            self.repos: dict[tuple[str, str], Repo] = {}
            self.token = token
            """If set, writes and private reads need it (`Authorization: Bearer <token>`)."""
            self.upload_mode = "regular"
            """Preupload answer: `regular` (inline in the commit, works with Xet on), `lfs` (every non-empty
            file through the LFS batch API; needs HF_HUB_DISABLE_XET=1 on the client) or `auto` (LFS for
            binary files or files of `lfs_threshold` bytes and more)."""
            self.lfs_threshold = 10 * 1024 * 1024
            self.lfs_redirect = True
            """Answer /resolve of LFS files with a 302 to a "CDN" on another origin, as the Hub does."""
            self.namespaces: set[str] | None = None
            """The namespaces the token may create repos in and write to (its user and organisations, as on the
            Hub); None: every namespace."""
            self.token_role = "write"
            """The token's role as whoami reports it: `write`, or `read` (creates and writes answer 403)."""
            self.ignore_globs: list[str] = []
            """Paths matching these globs get `shouldIgnore: true` in the preupload answer."""
            self.gate_timeout = 60.0
            self._log: list[LoggedRequest] = []
            self._fault: _Fault | None = None
            self._gates: list[Gate] = []
            self._commit_counter = 0
            if getattr(self, "_stall_released", None) is not None:
                self._stall_released.set()  # let the stalled handlers of the previous test go
            self._stall_released = threading.Event()
            self._stall_kinds: set[str] | None = set()

    # ---------------------------------------------------------------------------------- fault injection
    def fail(
        self,
        *,
        only: str | set[str] | None = None,
        status: int = 500,
        seconds: float | None = None,
        times: int | None = None,
    ) -> None:
        """Answer `status` to every request (or only to request kinds in `only`, e.g. "commit"), until
        `recover()`, for `seconds`, or for the next `times` matching requests."""
        kinds = {only} if isinstance(only, str) else (set(only) if only is not None else None)
        until = time.monotonic() + seconds if seconds is not None else None
        with self._lock:
            self._fault = _Fault(kinds, status, until, times)

    def recover(self) -> None:
        with self._lock:
            self._fault = None

    def stall(self, only: str | set[str] | None = None) -> None:
        """Accept every request (or those of the kinds in `only`) and never answer: the connection stays open,
        silent, until `reset()` or `stop()` (then it is closed without a response)."""
        with self._lock:
            self._stall_kinds = None if only is None else ({only} if isinstance(only, str) else set(only))

    def _stalls(self, kind: str) -> threading.Event | None:
        with self._lock:
            kinds = self._stall_kinds
            if kinds is None or kind in kinds:
                return self._stall_released
            return None

    def hold(self, only: str | set[str] = "commit") -> Gate:
        """Park requests of these kinds until `gate.release()` (or the end of a `with` block)."""
        gate = Gate({only} if isinstance(only, str) else set(only))
        with self._lock:
            self._gates.append(gate)
        return gate

    # --------------------------------------------------------------------------------------- inspection
    def requests(self, *, kind: str | None = None, method: str | None = None) -> list[LoggedRequest]:
        with self._lock:
            return [
                r
                for r in self._log
                if (kind is None or r.kind == kind) and (method is None or r.method == method)
            ]

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        with self._lock:
            return self.repos[(repo_type, repo_id)]

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        with self._lock:
            commit = self.repo(repo_id, repo_type).resolve(revision)
            assert commit is not None, f"no revision {revision!r} in {repo_id}"
            return {path: blob.data for path, blob in commit.files.items()}

    def blobs(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, Blob]:
        with self._lock:
            commit = self.repo(repo_id, repo_type).resolve(revision)
            assert commit is not None, f"no revision {revision!r} in {repo_id}"
            return dict(commit.files)

    def commits(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[Commit]:
        """Commits reachable from `revision`, newest first (the first one is the repo's initial commit)."""
        with self._lock:
            repo = self.repo(repo_id, repo_type)
            history, commit = [], repo.resolve(revision)
            while commit is not None:
                history.append(commit)
                commit = repo.commits.get(commit.parent) if commit.parent else None
            return history

    def create_repo(self, repo_id: str, repo_type: str = "model", private: bool = False) -> Repo:
        with self._lock:
            repo = Repo(repo_type, repo_id, private)
            self.repos[(repo_type, repo_id)] = repo
            self._new_commit(
                repo, None, "initial commit", "", {".gitattributes": Blob(GITATTRIBUTES, lfs=False)}
            )
            repo.branches["main"] = next(iter(repo.commits))
            return repo

    def add_convert_ref(
        self, repo_id: str, files: dict[str, bytes], repo_type: str = "dataset", name: str = "parquet"
    ) -> Commit:
        """`refs/convert/<name>`, which only the Hub itself writes (its Parquet export of a dataset, beside the
        repo's own branches): a commit of its own holding `files`, resolvable as the revision `refs/convert/<name>`
        and listed under the repo's `converts`."""
        with self._lock:
            repo = self.repo(repo_id, repo_type)
            blobs = {".gitattributes": Blob(GITATTRIBUTES, lfs=False)}
            blobs.update({path: Blob(data, lfs=False) for path, data in files.items()})
            commit = self._new_commit(repo, None, "Update parquet files", "", blobs)
            repo.branches[f"refs/convert/{name}"] = commit.oid
            return commit

    # ---------------------------------------------------------------------------------------- internals
    def _new_commit(self, repo: Repo, parent: str | None, title: str, message: str, files: dict) -> Commit:
        self._commit_counter += 1
        digest = hashlib.sha1(f"{repo.repo_id}\n{parent}\n{title}\n{self._commit_counter}".encode())
        for path in sorted(files):
            digest.update(f"{path}:{files[path].git_oid}".encode())
        commit = Commit(digest.hexdigest(), parent, title, message, _now(), files)
        repo.commits[commit.oid] = commit
        return commit

    def _record(self, request: LoggedRequest) -> None:
        with self._lock:
            self._log.append(request)

    def _injected_status(self, kind: str) -> int | None:
        with self._lock:
            fault = self._fault
            if fault is None or not fault.applies(kind):
                return None
            if fault.remaining is not None:
                fault.remaining -= 1
            return fault.status

    def _wait_at_gates(self, kind: str) -> None:
        with self._lock:
            gates = [g for g in self._gates if kind in g.kinds and not g._opened.is_set()]
        for gate in gates:
            gate.entered.set()
            gate._opened.wait(self.gate_timeout)


def _classify(method: str, segments: list[str]) -> tuple[str, dict]:
    """Map a request to (kind, arguments). Segments are the raw, still-quoted path pieces."""
    seg = [unquote(s) for s in segments]
    if seg[:2] == ["api", "whoami-v2"]:
        return "whoami", {}
    if seg[:2] == ["api", "repos"] and len(seg) == 3:
        return {"create": "create_repo", "delete": "delete_repo"}.get(seg[2], "unknown"), {}
    if seg[:2] == ["api", "validate-yaml"]:
        return "validate_yaml", {}
    if seg[:2] == ["api", "agent-harnesses"]:
        return "agent_harnesses", {}
    if seg[:1] == ["__lfs__"] and len(seg) >= 2:
        return {"upload": "lfs_upload", "verify": "lfs_verify"}.get(seg[1], "unknown"), {"rest": seg[2:]}
    if seg[:1] == ["__cdn__"] and len(seg) == 2:
        return "cdn", {"oid": seg[1]}
    if len(seg) >= 3 and seg[0] == "api" and seg[1] in REPO_TYPES:
        repo_type, rest = REPO_TYPES[seg[1]], seg[2:]
        split = 2 if len(rest) >= 2 and rest[1] not in REPO_ACTIONS else 1
        repo_id, rest = "/".join(rest[:split]), rest[split:]
        args = {"repo_type": repo_type, "repo_id": repo_id}
        if not rest:
            return "repo_info", {**args, "revision": "main"}
        action, rest = rest[0], rest[1:]
        if action == "revision" and rest:
            return "repo_info", {**args, "revision": rest[0]}
        if action == "tree" and rest:
            return "tree", {**args, "revision": rest[0], "path": "/".join(rest[1:])}
        if action in ("paths-info", "preupload", "commit", "branch", "commits") and rest:
            return action.replace("-", "_"), {**args, "revision": rest[0]}
        if action == "refs":
            return "refs", args
        if action == "auth-check":
            return "auth_check", {**args, "write": rest[:1] == ["write"]}
        if action.startswith("xet-"):
            return "xet_token", args
        return "unknown", {}
    # Git LFS batch endpoint: /[datasets/]{repo_id}.git/info/lfs/objects/batch
    if len(seg) >= 5 and seg[-4:] == ["info", "lfs", "objects", "batch"]:
        repo_type = REPO_TYPES.get(seg[0], "model")
        parts = seg[1:-4] if seg[0] in ("datasets", "spaces") else seg[:-4]
        repo_id = "/".join(parts)
        if repo_id.endswith(".git"):
            return "lfs_batch", {"repo_type": repo_type, "repo_id": repo_id[: -len(".git")]}
    # File download: /[datasets/]{repo_id}/resolve/{revision}/{path}
    offset = 1 if seg[:1] in (["datasets"], ["spaces"]) else 0
    for i in (offset + 1, offset + 2):
        if len(seg) > i + 2 and seg[i] == "resolve":
            repo_type = REPO_TYPES[seg[0]] if offset else "model"
            return "resolve", {
                "repo_type": repo_type,
                "repo_id": "/".join(seg[offset:i]),
                "revision": seg[i + 1],
                "path": "/".join(seg[i + 2 :]),
            }
    return "unknown", {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub; every response carries a Content-Length
    server_version = "KilnTestHub/1.0"

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr access log
        pass

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def do_PUT(self):
        self._dispatch()

    def do_DELETE(self):
        self._dispatch()

    # ----------------------------------------------------------------------------------------- plumbing
    def _read_body(self) -> bytes:
        """Always drain the request body, or the next request on this keep-alive connection is garbage."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self._status = status
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        headers.setdefault("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, payload, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _token_state(self) -> str:
        """`none`, `valid` or `invalid`."""
        auth = self.headers.get("Authorization")
        if not auth:
            return "none"
        expected = self.hub.token
        return "valid" if expected is None or auth == f"Bearer {expected}" else "invalid"

    def _dispatch(self) -> None:
        self._status = 0
        body = self._read_body()
        url = urlsplit(self.path)
        segments = [s for s in url.path.split("/") if s]
        kind, args = _classify(self.command, segments)
        stalled = self.hub._stalls(kind)
        if stalled is not None:
            self.hub._record(LoggedRequest(self.command, url.path, kind, 0, "Authorization" in self.headers))
            stalled.wait()
            self.close_connection = True  # hang up without an answer
            return
        try:
            self.hub._wait_at_gates(kind)
            injected = self.hub._injected_status(kind)
            if injected is not None:
                raise HubError(injected, f"Injected failure ({injected}) for a {kind} request")
            if self._token_state() == "invalid":
                raise HubError(401, "Invalid credentials in Authorization header")
            handler = getattr(self, f"_do_{kind}", None)
            if handler is None:
                raise HubError(404, f"The Kiln test Hub does not implement {self.command} {url.path}")
            handler(body=body, query=parse_qs(url.query), **args)
        except HubError as err:
            headers = dict(err.headers)
            if err.code:
                headers["X-Error-Code"] = err.code
            headers["X-Error-Message"] = err.message
            self._json({"error": err.message}, err.status, headers)
        except Exception as err:  # a bug in this server: answer 500 rather than hang the client
            self._json({"error": f"test hub crashed: {type(err).__name__}: {err}"}, 500)
        finally:
            authorized = "Authorization" in self.headers
            self.hub._record(LoggedRequest(self.command, url.path, kind, self._status, authorized))

    # ------------------------------------------------------------------------------------------ helpers
    def _repo(self, repo_type: str, repo_id: str, *, write: bool = False) -> Repo:
        with self.hub._lock:
            repo = self.hub.repos.get((repo_type, repo_id))
        authorized = self._token_state() == "valid"
        if repo is None or (repo.private and not authorized):
            raise HubError(404, "Repository not found", "RepoNotFound")
        if write and not authorized:
            raise HubError(401, "You must be authenticated to write to this repository")
        if write and not self._may_write(repo_id.split("/")[0]):
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    def _may_write(self, namespace: str) -> bool:
        allowed = self.hub.namespaces
        return self.hub.token_role == "write" and (allowed is None or namespace in allowed)

    def _commit(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _json_body(self, body: bytes) -> dict:
        try:
            return json.loads(body or b"{}")
        except ValueError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    def _file_entry(self, path: str, blob: Blob) -> dict:
        entry = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": path}
        if blob.lfs:
            pointer = lfs_pointer(blob.sha256, blob.size)
            entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": len(pointer)}
        return entry

    def _folder_entry(self, path: str, commit: Commit) -> dict:
        return {
            "type": "directory",
            "oid": hashlib.sha1(f"{commit.oid}:{path}".encode()).hexdigest(),
            "size": 0,
            "path": path,
        }

    @staticmethod
    def _folders(files: dict[str, Blob]) -> set[str]:
        folders = set()
        for path in files:
            parts = path.split("/")[:-1]
            folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return folders

    def _upload_mode(self, size: int, sample: bytes) -> str:
        mode = self.hub.upload_mode
        if size == 0 or mode == "regular":
            return "regular"
        if mode == "lfs":
            return "lfs"
        return "lfs" if size >= self.hub.lfs_threshold or b"\0" in sample else "regular"

    # ----------------------------------------------------------------------------------------- handlers
    def _do_whoami(self, **_):
        if self._token_state() != "valid":
            raise HubError(401, "Invalid credentials in Authorization header")
        self._json(
            {
                "type": "user",
                "id": "0" * 24,
                "name": USER,
                "fullname": "Kiln Test",
                "email": None,
                "isPro": False,
                "canPay": False,
                "orgs": [
                    {"type": "org", "name": name} for name in sorted((self.hub.namespaces or set()) - {USER})
                ],
                "auth": {
                    "type": "access_token",
                    "accessToken": {"displayName": "kiln-tests", "role": self.hub.token_role},
                },
            }
        )

    def _do_agent_harnesses(self, **_):
        self._json({"standardEnvVars": [], "harnesses": {}})  # fetched once a day by huggingface_hub

    def _do_create_repo(self, body, **_):
        payload = self._json_body(body)
        if self._token_state() != "valid":
            raise HubError(401, "You must be authenticated to create a repository")
        repo_type = payload.get("type") or "model"
        name, organization = payload.get("name"), payload.get("organization") or USER
        if not name or repo_type not in URL_PREFIXES:
            raise HubError(400, f"Invalid repo name or type: {name!r}, {repo_type!r}")
        repo_id = f"{organization}/{name}"
        url = f"{self.hub.url}/{URL_PREFIXES[repo_type]}{repo_id}"
        if not self._may_write(organization):  # the Hub answers so whether or not the repo exists
            raise HubError(
                403,
                f'You don\'t have the rights to create a {repo_type} under the namespace "{organization}"',
            )
        with self.hub._lock:
            if (repo_type, repo_id) in self.hub.repos:
                # `create_repo(exist_ok=True)` reads the url from this 409 answer
                self._json({"error": f"You already created this {repo_type} repo", "url": url}, 409)
                return
            private = payload.get("private", payload.get("visibility") == "private")
            self.hub.create_repo(repo_id, repo_type, private=bool(private))
        self._json({"url": url, "name": repo_id, "id": repo_id})

    def _do_auth_check(self, repo_type, repo_id, write, **_):
        self._repo(repo_type, repo_id, write=write)  # 404 unknown or private, 401 or 403 no right to write
        self._json({})

    def _do_delete_repo(self, body, **_):
        payload = self._json_body(body)
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or USER}/{payload.get('name')}"
        self._repo(repo_type, repo_id, write=True)
        with self.hub._lock:
            del self.hub.repos[(repo_type, repo_id)]
        self._json({})

    def _do_validate_yaml(self, body, **_):
        content = self._json_body(body).get("content", "")
        lines = content.splitlines()
        if lines and lines[0].strip() == "---" and not any(line.strip() == "---" for line in lines[1:]):
            self._json(
                {"errors": [{"message": "metadata block is not closed with '---'"}], "warnings": []}, 400
            )
            return
        self._json({"errors": [], "warnings": []})

    def _do_repo_info(self, repo_type, repo_id, revision, query, **_):
        repo = self._repo(repo_type, repo_id)
        with self.hub._lock:
            commit = self._commit(repo, revision)
        with_blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path, blob in sorted(commit.files.items()):
            sibling = {"rfilename": path}
            if with_blobs:
                sibling.update(size=blob.size, blobId=blob.git_oid)
                if blob.lfs:
                    pointer = lfs_pointer(blob.sha256, blob.size)
                    sibling["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": len(pointer)}
            siblings.append(sibling)
        author = repo_id.split("/")[0] if "/" in repo_id else None
        self._json(
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": author,
                "sha": commit.oid,
                "lastModified": commit.date,
                "createdAt": repo.created_at,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    def _do_tree(self, repo_type, repo_id, revision, path, query, **_):
        repo = self._repo(repo_type, repo_id)
        with self.hub._lock:
            commit = self._commit(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = path.strip("/")
        folders = self._folders(commit.files)
        if prefix and prefix not in folders:
            if prefix in commit.files:  # the Hub lists a file path as that single file
                self._json([self._file_entry(prefix, commit.files[prefix])])
                return
            raise HubError(404, f"Entry not found: {prefix}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        base = f"{prefix}/" if prefix else ""

        def listed(p: str) -> bool:
            return p.startswith(base) and (recursive or "/" not in p[len(base) :])

        entries = [self._folder_entry(p, commit) for p in sorted(folders) if listed(p)]
        entries += [self._file_entry(p, b) for p, b in sorted(commit.files.items()) if listed(p)]
        self._json(entries)

    def _do_paths_info(self, repo_type, repo_id, revision, body, **_):
        repo = self._repo(repo_type, repo_id)
        with self.hub._lock:
            commit = self._commit(repo, revision)
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = self._json_body(body).get("paths", [])
        else:
            paths = parse_qs(body.decode()).get("paths", [])
        folders = self._folders(commit.files)
        entries = []
        for path in paths:
            path = path.strip("/")
            if path in commit.files:
                entries.append(self._file_entry(path, commit.files[path]))
            elif path in folders:
                entries.append(self._folder_entry(path, commit))
        self._json(entries)

    def _do_refs(self, repo_type, repo_id, **_):
        repo = self._repo(repo_type, repo_id)
        with self.hub._lock:
            branches = [
                {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid}
                for name, oid in repo.branches.items()
                if not name.startswith("refs/")
            ]
            converts = [
                {"name": name.removeprefix("refs/convert/"), "ref": name, "targetCommit": oid}
                for name, oid in repo.branches.items()
                if name.startswith("refs/convert/")
            ]
        self._json({"branches": branches, "converts": converts, "tags": [], "pullRequests": []})

    def _do_commits(self, repo_type, repo_id, revision, **_):
        self._repo(repo_type, repo_id)
        try:
            history = self.hub.commits(repo_id, revision, repo_type)
        except AssertionError:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound") from None
        self._json(
            [
                {
                    "id": c.oid,
                    "title": c.title,
                    "message": c.message,
                    "date": c.date,
                    "authors": [{"user": USER}],
                }
                for c in history
            ]
        )

    def _do_branch(self, repo_type, repo_id, revision, body, **_):
        repo = self._repo(repo_type, repo_id, write=True)
        with self.hub._lock:
            if self.command == "DELETE":
                if revision not in repo.branches:
                    raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                del repo.branches[revision]
                self._json({})
                return
            if revision in repo.branches:
                raise HubError(409, "Reference already exists")
            if revision.startswith("refs/"):
                raise HubError(400, f"Invalid reference for a branch: {revision}")
            start = self._json_body(body).get("startingPoint") or "main"
            repo.branches[revision] = self._commit(repo, start).oid
        self._json({})

    def _do_xet_token(self, **_):
        raise HubError(
            501,
            "The Kiln test Hub has no Xet storage: answer uploadMode 'regular', or set HF_HUB_DISABLE_XET=1 "
            "on the client for the LFS path",
        )

    def _do_preupload(self, repo_type, repo_id, revision, body, **_):
        repo = self._repo(repo_type, repo_id, write=True)
        payload = self._json_body(body)
        with self.hub._lock:
            commit = self._commit(repo, revision)
        answers = []
        for item in payload.get("files", []):
            path = item["path"]
            sample = base64.b64decode(item.get("sample") or "")
            existing = commit.files.get(path)
            answers.append(
                {
                    "path": path,
                    "uploadMode": self._upload_mode(int(item.get("size", 0)), sample),
                    "shouldIgnore": any(fnmatch.fnmatch(path, g) for g in self.hub.ignore_globs),
                    "oid": existing.upload_oid if existing is not None else None,
                }
            )
        self._json({"files": answers, "commitOid": commit.oid})

    def _do_lfs_batch(self, repo_type, repo_id, body, **_):
        repo = self._repo(repo_type, repo_id, write=True)
        payload = self._json_body(body)
        if payload.get("operation") != "upload":
            raise HubError(400, "The Kiln test Hub only supports the LFS upload operation")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            entry = {"oid": oid, "size": size, "authenticated": True}
            with self.hub._lock:
                known = oid in repo.lfs_objects
            if not known:  # no "actions": the object is already there, the client skips the upload
                target = f"repo={URL_PREFIXES[repo_type]}{repo_id}&size={size}"
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/__lfs__/upload/{oid}?{target}"},
                    "verify": {"href": f"{self.hub.url}/__lfs__/verify?{target}"},
                }
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_target(self, query) -> Repo:
        target = query.get("repo", [""])[0]
        repo_type = next((t for t, p in URL_PREFIXES.items() if p and target.startswith(p)), "model")
        return self._repo(repo_type, target[len(URL_PREFIXES[repo_type]) :])

    def _do_lfs_upload(self, rest, query, body, **_):
        if self.command != "PUT" or len(rest) != 1:
            raise HubError(405, "LFS objects are uploaded with PUT /__lfs__/upload/{oid}")
        repo, oid = self._lfs_target(query), rest[0]
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"Uploaded bytes do not match the LFS oid {oid}")
        with self.hub._lock:
            repo.lfs_objects[oid] = body
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def _do_lfs_verify(self, query, body, **_):
        repo, payload = self._lfs_target(query), self._json_body(body)
        with self.hub._lock:
            data = repo.lfs_objects.get(payload.get("oid"))
        if data is None or len(data) != payload.get("size"):
            raise HubError(404, f"LFS object {payload.get('oid')} was not uploaded")
        self._json({"success": True})

    def _do_commit(self, repo_type, repo_id, revision, body, query, **_):
        repo = self._repo(repo_type, repo_id, write=True)
        if query.get("create_pr"):
            raise HubError(400, "The Kiln test Hub does not implement pull requests")
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "A commit payload starts with a header line")
        header = lines[0]["value"]
        with self.hub._lock:
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision} is not a branch", "RevisionNotFound")
            parent = repo.commits[repo.branches[revision]]
            if header.get("parentCommit") not in (None, parent.oid):
                raise HubError(412, "A commit has happened since: parentCommit is not the head of the branch")
            files = dict(parent.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "").strip("/")
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, f"Unsupported encoding for {path}: {value.get('encoding')}")
                    files[path] = Blob(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    data = repo.lfs_objects.get(value.get("oid"))
                    if data is None:
                        raise HubError(
                            400, f"LFS object for {path} was never uploaded (oid {value.get('oid')})"
                        )
                    files[path] = Blob(data, lfs=True)
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif key == "deletedFolder":
                    files = {p: b for p, b in files.items() if not p.startswith(f"{path}/")}
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}")
            commit = self.hub._new_commit(
                repo, parent.oid, header.get("summary") or "update", header.get("description") or "", files
            )
            repo.branches[revision] = commit.oid
        self._json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitMessage": commit.title,
                "hookOutput": "",
                "commitUrl": f"{self.hub.url}/{URL_PREFIXES[repo_type]}{repo_id}/commit/{commit.oid}",
                "pullRequestUrl": None,
            }
        )

    def _do_resolve(self, repo_type, repo_id, revision, path, **_):
        repo = self._repo(repo_type, repo_id)
        with self.hub._lock:
            commit = self._commit(repo, revision)
        headers = {"X-Repo-Commit": commit.oid}
        blob = commit.files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        headers["ETag"] = f'"{blob.etag}"'
        headers["Accept-Ranges"] = "bytes"
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
            if self.hub.lfs_redirect:
                headers["Location"] = f"http://{self.hub.cdn_host}:{self.hub.port}/__cdn__/{blob.sha256}"
                self._send(302, b"", headers)
                return
        self._serve_bytes(blob.data, {**headers, "Content-Type": "application/octet-stream"})

    def _do_cdn(self, oid, **_):
        with self.hub._lock:
            data = next((r.lfs_objects[oid] for r in self.hub.repos.values() if oid in r.lfs_objects), None)
        if data is None:
            raise HubError(404, f"No such object: {oid}")
        self._serve_bytes(data, {"Content-Type": "application/octet-stream", "ETag": f'"{oid}"'})

    def _serve_bytes(self, data: bytes, headers: dict) -> None:
        range_header = self.headers.get("Range", "")
        if range_header.startswith("bytes=") and self.command == "GET":
            start_text, _, end_text = range_header[len("bytes=") :].partition("-")
            start = int(start_text or 0)
            end = min(int(end_text), len(data) - 1) if end_text else len(data) - 1
            if start >= len(data):
                self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start : end + 1], headers)
            return
        self._send(200, data, headers)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Serve the in-memory Kiln test Hub.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", default=None, help="require this token for writes (default: accept any)")
    parser.add_argument("--upload-mode", choices=["regular", "lfs", "auto"], default="regular")
    cli = parser.parse_args()
    server = HubServer(port=cli.port, token=cli.token)
    server.upload_mode = cli.upload_mode
    print(f"Kiln test Hub on {server.url}: export HF_ENDPOINT={server.url}")
    server.httpd.serve_forever()
