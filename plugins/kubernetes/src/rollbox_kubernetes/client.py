"""A thin async client for the API server: pacing, retries, resumable watches, counts.

Every request, whatever its verb, first takes a token from a bucket shared by the whole
process (per event loop and API server), so a burst of rollouts never exceeds the
configured QPS. Then:

- HTTP 429 (and 503 with ``Retry-After``): the server did not process the request, so
  any verb is retried; ``Retry-After`` pauses the shared bucket, i.e. every caller in the
  process waits, not just the one that was told, and those that were told retry spread
  over the following ``Retry-After``.
- 5xx, timeouts, dropped connections: idempotent calls (get, list, delete, merge patch,
  and creates of fixed names, whose retry turns into 409 AlreadyExists) are retried with
  exponential backoff and jitter, a bounded number of times.
- Watches resume from the last resourceVersion they saw when the stream drops, and
  reconnect (backing off, up to ``max_backoff_s`` apart) for as long as their caller
  waits, so an API server that restarts does not end them.

``RequestStats`` counts requests by verb and keeps their start times, which is what the
measurement reads.
"""

from __future__ import annotations

import asyncio
import json
import random
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from rollbox.ratelimit import AdaptiveRate, TokenBucket

from rollbox_kubernetes.resources import Resource

Obj = dict[str, Any]

MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_RETRYABLE_STATUS = frozenset({0, 500, 502, 503, 504})


class ApiError(Exception):
    """An API server answer other than 2xx (status 0: no answer at all)."""

    def __init__(self, status: int, reason: str, message: str, *,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class WatchExpired(ApiError):
    """HTTP 410 Gone: the resourceVersion is older than the server's history; relist."""


class RequestStats:
    """Requests by verb, and when each started (loop time), for QPS checks."""

    def __init__(self) -> None:
        self.by_verb: Counter[str] = Counter()
        self.by_resource: Counter[tuple[str, str]] = Counter()
        self.retries: Counter[str] = Counter()
        self.stamps: list[float] = []

    def record(self, verb: str, now: float, resource: str = "") -> None:
        self.by_verb[verb] += 1
        self.by_resource[(verb, resource)] += 1
        self.stamps.append(now)

    @property
    def total(self) -> int:
        return sum(self.by_verb.values())

    @property
    def mutations(self) -> int:
        return sum(n for verb, n in self.by_verb.items() if verb in MUTATING_VERBS)

    def max_in_window(self, window_s: float = 1.0) -> int:
        """The most requests that started within any ``window_s`` seconds."""
        stamps = sorted(self.stamps)
        best, lo = 0, 0
        for hi, t in enumerate(stamps):
            while t - stamps[lo] >= window_s:
                lo += 1
            best = max(best, hi - lo + 1)
        return best


_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, TokenBucket]] = (
    weakref.WeakKeyDictionary()
)


def shared_limiter(server: str, qps: float, burst: int, *, adaptive: bool = False
                   ) -> TokenBucket:
    """The one limiter of this event loop for ``server`` (created on first use): an
    ``AdaptiveRate`` capped at ``qps``, or with ``adaptive=False`` a fixed ``qps``."""
    per_loop = _LIMITERS.setdefault(asyncio.get_running_loop(), {})
    if server not in per_loop:
        per_loop[server] = AdaptiveRate(qps, burst) if adaptive else TokenBucket(qps, burst)
    return per_loop[server]


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _error_from(status: int, reason: str, body: bytes | str | None, headers: Any) -> ApiError:
    message = ""
    if body:
        try:
            decoded = json.loads(body)
            message = decoded.get("message", "") if isinstance(decoded, dict) else ""
            reason = decoded.get("reason", reason) if isinstance(decoded, dict) else reason
        except ValueError:
            message = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    cls = WatchExpired if status == 410 else ApiError
    return cls(status, reason or "", message[:500], retry_after=_retry_after(headers))


