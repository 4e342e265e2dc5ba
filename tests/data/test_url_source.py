"""A benchmark's pinned-URL source (``url: {url, sha256}``), served over HTTP from this process.

Minerva's online source is Qwen2.5-Math's evaluation file at a fixed commit, byte-identical to the
offline copy in ../shared/data (the spec pins its sha256). Through a local HTTP server standing in
for GitHub: the records equal the offline ones; a file with another sha256 is refused naming both
digests; an unreachable URL names $AGGBENCH_DATA_DIR; the download is cached (the second load does
not download it again).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
from aggbench.data.sources import DataUnavailableError

MINERVA = Path("minerva") / "test.jsonl"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """(directory served, base URL, request log); the `datasets` cache in tmp_path, no data dir."""
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, fmt, *args):
            requests.append(f"{self.command} {self.path}")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.delenv("AGGBENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr("datasets.config.DOWNLOADED_DATASETS_PATH", tmp_path / "cache" / "downloads")
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()


def _served_spec(base: str, sha256: str | None = None):
    spec = load_benchmark_spec("minerva")
    url = spec.url.model_copy(update={"url": f"{base}/test.jsonl", **({"sha256": sha256} if sha256 else {})})
    return spec.model_copy(update={"url": url})


def test_shipped_pin_is_the_offline_file(shared_data: Path) -> None:
    spec = load_benchmark_spec("minerva")
    assert spec.hub is None and spec.url is not None
    assert "/a45202bd16f1ec06f433442dc1152d0074773465/" in spec.url.url  # a commit, not a branch
    assert hashlib.sha256((shared_data / MINERVA).read_bytes()).hexdigest() == spec.url.sha256


def test_url_source_gives_the_offline_records_and_is_cached(server, shared_data: Path) -> None:
    root, base, requests = server
    (root / "test.jsonl").write_bytes((shared_data / MINERVA).read_bytes())
    online = load_benchmark(_served_spec(base))
    offline = load_benchmark("minerva", data_dir=shared_data)
    assert len(online) == 272 and online.source == f"{base}/test.jsonl"
    assert [(r["id"], r["prompt"], r["answer"]) for r in online] == [
        (r["id"], r["prompt"], r["answer"]) for r in offline
    ]
    assert requests.count("GET /test.jsonl") == 1
    load_benchmark(_served_spec(base))  # from the cache: `datasets` checks the ETag, no new download
    assert requests.count("GET /test.jsonl") == 1


def test_a_changed_file_is_refused_naming_both_digests(server, shared_data: Path) -> None:
    root, base, _ = server
    data = (shared_data / MINERVA).read_bytes()
    (root / "test.jsonl").write_bytes(data.replace(b"\\boxed", b"\\boxed ", 1))
    spec = _served_spec(base)
    with pytest.raises(DataUnavailableError) as err:
        load_benchmark(spec)
    msg = str(err.value)
    assert spec.url.sha256 in msg and hashlib.sha256(data).hexdigest() == spec.url.sha256
    assert "changed upstream" in msg and f"{base}/test.jsonl" in msg


def test_unreachable_url_names_the_offline_directory(server) -> None:
    _, base, _ = server
    with pytest.raises(DataUnavailableError, match=r"could not download .*AGGBENCH_DATA_DIR"):
        load_benchmark(_served_spec(base.replace("/test.jsonl", "") + "/missing"))


def test_sha256_must_be_64_hex(tmp_path: Path) -> None:
    from aggbench.data.sources import SpecError

    text = (Path(__file__).parents[2] / "configs" / "benchmarks" / "minerva.yaml").read_text()
    pin = load_benchmark_spec("minerva").url.sha256
    bad = tmp_path / "minerva.yaml"
    bad.write_text(text.replace(pin, "abc123"))
    with pytest.raises(SpecError, match="sha256 must be 64 lowercase hex digits"):
        load_benchmark_spec(bad)
