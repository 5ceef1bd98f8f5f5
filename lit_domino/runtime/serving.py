"""Talking to OpenAI-compatible servers (``vllm serve``, SGLang's ``launch_server``, ``transformers serve``).

* :class:`ServerClient`: ``/v1/completions`` and ``/v1/chat/completions`` requests with retries and
  exponential backoff; after the last retry a :class:`ServerError` names the URL. :meth:`ServerClient.map`
  runs many requests concurrently (threads: the work is waiting on sockets).
* :func:`start_transformers_serve`: starts ``transformers serve`` on a saved model directory on this machine,
  waits until it answers, and stops it again (tests, docs, CPU-only checks). The speculative servers
  (vLLM / SGLang with a drafter) need a GPU; see docs/serving.md.

Plain ``requests`` (no SDK): every failure is one exception type whose message says which URL, which
endpoint and what the server answered.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from lit_domino.runtime.command import UsageError

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
"""HTTP statuses worth retrying (overload, restarts); other 4xx are the request's fault and fail at once."""


class ServerError(UsageError, RuntimeError):
    """A server that did not answer (after retries) or refused a request; the message names the URL."""

    def __init__(self, url: str, message: str):
        self.url = url
        super().__init__(message)


def normalize_url(url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1/`` → ``http://host:8000/v1`` (the OpenAI API root)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class Completion:
    """One generated answer as the server reported it."""

    text: str
    """The generated text (special tokens skipped by most servers)."""
    finish_reason: str | None
    """``stop`` (EOS or a stop string), ``length`` (hit ``max_tokens``), or None if not reported."""
    prompt_tokens: int | None
    """The server's count of prompt tokens (``usage.prompt_tokens``)."""
    completion_tokens: int | None
    """The server's count of generated tokens, EOS included (``usage.completion_tokens``)."""
    token_ids: list[int] | None = None
    """Generated token ids when the server returns them (vLLM with ``return_token_ids: true``)."""
    latency_s: float = 0.0
    """Wall time of the successful request (retries excluded)."""


@dataclass
class ServerClient:
    """A client of one OpenAI-compatible server.

    Thread-safe: :meth:`map` shares it between worker threads (one HTTP session per thread).
    """

    url: str
    """The server, e.g. ``http://localhost:8000`` (``/v1`` is added when missing)."""
    model: str | None = None
    """The served model name; None = the first id of ``GET /v1/models`` (asked once)."""
    retries: int = 5
    """Attempts after the first one, for connection errors, timeouts and :data:`RETRY_STATUS` answers."""
    backoff_s: float = 0.5
    """Wait before the first retry; doubled after each one (capped at ``max_backoff_s``)."""
    max_backoff_s: float = 8.0
    """Longest wait between two attempts."""
    timeout_s: float = 600.0
    """Seconds one request may take (a long answer from a busy server takes minutes)."""
    extra_body: dict = field(default_factory=dict)
    """Extra request fields sent with every generation request, e.g. ``{"return_token_ids": true}`` for
    vLLM (exact token ids back) or ``{"top_k": -1}``; a server that does not know a field refuses it (422)."""

    def __post_init__(self):
        self.url = normalize_url(self.url)
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError("retries and backoff_s must be >= 0")
        self._local = threading.local()
        self._model_lock = threading.Lock()

    # -- transport ---------------------------------------------------------------------

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON request with retries; returns the decoded answer or raises :class:`ServerError`."""
        url = f"{self.url}{path}"
        attempts, wait, last, t0 = self.retries + 1, self.backoff_s, "", time.monotonic()
        for attempt in range(attempts):
            try:
                r = self._session().request(method, url, json=body, timeout=timeout or self.timeout_s)
            except requests.RequestException as err:  # refused, DNS, reset, timeout
                last = f"{type(err).__name__}: {_first_line(err)}"
            else:
                if r.status_code < 400:
                    try:
                        return r.json()
                    except ValueError:
                        raise ServerError(self.url, f"{url} answered {r.status_code} with non-JSON content "
                                                    f"{r.text[:200]!r}; is this an OpenAI-compatible server?") from None
                detail = _detail(r)
                if r.status_code not in RETRY_STATUS:
                    raise ServerError(self.url, f"{url} refused the request: HTTP {r.status_code}: {detail}")
                last = f"HTTP {r.status_code}: {detail}"
            if attempt + 1 < attempts:
                time.sleep(wait)
                wait = min(wait * 2, self.max_backoff_s)
        raise ServerError(self.url, f"the server at {self.url} did not answer {method} {path} after {attempts} "
                                    f"attempt(s) over {time.monotonic() - t0:.1f} s (last error: {last}); is it "
                                    "running, and is the URL right?")

    # -- API ---------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The ids of ``GET /v1/models`` (also a cheap reachability check)."""
        data = self.request("GET", "/models", timeout=30)
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    def served_model(self) -> str:
        """``model``, or the server's first model (asked once)."""
        with self._model_lock:
            if self.model is None:
                ids = self.models()
                if not ids:
                    raise ServerError(self.url, f"the server at {self.url} lists no models (GET /v1/models); "
                                                "pass the model name explicitly")
                self.model = ids[0]
            return self.model

    def complete(self, prompt: str, *, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> Completion:
        """``POST /v1/completions`` with a raw text prompt (no chat template applied by the server)."""
        body = {"model": self.served_model(), "prompt": prompt, "max_tokens": int(max_tokens),
                "temperature": float(temperature), **({"seed": int(seed)} if seed is not None else {}),
                **self.extra_body}
        t0 = time.perf_counter()
        data = self.request("POST", "/completions", body)
        return self._completion(data, "text", time.perf_counter() - t0)

    def chat(self, messages: Sequence[dict], *, max_tokens: int, temperature: float = 0.0,
             seed: int | None = None, chat_template_kwargs: dict | None = None) -> Completion:
        """``POST /v1/chat/completions``: the server applies its chat template to ``messages``."""
        body = {"model": self.served_model(), "messages": list(messages), "max_tokens": int(max_tokens),
                "temperature": float(temperature), **({"seed": int(seed)} if seed is not None else {}),
                **({"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}),
                **self.extra_body}
        t0 = time.perf_counter()
        data = self.request("POST", "/chat/completions", body)
        return self._completion(data, "message", time.perf_counter() - t0)

    def _completion(self, data: dict, kind: str, latency: float) -> Completion:
        try:
            choice = data["choices"][0]
            text = choice["text"] if kind == "text" else (choice["message"].get("content") or "")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ServerError(self.url, f"{self.url} answered without choices[0].{kind}: {str(data)[:300]}") from None
        usage = data.get("usage") or {}
        ids = choice.get("token_ids")
        return Completion(text=text, finish_reason=choice.get("finish_reason"),
                          prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                          token_ids=[int(t) for t in ids] if isinstance(ids, list) else None, latency_s=latency)

    def map(self, fn: Callable[[Any], Any], items: Iterable, concurrency: int) -> list:
        """``[fn(item) for item in items]`` with ``concurrency`` requests in flight (results in input order).

        The first exception is raised after the running calls finish; the others are not started.
        """
        items = list(items)
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if concurrency == 1 or len(items) <= 1:
            return [fn(it) for it in items]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(fn, it) for it in items]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _detail(r: requests.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:300]
    if isinstance(data, dict):
        d = data.get("detail") or data.get("error") or data.get("message") or data
        return (json.dumps(d) if not isinstance(d, str) else d)[:300]
    return str(data)[:300]


# --------------------------------------------------------------------------- a local transformers serve


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A ``transformers serve`` process started by :func:`start_transformers_serve`; a context manager."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path, model: str):
        self.process, self.url, self.log_path, self.model = process, url, log_path, model

    def client(self, **kwargs) -> ServerClient:
        return ServerClient(self.url, model=self.model, **kwargs)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout`` s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_transformers_serve(model_dir: str | Path, *, port: int | None = None, host: str = "127.0.0.1",
                             device: str = "cpu", dtype: str = "float32", threads: int | None = None,
                             timeout_s: float = 300.0, log_path: str | Path | None = None) -> LocalServer:
    """Start ``transformers serve <model_dir>`` (pinned to that model) and wait until it answers.

    ``threads``: ``OMP_NUM_THREADS`` of the server (None: inherited). Needs the serving extras
    (``pip install 'lit_domino[serve]'``: fastapi, uvicorn, accelerate). Raises :class:`ServerError` with the
    server's log tail if it exits or does not answer within ``timeout_s`` seconds.
    """
    model_dir = Path(model_dir).expanduser().resolve()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a saved model directory (no config.json)")
    port = port or free_port(host)
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
           "serve", str(model_dir), "--host", host, "--port", str(port), "--device", device, "--dtype", dtype,
           "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    server = LocalServer(proc, f"http://{host}:{port}/v1", log_path, str(model_dir))
    probe = ServerClient(server.url, retries=0, timeout_s=5)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerError(server.url, f"transformers serve exited with code {proc.returncode} before answering "
                                          f"(log {log_path}):\n{server.log_tail()}")
        try:
            if str(model_dir) in probe.models():
                return server
        except ServerError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise ServerError(server.url, f"transformers serve did not answer at {server.url} within {timeout_s:g} s "
                                          f"(log {log_path}):\n{server.log_tail()}")
        time.sleep(0.25)