class KubeClient:
    """Paced, retrying, counted requests over a kubernetes-asyncio ``ApiClient``."""

    def __init__(
        self,
        api: ApiClient,
        *,
        qps: float = 20.0,
        burst: int = 40,
        adaptive: bool = False,
        max_retries: int = 6,
        backoff_s: float = 0.2,
        max_backoff_s: float = 8.0,
        request_timeout_s: float = 30.0,
        limiter: TokenBucket | None = None,
        stats: RequestStats | None = None,
    ) -> None:
        self.api = api
        self.host: str = str(api.configuration.host)
        self.qps = qps
        self.burst = burst
        self.adaptive = adaptive
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_timeout_s = request_timeout_s
        self._limiter = limiter
        self.stats = stats or RequestStats()
        self.reached = False
        """Whether the API server has answered once: from then on, not reaching it is a
        restart or a blip, which a caller with a deadline of its own may wait out."""

    @property
    def limiter(self) -> TokenBucket:
        if self._limiter is None:
            self._limiter = shared_limiter(self.host, self.qps, self.burst,
                                           adaptive=self.adaptive)
        return self._limiter

    async def close(self) -> None:
        await self.api.close()

    async def pace(self, verb: str, path: str = "") -> None:
        """Take a token and count one request of ``verb`` (exec uses this too)."""
        await self.limiter.acquire()
        parts = path.split("/namespaces/", 1)[-1].split("/")
        resource = parts[1] if "/namespaces/" in path and len(parts) > 1 else ""
        self.stats.record(verb, asyncio.get_running_loop().time(), resource)

    async def backoff(self, error: ApiError, attempt: int, *, idempotent: bool,
                      unbounded: bool = False, outwait_restarts: bool = False) -> None:
        """Sleep before retry ``attempt`` of a failed call, or re-raise ``error``.
        ``unbounded``: no cap on attempts (a watch, which its caller bounds in time).
        ``outwait_restarts``: no cap while a server that answered before cannot be
        reached (a call whose caller bounds it in time, e.g. a create)."""
        throttled = error.status == 429 or (error.status == 503 and error.retry_after)
        restarting = outwait_restarts and error.status == 0 and self.reached
        if (attempt > self.max_retries and not (unbounded or restarting)) or not (
            throttled or (idempotent and error.status in _RETRYABLE_STATUS)
        ):
            raise error
        self.stats.retries[str(error.status)] += 1
        if throttled:
            # Everyone waits out Retry-After; the callers that were told come back spread
            # over the next Retry-After, not all at once: a burst released together meets
            # a server with few seats (APF with no queue) again and again, each time using
            # up an attempt of every caller.
            wait = error.retry_after if error.retry_after is not None else 1.0
            self.limiter.throttled(wait)  # an adaptive one: slower from now on, too
            await asyncio.sleep(wait * (1 + random.random()))
            return
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** min(attempt - 1, 16))
        await asyncio.sleep(delay * (0.5 + random.random() / 2))

    async def call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Obj | None = None,
        idempotent: bool,
        content_type: str = "application/json",
    ) -> Obj:
        return (await self._call(verb, method, path, query=query, body=body,
                                 idempotent=idempotent, content_type=content_type))[0]

    async def _call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None,
        body: Obj | None,
        idempotent: bool,
        content_type: str,
        attempts: list[int] | None = None,
        outwait_restarts: bool = False,
    ) -> tuple[Obj, int]:
        """The response body and how many attempts it took (also kept in ``attempts``)."""
        attempt = 0
        while True:
            attempt += 1
            if attempts is not None:
                attempts[0] = attempt
            await self.pace(verb, path)
            sent = asyncio.get_running_loop().time()
            try:
                data = await self.api.call_api(
                    path, method, query_params=query or [],
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body, response_types_map={200: "object", 201: "object", 202: "object"},
                    auth_settings=["BearerToken"], _return_http_data_only=True,
                    _request_timeout=self.request_timeout_s,
                )
                self.limiter.answered(asyncio.get_running_loop().time() - sent)
                self.reached = True
                return (data if isinstance(data, dict) else {}), attempt
            except ApiException as exc:
                self.reached = True
                error = _error_from(exc.status or 0, exc.reason or "", exc.body, exc.headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = ApiError(0, "Unreachable", f"{type(exc).__name__}: {exc}")
            await self.backoff(error, attempt, idempotent=idempotent,
                               outwait_restarts=outwait_restarts)

    # -- verbs ---------------------------------------------------------------------------

    async def create(self, res: Resource, namespace: str, body: Obj, *,
                     outwait_restarts: bool = False) -> Obj:
        """POST; retried on 5xx only when the body names the object (a retry that finds
        it already there returns it). ``outwait_restarts``: see ``backoff``."""
        name = body.get("metadata", {}).get("name")
        attempts = [0]
        try:
            obj, _ = await self._call("create", "POST", res.path(namespace), query=None,
                                      body=body, idempotent=bool(name),
                                      content_type="application/json", attempts=attempts,
                                      outwait_restarts=outwait_restarts)
            return obj
        except ApiError as err:
            if name and err.status == 409 and attempts[0] > 1:
                return await self.get(res, namespace, name)
            raise

    async def get(self, res: Resource, namespace: str, name: str) -> Obj:
        return await self.call("get", "GET", res.path(namespace, name), idempotent=True)

    async def list_objects(self, res: Resource, namespace: str | None, *,
                           label_selector: str = "", field_selector: str = "") -> Obj:
        """``namespace`` None: across all namespaces."""
        query = [("labelSelector", label_selector)] if label_selector else []
        if field_selector:
            query.append(("fieldSelector", field_selector))
        return await self.call("list", "GET", res.path(namespace), query=query, idempotent=True)

    async def patch(self, res: Resource, namespace: str, name: str, patch: Obj) -> Obj:
        """A JSON merge patch (idempotent, so retried)."""
        return await self.call("patch", "PATCH", res.path(namespace, name), body=patch,
                               idempotent=True, content_type="application/merge-patch+json")

    async def delete(self, res: Resource, namespace: str, name: str, *,
                     missing_ok: bool = True) -> None:
        """DELETE with background propagation; a missing object is fine by default."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self.call("delete", "DELETE", res.path(namespace, name), body=body,
                            idempotent=True)
        except ApiError as err:
            if not (missing_ok and err.status == 404):
                raise

    async def watch(
        self,
        res: Resource,
        namespace: str | None,
        *,
        resource_version: str,
        name: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        server_timeout_s: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Events after ``resource_version``, resuming from the last one seen whenever the
        stream ends or drops. Raises WatchExpired (410) when history is gone."""
        rv = resource_version
        quiet_drops = 0
        while True:
            query = [("watch", "true"), ("resourceVersion", rv),
                     ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(server_timeout_s))]
            fields = [f"metadata.name={name}"] if name is not None else []
            if field_selector:
                fields.append(field_selector)
            if fields:
                query.append(("fieldSelector", ",".join(fields)))
            if label_selector:
                query.append(("labelSelector", label_selector))
            response = await self._open_stream(res.path(namespace), query)
            got_any = False
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type", ""), event.get("object") or {}
                    if kind == "ERROR":
                        raise _error_from(int(obj.get("code", 0)), obj.get("reason", ""),
                                          json.dumps(obj), None)
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    got_any = True
                    if kind != "BOOKMARK":
                        yield kind, obj
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass  # a dropped or garbled stream: resume from ``rv``
            finally:
                response.release()
            self.stats.retries["watch_resume"] += 1
            quiet_drops = 0 if got_any else quiet_drops + 1
            if quiet_drops:
                await asyncio.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** quiet_drops))

    async def _open_stream(self, path: str, query: list[tuple[str, str]]) -> Any:
        attempt = 0
        while True:
            attempt += 1
            await self.pace("watch", path)
            try:
                response = await self.api.call_api(
                    path, "GET", query_params=query, header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                )
                if response.status == 200:
                    return response
                body = await response.read()
                response.release()
                error = _error_from(response.status, response.reason or "", body,
                                    response.headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = ApiError(0, "Unreachable", f"{type(exc).__name__}: {exc}")
            # A watch outlives an API server restart: it reconnects for as long as its
            # caller waits (a create's timeout), not for a fixed number of attempts.
            await self.backoff(error, attempt, idempotent=True, unbounded=True)
