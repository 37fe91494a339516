"""A real registry on loopback for the image tests and the pull benchmark, offline.

Debian's `docker-registry` (distribution 2.8) serves a folder of test images built once from the local base image
miniswe-test (each adds its own layer of random bytes, so no two share it) and cached beside the engine's other test
images. A loopback proxy in front of it answers 429 with Retry-After, fails manifests, or delays blobs, and logs
every request: tests pull through the proxy, whose port names the images they pull (127.0.0.1:PORT/...), and
remove those images when done. dockerd treats 127.0.0.0/8 registries as plain HTTP, so no engine setting is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BASE = "miniswe-test:latest"
REPO = "miniswe-test-pull"
TAGS = tuple(f"img{i}" for i in range(6))
PAD_BYTES = 3_000_000  # each image's own layer: random, so it compresses to about this
RECIPE = 1  # bump when the images change
CACHE = os.environ.get("MINISWE_CACHE_DIR", "/var/cache/miniswe")


def problem(exe: str = "docker") -> str | None:
    """Why the registry tests cannot run here, or None."""
    if shutil.which("docker-registry") is None:
        return "no docker-registry (apt-get install docker-registry, or .ci/registry install)"
    if shutil.which(exe) is None:
        return f"no `{exe}` on PATH"
    info = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode:
        return f"`{exe} info` failed: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    if subprocess.run([exe, "image", "inspect", BASE], capture_output=True).returncode:
        return f"image {BASE} missing (.ci/docker-engine start)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Registry:
    """docker-registry serving `data` on a free loopback port; its log (the registry's own) in `log`."""

    def __init__(self, data: str):
        self.data = data
        self.port = free_port()
        self.folder = tempfile.mkdtemp(prefix="miniswe-registry-")
        self.log = os.path.join(self.folder, "registry.log")
        config = os.path.join(self.folder, "config.yml")
        with open(config, "w") as handle:
            handle.write(f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n"
                         f"  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n"
                         f"http:\n  addr: 127.0.0.1:{self.port}\n")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["docker-registry", "serve", config], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"docker-registry did not start on 127.0.0.1:{self.port}; see {self.log}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def requests(self) -> list[dict]:
        """The registry's own access log, as (method, path, status, bytes written) dicts."""
        found = []
        with open(self.log, errors="replace") as handle:
            for line in handle:
                if '"GET ' in line or '"HEAD ' in line:
                    request = line.split('"')[1].split()
                    tail = line.split('"')[2].split()
                    found.append({"method": request[0], "path": request[1], "status": int(tail[0]), "bytes": int(tail[1])})
        return found


def seeded_data(exe: str = "docker") -> str:
    """The registry folder holding REPO:TAGS, built once per base image (a lock keeps parallel sessions from
    building it twice; the first build pushes the base layer, about 20 s)."""
    base = subprocess.run([exe, "image", "inspect", "--format", "{{.Id}}", BASE], capture_output=True, text=True)
    key = base.stdout.strip().removeprefix("sha256:")[:12]
    data = os.path.join(CACHE, f"registry-{key}-r{RECIPE}")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, "registry.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(data, ".complete")):
            return data
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        registry = Registry(data)
        try:
            for tag in TAGS:
                _push(exe, f"127.0.0.1:{registry.port}/{REPO}:{tag}", tag)
        finally:
            registry.close()
        open(os.path.join(data, ".complete"), "w").close()
    return data


def _push(exe: str, name: str, tag: str) -> None:
    scratch = f"miniswe-test-pull-src-{uuid.uuid4().hex[:8]}"
    made = subprocess.run([exe, "run", "--name", scratch, "--entrypoint", "bash", BASE, "-c",
                           f"head -c {PAD_BYTES} /dev/urandom > /pad-{tag}"], capture_output=True, text=True, timeout=120)
    try:
        assert made.returncode == 0, made.stderr
        committed = subprocess.run([exe, "commit", "--change", 'CMD ["/bin/bash"]', scratch, name],
                                   capture_output=True, text=True, timeout=120)
        assert committed.returncode == 0, committed.stderr
        pushed = subprocess.run([exe, "push", name], capture_output=True, text=True, timeout=600)
        assert pushed.returncode == 0, pushed.stderr
    finally:
        subprocess.run([exe, "rm", "-f", scratch], capture_output=True, timeout=60)
        subprocess.run([exe, "rmi", name], capture_output=True, timeout=60)  # pulls must fetch its layer again


class Proxy:
    """A loopback proxy before the registry: the images a test pulls are `proxy.image(tag)`.

    `rate_limit` GETs of a manifest are answered 429 (with Retry-After and the registry's TOOMANYREQUESTS body, as
    Docker Hub does), `fail` of them 500; every blob GET waits `blob_delay` seconds first (a slow link). `log`:
    every request, with when it came and when it was answered."""

    def __init__(self, upstream: int, exe: str = "docker"):
        self.upstream, self.exe = upstream, exe
        self.rate_limit = 0
        self.retry_after = 1
        self.fail = 0
        self.blob_delay = 0.0
        self.log: list[dict] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                proxy._serve(self, "HEAD")

            def do_GET(self):
                proxy._serve(self, "GET")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def image(self, tag: str) -> str:
        return f"127.0.0.1:{self.port}/{REPO}:{tag}"

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        entry = {"method": method, "path": handler.path, "at": time.monotonic(), "status": 0, "bytes": 0}
        manifest, blob = "/manifests/" in handler.path, "/blobs/" in handler.path
        with self.lock:
            self.log.append(entry)
            answer = None
            if manifest and self.rate_limit > 0:
                answer = 429
                self.rate_limit -= method == "GET"
            elif manifest and self.fail > 0:
                answer = 500
                self.fail -= method == "GET"
        if answer == 429:
            body = json.dumps({"errors": [{"code": "TOOMANYREQUESTS", "message": "You have reached your pull rate limit."}]}).encode()
            return self._answer(handler, entry, 429, body, {"Retry-After": str(self.retry_after), "Content-Type": "application/json"})
        if answer == 500:
            return self._answer(handler, entry, 500, b"", {})
        if blob and method == "GET" and self.blob_delay:
            time.sleep(self.blob_delay)
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=60)
        try:
            conn.putrequest(method, handler.path, skip_host=True, skip_accept_encoding=True)
            for key, value in handler.headers.items():  # every Accept header: the engine sends several
                conn.putheader(key, value)
            conn.endheaders()
            response = conn.getresponse()
            data = response.read()
            headers = {k: v for k, v in response.getheaders() if k.lower() not in ("content-length", "transfer-encoding", "connection")}
            length = response.getheader("Content-Length") if method == "HEAD" else None
            self._answer(handler, entry, response.status, data, headers, length)
        finally:
            conn.close()

    @staticmethod
    def _answer(handler, entry, status, body, headers, length=None) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", length or str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)
        entry.update(status=status, bytes=len(body), done=time.monotonic())

    def requests(self, kind: str = "", method: str = "GET") -> list[dict]:
        with self.lock:
            return [e for e in self.log if kind in e["path"] and e["method"] == method]

    def present(self) -> list[str]:
        """This proxy's images the engine holds now."""
        listed = subprocess.run([self.exe, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
        return sorted(n for n in listed.stdout.split() if n.startswith(f"127.0.0.1:{self.port}/"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        names = self.present()
        if names:  # only the images pulled through this proxy: named by its port, made by this test
            subprocess.run([self.exe, "rmi", *names], capture_output=True, timeout=120)
