"""Any rollbox environment as a NeMo Gym resources server.

An environment registered through rollbox's ``rollbox_register_tasks`` hook (its tasks:
spec, prompt, ``setup``, ``act``, ``judge``; see docs/writing-an-environment.md) is served
with NeMo Gym's resources-server routes, each a translation of ``rollbox.envs.Session``:

=====================  ===========================================================
``/seed_session``      ``Session.start(task)``: a sandbox of the task's spec from the
                       warm pool, ``task.setup`` run in it
``/run_command``       ``Session.step(command)``: the tool an agent calls; what the
                       command printed, and the task's verdict on it
``/verify``            ``Session.verify()``: the reward
``/close_session``     ``Session.close()``: the sandbox back to the pool, reset in place
=====================  ===========================================================

Sessions are keyed by NeMo Gym's ``resources_session_id`` (an Environment Server's typed
seed) or, for an agent's seed with a ``task_id``, by the session cookie; the typed seed
sets the cookie to its id, so tool calls and ``/verify`` find it either way. A sandbox
failure is never a reward: ``/verify`` answers ``mask_sample=True`` with the failure's
kind, and a tool call says ``failure_kind``. An episode that ended in a tool call (its
``submit``, or its own commands breaking its sandbox) keeps that ending: ``/verify``
answers the reward it earned then, unmasked, however often it is asked, so ending an
episode early never takes a sample out of training.

Run it like any NeMo Gym server (``configs/rollbox_env.yaml`` in this package)::

    rollbox_env:
      resources_servers:
        rollbox_env:
          entrypoint: server.py        # python -m rollbox_nemo_gym.server
          domain: coding
          environment: synthetic       # any registered rollbox environment
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import rollbox
from fastapi import FastAPI, HTTPException, Request
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
    SimpleResourcesServer,
)
from nemo_gym.episode_types import EpisodeId
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import BaseModel, Field, PrivateAttr
from rollbox.envs import Session, Task, load_tasks
from rollbox.envs.bridge import LoopThread
from rollbox.envs.pools import PoolRegistry, SharedPool, pool_kwargs, registry
from rollbox.errors import RollboxError, UsageError

T = TypeVar("T")


class RollboxEnvConfig(BaseResourcesServerConfig):
    """A rollbox environment served to NeMo Gym: which one, and the sandboxes it runs in."""

    environment: str
    """A task source registered through ``rollbox_register_tasks`` (``shell``,
    ``synthetic``, or a plugin's)."""
    task_options: dict[str, Any] = Field(default_factory=dict)
    backend: str | None = None
    backend_options: dict[str, Any] = Field(default_factory=dict)
    pool_options: dict[str, Any] = Field(default_factory=dict)
    keep_warm_s: float = 300.0
    max_steps: int | None = None
    step_timeout_s: float = 60.0
    acquire_timeout_s: float = 300.0
    max_output_chars: int = 10_000
    closed_session_ttl_s: float = 3600.0
    """How long a closed session id is remembered, so that a late seed cannot reopen it."""


class RollboxSeedSessionRequest(BaseSeedSessionRequest):
    """An agent's seed (its ``/run``): the task, by its rollbox id."""

    task_id: str


class RunCommandRequest(BaseModel):
    command: str


class RunCommandResponse(BaseModel):
    """What the command did and the task's verdict on it."""

    output: str
    exit_code: int | None
    timed_out: bool
    reward: float
    terminated: bool
    truncated: bool
    failure_kind: str | None = None
    """The sandbox failed (not the episode's doing): drop the sample."""
    workload_failure: str | None = None
    """The episode's own commands broke its sandbox: an outcome, scored (``reward``)."""


@dataclass(frozen=True)
class _Ending:
    """How an episode ended: its reward, or the sandbox failure that masks it."""

    reward: float
    failure: RollboxError | None = None


@dataclass
class _Episode:
    session: Session
    task: Task
    episode_id: EpisodeId | None  # None: an agent's seed, keyed by its cookie
    ending: _Ending | None = None
    """Set once the episode has its final verdict (or failed): what ``/verify`` says."""


class RollboxResourcesServer(SimpleResourcesServer):
    """A NeMo Gym resources server for one rollbox environment."""

    ray_enabled = False
    config: RollboxEnvConfig

    _episodes: dict[str, _Episode] = PrivateAttr(default_factory=dict)
    _closed: dict[str, float] = PrivateAttr(default_factory=dict)
    _tasks: dict[str, Task] | None = PrivateAttr(default=None)
    _shared: SharedPool | None = PrivateAttr(default=None)
    _thread: LoopThread | None = PrivateAttr(default=None)
    _registry: PoolRegistry | None = PrivateAttr(default=None)
    _seeding: dict[str, asyncio.Lock] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        pool_kwargs(self.config.pool_options)  # a bad setting fails now, not at first seed
        if self.config.max_steps is not None and self.config.max_steps < 1:
            raise UsageError(f"max_steps must be at least 1, got {self.config.max_steps}")

    # -- routes ----------------------------------------------------------------------------

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/run_command")(self.run_command)
        main_lifespan = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            try:
                async with main_lifespan(app) as state:
                    yield state
            finally:
                await self.aclose()

        app.router.lifespan_context = lifespan
        return app

    async def seed_session(  # type: ignore[override, unused-ignore]
        self, request: Request, body: ResourcesSeedSessionRequest | RollboxSeedSessionRequest
    ) -> ResourcesSeedSessionResponse | BaseSeedSessionResponse:
        """Start an episode of the task in a sandbox from the warm pool. Idempotent for
        the same session and episode; a closed session cannot be seeded again (409)."""
        if isinstance(body, ResourcesSeedSessionRequest):
            key, episode_id, task_id = (body.resources_session_id, body.episode_id,
                                        body.task_id.task_id)
            request.session[SESSION_ID_KEY] = key
        else:
            key, episode_id, task_id = request.session[SESSION_ID_KEY], None, body.task_id
        async with self._seeding.setdefault(key, asyncio.Lock()):
            self._forget_expired()
            if key in self._closed:
                raise HTTPException(409, f"resources session {key} is closed")
            existing = self._episodes.get(key)
            if existing is not None:
                if existing.episode_id != episode_id or existing.task.id != task_id:
                    raise HTTPException(409, f"resources session {key} holds another episode")
            else:
                task = await self._task(task_id)
                session = await self._session()
                try:
                    await self._call(session.start(task))
                except RollboxError as error:
                    await self._call(session.close())
                    raise _http(error) from error
                self._episodes[key] = _Episode(session, task, episode_id)
        if isinstance(body, ResourcesSeedSessionRequest):
            return ResourcesSeedSessionResponse(resources_session_id=key)
        return BaseSeedSessionResponse()

    async def run_command(self, request: Request, body: RunCommandRequest) -> RunCommandResponse:
        """The agent's tool: run ``command`` in the episode's sandbox."""
        episode = self._episode(request)
        try:
            transition = await self._call(episode.session.step(body.command))
        except UsageError as error:
            raise HTTPException(409, error.message) from error
        if episode.session.task is None:  # the episode ended in this call
            episode.ending = _Ending(transition.reward, transition.failure)
        if transition.failure is not None:
            return RunCommandResponse(
                output=f"rollbox: the sandbox failed: {transition.failure.message}",
                exit_code=None, timed_out=False, reward=0.0, terminated=False, truncated=True,
                failure_kind=f"rollbox:{transition.failure.kind}",
            )
        step = transition.step
        if step is None:  # its own commands broke the sandbox: scored, not masked
            return RunCommandResponse(
                output=f"rollbox: the episode's own commands broke its sandbox: "
                       f"{transition.info.get('message', '')}",
                exit_code=None, timed_out=False, reward=transition.reward, terminated=True,
                truncated=False,
                workload_failure=str(transition.info.get("workload_failure", "workload")),
            )
        return RunCommandResponse(
            output=_clip(step.result.stdout + step.result.stderr, self.config.max_output_chars),
            exit_code=step.result.exit_code, timed_out=step.timed_out,
            reward=transition.reward, terminated=transition.terminated,
            truncated=transition.truncated,
        )

    async def verify(  # type: ignore[override, unused-ignore]
        self, request: Request, body: BaseVerifyRequest
    ) -> BaseVerifyResponse:
        """The task's final verdict. A sandbox that failed is no reward: the sample is
        masked and the failure named."""
        key = request.session.get(SESSION_ID_KEY)
        episode = self._episodes.get(key) if key else None
        if episode is None:
            raise HTTPException(404, "no episode in this session: call /seed_session first")
        fields = body.model_dump()
        try:
            if episode.ending is None:
                try:
                    judgement = await self._call(episode.session.verify())
                    episode.ending = _Ending(float(judgement.reward))
                except RollboxError as error:
                    episode.ending = _Ending(0.0, error)
            ending = episode.ending
        finally:
            if episode.episode_id is None:  # an agent's episode: no close_session follows
                await self._end(str(key))
        if ending.failure is not None:
            return BaseVerifyResponse(**fields, reward=0.0, mask_sample=True,
                                      failure_kind=f"rollbox:{ending.failure.kind}",
                                      failure_reason=ending.failure.message)
        return BaseVerifyResponse(**fields, reward=ending.reward)

    async def close_resources_session(  # type: ignore[override, unused-ignore]
        self, request: Request, body: ResourcesCloseSessionRequest
    ) -> ResourcesCloseSessionResponse:
        """Give the sandbox back to the pool; the id stays closed (a late seed is refused)."""
        key = body.resources_session_id
        episode = self._episodes.get(key)
        if episode is not None and episode.episode_id != body.episode_id:
            raise HTTPException(409, f"resources session {key} holds another episode")
        await self._end(key)
        self._closed.setdefault(key, time.monotonic() + self.config.closed_session_ttl_s)
        return ResourcesCloseSessionResponse(resources_session_id=key)

    async def aclose(self) -> None:
        """End every episode and leave the shared pool (the server is stopping)."""
        for key in list(self._episodes):
            await self._end(key)
        shared, thread, pools = self._shared, self._thread, self._registry
        self._shared = self._thread = self._registry = None
        if shared is not None and thread is not None and pools is not None and thread.alive:
            await thread.call(pools.detach(shared, self.config.keep_warm_s))

    # -- internals -------------------------------------------------------------------------

    def _episode(self, request: Request) -> _Episode:
        key = request.session.get(SESSION_ID_KEY)
        episode = self._episodes.get(key) if key else None
        if episode is None:
            raise HTTPException(404, "no episode in this session: call /seed_session first")
        return episode

    async def _end(self, key: str) -> None:
        self._seeding.pop(key, None)
        episode = self._episodes.pop(key, None)
        if episode is not None and self._thread is not None and self._thread.alive:
            await self._call(episode.session.close())

    async def _task(self, task_id: str) -> Task:
        if self._tasks is None:
            tasks = await asyncio.to_thread(load_tasks, self.config.environment,
                                            self.config.task_options)
            self._tasks = {task.id: task for task in tasks}
        task = self._tasks.get(task_id)
        if task is None:
            known = ", ".join(sorted(self._tasks)[:10])
            raise HTTPException(422, f"environment {self.config.environment!r} has no task "
                                     f"{task_id!r} (some it has: {known})")
        return task

    async def _session(self) -> Session:
        if self._shared is None or self._thread is None or not self._thread.alive:
            self._thread, self._registry = registry()
            backend = (self.config.backend or os.environ.get("ROLLBOX_BACKEND")
                       or rollbox.DEFAULT_BACKEND)
            self._shared = await self._thread.call(self._registry.attach(
                backend, self.config.backend_options, self.config.pool_options))
        return Session(self._shared.pool, max_steps=self.config.max_steps,
                       step_timeout_s=self.config.step_timeout_s,
                       acquire_timeout_s=self.config.acquire_timeout_s)

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        thread = self._thread
        if thread is None:
            coro.close()
            raise HTTPException(409, "no sandbox pool: call /seed_session first")
        return await thread.call(coro)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key, until in list(self._closed.items()):
            if until <= now:
                del self._closed[key]


def _http(error: RollboxError) -> HTTPException:
    """A rollbox error as an HTTP answer: 503 when trying again may work, else 422."""
    status = 503 if error.retryable else 422
    return HTTPException(status, {"kind": error.kind, "retryable": error.retryable,
                                  "message": error.message})


def _clip(output: bytes, limit: int) -> str:
    text = output.decode("utf-8", "replace")
    if limit and len(text) > limit:
        half = limit // 2
        return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"
    return text


if __name__ == "__main__":  # a NeMo Gym server entrypoint: python -m rollbox_nemo_gym.server
    RollboxResourcesServer.run_webserver()
