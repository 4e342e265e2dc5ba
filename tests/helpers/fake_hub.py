"""A FAKE of the Hugging Face hub: a local HTTP server answering the endpoints huggingface_hub and
`datasets` call for ``datasets.load_dataset(ID, revision=SHA, split=...)``, serving given files.

It stands in for huggingface.co where there is no internet (here, CI), so the code that runs on a
cluster's login node (``load_dataset`` at a pinned revision, through ``HF_ENDPOINT``) is the code a
test runs. It is not the hub: only these endpoints exist (seen in the requests of datasets 5.2 /
huggingface_hub 2.4; anything else is a 404, which the clients treat as "no such file")::

    HEAD/GET /datasets/{id}/resolve/{rev}/{path}     a file (X-Repo-Commit, ETag headers)
    GET      /api/datasets/{id}/revision/{rev}       dataset info (sha, siblings)
    GET      /api/datasets/{id}/tree/{rev}[/{dir}]   a folder listing
    GET      /raw/{path}                             a plain file (stands in for a pinned URL)

Only the pinned commit resolves (and ``main``, to it): another revision is a 404, as on the hub.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import urllib.parse
from pathlib import Path


class FakeHub:
    """``repos``: ``{repo_id: (commit, {path in repo: bytes})}``; ``raw``: ``{path: bytes}``."""

    def __init__(self, repos: dict[str, tuple[str, dict[str, bytes]]], raw: dict[str, bytes] | None = None):
        self.repos, self.raw = repos, dict(raw or {})
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Serve in a daemon thread; returns the endpoint (for ``HF_ENDPOINT``)."""
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                hub._answer(self, head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                hub._answer(self, head=True)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------------ answers
    def _files(self, repo: str, rev: str) -> dict[str, bytes] | None:
        if repo not in self.repos:
            return None
        commit, files = self.repos[repo]
        return files if rev in (commit, "main") else None

    def _answer(self, req: http.server.BaseHTTPRequestHandler, *, head: bool) -> None:
        self.requests.append(f"{req.command} {req.path}")
        path = urllib.parse.unquote(urllib.parse.urlparse(req.path).path)

        def send(code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            req.send_response(code)
            for key, value in (headers or {}).items():
                req.send_header(key, value)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            if not head:
                req.wfile.write(body)

        def send_json(value: object) -> None:
            send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        if path.startswith("/raw/"):
            body = self.raw.get(path.removeprefix("/raw/"))
            return send(200, body) if body is not None else send(404)
        if m := re.match(r"^/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path):
            repo, rev, name = m.groups()
            files = self._files(repo, rev)
            if files is None or name not in files:
                return send(404, b"", {"X-Error-Code": "EntryNotFound"})
            body = files[name]
            etag = hashlib.sha256(body).hexdigest()
            return send(200, body, {"X-Repo-Commit": self.repos[repo][0], "ETag": f'"{etag}"'})
        if m := re.match(r"^/api/datasets/([^/]+/[^/]+)/revision/([^/]+)$", path):
            repo, rev = m.groups()
            files = self._files(repo, rev)
            if files is None:
                return send(404, b'{"error": "Revision Not Found"}', {"X-Error-Code": "RevisionNotFound"})
            return send_json(
                {"id": repo, "sha": self.repos[repo][0], "private": False, "gated": False, "disabled": False,
                 "tags": [], "cardData": {}, "siblings": [{"rfilename": f} for f in files]}
            )  # fmt: skip
        if m := re.match(r"^/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path):
            repo, rev, folder = m.groups()
            files = self._files(repo, rev)
            if files is None:
                return send(404)
            prefix = (folder or "").strip("/")
            return send_json(
                [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                 for f, b in files.items() if not prefix or f.startswith(prefix + "/")]
            )  # fmt: skip
        return send(404)


def hub_env(endpoint: str, home: Path) -> dict[str, str]:
    """Environment for a subprocess that must reach only the fake hub, with caches under ``home``."""
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_DATASETS_CACHE": str(home / "datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
    }
