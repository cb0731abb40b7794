"""``ServerClient``: the HTTP calls we make to one ``vllm serve`` (httpx, with timeouts and bounded retries).

Connection errors are retried by httpx's transport (``retries``: only failed connects, which never reached the
server); a request that reached it and failed or timed out is the caller's to retry elsewhere
(:mod:`~lit_fgrpo.servers.dispatch`), because only the caller knows whether another server is left.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from lit_fgrpo.servers.errors import ServerError

CONNECT_RETRIES = 2


class ServerRequestError(ServerError):
    """One request to one server failed (HTTP error, timeout, dropped connection, malformed answer)."""


class ServerClient:
    """Requests to the server at ``url``.

    Args:
        url: base URL, ``http://host:port``.
        timeout_s: read timeout of a completion request.
        max_connections: concurrent connections kept (at least the dispatcher's in-flight requests).
        control_timeout_s: read timeout of every other call (reloads, probes, adapters, cache resets); a server that
            does not answer in time raises :class:`ServerRequestError` like a dead one.
    """

    def __init__(self, url: str, timeout_s: float, max_connections: int = 16, control_timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.control_timeout_s = control_timeout_s
        self._http = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=httpx.HTTPTransport(retries=CONNECT_RETRIES),
        )

    def post(self, path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        """POST ``body`` as JSON; the decoded answer (None when empty).

        Raises:
            ServerRequestError: one line with the URL, the route and what failed.
        """
        try:
            response = self._http.post(path, json=body, timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerRequestError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ServerRequestError(f"{self.url}{path}: HTTP {response.status_code}: {response.text[:300]}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text  # the LoRA routes answer in plain text

    def healthy(self) -> bool:
        """True when ``/health`` answers 200 within 5 s."""
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def first_model(self) -> str:
        """The id of the first model ``/v1/models`` lists (for servers given by URL)."""
        try:
            data = self._http.get("/v1/models", timeout=10.0).json()
            return str(data["data"][0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise ServerRequestError(f"{self.url}/v1/models: no model listed ({exc})") from exc

    def collective_rpc(self, method: str, *args: str, timeout_s: float | None = None) -> list[Any]:
        """Call ``method`` of every worker (dev mode); the workers' results (``timeout_s``: default the control
        timeout)."""
        body = {"method": method, "args": list(args)}
        answer = self.post("/collective_rpc", body, timeout_s or self.control_timeout_s)
        return list((answer or {}).get("results") or [])

    def reset_prefix_cache(self, attempts: int = 20) -> None:
        """Drop the prefix cache; retried while vLLM refuses (it does while requests hold blocks).

        Raises:
            ServerRequestError: still refused after ``attempts`` tries.
        """
        for _ in range(attempts):
            if (self.post("/reset_prefix_cache", None, self.control_timeout_s) or {}).get("success", True):
                return
            time.sleep(0.1)
        raise ServerRequestError(f"{self.url}/reset_prefix_cache: refused {attempts} times (requests still running?)")

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter in directory ``path`` under ``name`` (``/v1/load_lora_adapter``), again from the files
        when ``name`` is loaded already (``load_inplace``: a base reload or a retry may repeat a load)."""
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        self.post("/v1/load_lora_adapter", body, self.control_timeout_s)

    def unload_adapter(self, name: str) -> None:
        """Forget the adapter ``name`` (``/v1/unload_lora_adapter``); new requests can no longer name it."""
        self.post("/v1/unload_lora_adapter", {"lora_name": name}, self.control_timeout_s)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()
