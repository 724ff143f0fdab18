"""`corellm serve --data-parallel-size N`: N engine replicas behind the one API server.

Each replica is a `corellm serve` process of its own on a loopback port (itself tensor-parallel when
asked), started with the same arguments; this process serves the public port and forwards each
request to one replica, streaming the answer back as it comes:

    client ──HTTP──▶ router (this process) ──▶ replica i: corellm serve --port P_i
                     pick(i): the prompt's affinity (a hash of its first 256 characters: requests
                     sharing a prefix meet the same prefix cache) unless that replica has `slack`
                     more requests in flight than the least loaded one, which then takes it

A stored response (the Responses API's) lives in the replica that made it: a request about one — its
GET, DELETE, cancel or input_items, or a new response continuing it (`previous_response_id`) — goes to
the replica that answers GET /v1/responses/{id} for it.

A replica whose process dies is reported by /health (status "degraded", the replica named); the
requests it was serving get 503 (or, mid-stream, an error event), new ones go to the others; /health
is 503 only when no replica is left."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from corellm.server.errors import APIError, api_key_refusal
from corellm.server.replica_metrics import merge_replica_metrics

logger = logging.getLogger("corellm.server")

_FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept", "X-Request-Id")
_RETURNED_HEADERS = ("X-Request-Id",)


@dataclass
class Replica:
    index: int
    port: int
    process: subprocess.Popen
    in_flight: int = 0
    served: int = 0  # requests answered since start

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    async def exits_within(self, seconds: float) -> bool:
        """Whether the process is gone within `seconds`. A killed process closes its sockets a moment
        before the kernel reports it exited: a probe refused in that moment must not read as a replica
        that runs but does not answer."""
        try:
            await asyncio.to_thread(self.process.wait, seconds)
        except subprocess.TimeoutExpired:
            return False
        return True


@dataclass
class Router:
    replicas: list[Replica]
    api_key: str | None = None  # --api-key: the router's own routes ask for it as a replica's do
    slack: int = 4  # in-flight requests a preferred replica may have over the least loaded
    session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def pick(self, affinity: bytes) -> Replica | None:
        alive = [r for r in self.replicas if r.alive()]
        if not alive:
            return None
        preferred = alive[int.from_bytes(hashlib.blake2b(affinity, digest_size=8).digest(), "little") % len(alive)]
        least = min(alive, key=lambda r: r.in_flight)
        return preferred if preferred.in_flight <= least.in_flight + self.slack else least


    async def holder(self, response_id: str, headers: dict[str, str]) -> Replica | None:
        """The live replica that stores the response (None: none does)."""
        async def stores(r: Replica) -> bool:
            try:
                async with self.session.get(f"{r.url}/v1/responses/{response_id}", headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError):
                return False

        alive = [r for r in self.replicas if r.alive()]
        found = await asyncio.gather(*(stores(r) for r in alive))
        return next((r for r, yes in zip(alive, found) if yes), None)

    async def send_to_running(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None,
                              timeout_s: float = 5) -> list[tuple[Replica, tuple[int, str, str] | None]]:
        """The same request to every running replica at once: per replica its answer (status,
        Content-Type, text), or None where it did not answer (one that died meanwhile)."""
        async def send(r: Replica) -> tuple[int, str, str] | None:
            try:
                async with self.session.request(method, r.url + path, data=body, headers=headers,
                                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
                    return reply.status, reply.headers.get("Content-Type", "text/plain"), await reply.text()
            except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError):
                return None

        alive = [r for r in self.replicas if r.alive()]
        return list(zip(alive, await asyncio.gather(*(send(r) for r in alive))))

    async def ask_running(self, path: str, request: web.Request) -> dict[int, str]:
        """Each running replica's answer to GET `path`, asked with the client's Authorization, by
        replica index; a replica that refuses it or does not answer (one that died meanwhile) is
        left out."""
        headers = {k: request.headers[k] for k in ("Authorization",) if k in request.headers}
        answers = await self.send_to_running("GET", path, headers)
        return {r.index: a[2] for r, a in answers if a is not None and a[0] == 200}


def stored_response_named(request: web.Request, body: bytes) -> str | None:
    """The id of the stored response a request is about: in its path (/v1/responses/{id}...), or a
    new response's previous_response_id."""
    parts = request.path.strip("/").split("/")
    if parts[:2] == ["v1", "responses"] and len(parts) > 2:
        return parts[2]
    if parts == ["v1", "responses"] and request.method == "POST":
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        previous = payload.get("previous_response_id") if isinstance(payload, dict) else None
        return previous if isinstance(previous, str) and previous else None
    return None


def affinity_key(body: bytes) -> bytes:
    """The start of the request's prompt (its messages', its prompt's, a response's input's or a
    tokens-in request's token ids' first 256 characters)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return b""
    if not isinstance(payload, dict):
        return b""
    prompt = next((payload[k] for k in ("messages", "prompt", "input", "token_ids") if k in payload), "")
    return json.dumps(prompt, sort_keys=True)[:256].encode()


async def forward(request: web.Request) -> web.StreamResponse:
    router: Router = request.app["router"]
    body = await request.read()
    headers = {k: request.headers[k] for k in _FORWARDED_HEADERS if k in request.headers}
    stored = stored_response_named(request, body)
    replica = await router.holder(stored, headers) if stored is not None else None
    replica = replica or router.pick(affinity_key(body))
    if replica is None:
        return APIError(503, "no engine replica is running", "service_unavailable").response()
    response: web.StreamResponse | None = None
    replica.in_flight += 1
    try:
        async with router.session.request(request.method, replica.url + request.path_qs, data=body,
                                          headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                "X-Corellm-Replica": str(replica.index)} | {
                k: upstream.headers[k] for k in _RETURNED_HEADERS if k in upstream.headers})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            replica.served += 1
            return response
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as e:
        logger.warning("replica %d failed a request: %s", replica.index, e)
        message = f"engine replica {replica.index} failed ({type(e).__name__}); retry the request"
        if response is None:
            return APIError(503, message, "service_unavailable").response()
        with_error = json.dumps(APIError(503, message, "service_unavailable").body())
        await response.write(f"data: {with_error}\n\n".encode())  # the stream had begun: end it with an error
        return response
    finally:
        replica.in_flight -= 1


async def health(request: web.Request) -> web.Response:
    router: Router = request.app["router"]
    states = []
    for r in router.replicas:
        state = "dead" if not r.alive() else "ok"
        if state == "ok":
            try:
                async with router.session.get(r.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    state = "ok" if resp.status == 200 else (await resp.json()).get("status", f"http {resp.status}")
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                state = "dead" if await r.exits_within(1.0) else "unreachable"
        states.append({"replica": r.index, "status": state, "pid": r.process.pid, "exit_code": r.process.poll(),
                       "in_flight": r.in_flight, "served": r.served})
    ok = sum(s["status"] == "ok" for s in states)
    status = "ok" if ok == len(states) else ("degraded" if ok else "dead")
    return web.json_response({"status": status, "replicas": states}, status=200 if ok else 503)


async def load(request: web.Request) -> web.Response:
    """GET /load: the replicas' server_load summed (each running replica's /load, asked with the
    client's Authorization; a replica that does not answer adds nothing)."""
    router: Router = request.app["router"]
    refused = api_key_refusal(request, router.api_key)
    if refused is not None:
        return refused.response()
    loads = (await router.ask_running("/load", request)).values()
    return web.json_response({"server_load": sum(json.loads(text)["server_load"] for text in loads)})


async def metrics(request: web.Request) -> web.Response:
    """The router's own figures per replica, then every running replica's engine metrics (its
    /metrics, asked with the client's Authorization: a replica that refuses it adds nothing), each
    sample labelled replica="i" (replica_metrics.py)."""
    router: Router = request.app["router"]
    refused = api_key_refusal(request, router.api_key)
    if refused is not None:
        return refused.response()
    engines = merge_replica_metrics(await router.ask_running("/metrics", request))  # a dead one: dp_replica_up
    lines = ["# HELP corellm:dp_replica_up 1 while the replica's process runs", "# TYPE corellm:dp_replica_up gauge"]
    lines += [f'corellm:dp_replica_up{{replica="{r.index}"}} {int(r.alive())}' for r in router.replicas]
    lines += ["# HELP corellm:dp_requests_in_flight requests forwarded and not yet answered",
              "# TYPE corellm:dp_requests_in_flight gauge"]
    lines += [f'corellm:dp_requests_in_flight{{replica="{r.index}"}} {r.in_flight}' for r in router.replicas]
    lines += ["# HELP corellm:dp_requests_served_total requests answered", "# TYPE corellm:dp_requests_served_total counter"]
    lines += [f'corellm:dp_requests_served_total{{replica="{r.index}"}} {r.served}' for r in router.replicas]
    return web.Response(text="\n".join(lines) + "\n" + engines, content_type="text/plain")


async def to_every_replica(request: web.Request) -> web.Response:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter: the change is every replica's (each
    serves any request), so the body goes to every running replica; the answer is the first
    refusal, else the replicas' success."""
    router: Router = request.app["router"]
    headers = {k: request.headers[k] for k in _FORWARDED_HEADERS if k in request.headers}
    answers = await router.send_to_running("POST", request.path_qs, headers, await request.read(), timeout_s=300)
    if not answers:
        return APIError(503, "no engine replica is running", "service_unavailable").response()
    replies = [a or (503, "application/json", json.dumps(APIError(
        503, f"engine replica {r.index} failed to answer", "service_unavailable").body())) for r, a in answers]
    status, content_type, text = next((reply for reply in replies if reply[0] != 200), replies[0])
    return web.Response(status=status, text=text, content_type=content_type.split(";")[0])


@dataclass(frozen=True)
class ReplicaPlacement:
    """What each replica may use of this machine, so that the replicas do not run over each other:
    on the CPU a share of the cores (one replica's threads spinning on another's cores slows both
    many times over), on CUDA devices of its own when there are enough.

    cpu_threads: the cores this process may use (torch's count: OMP_NUM_THREADS or the affinity).
    cuda_devices: the visible CUDA devices' ids, for --device cuda; None on the CPU.
    ranks: each replica's processes (its tensor-parallel size)."""
    size: int
    ranks: int
    cpu_threads: int
    cuda_devices: list[str] | None = None

    def environment(self, index: int) -> dict[str, str]:
        """The variables replica `index` is started with, over this process's own."""
        env = {"OMP_NUM_THREADS": str(max(1, self.cpu_threads // self.size))}
        if self.cuda_devices is not None and len(self.cuda_devices) >= self.size * self.ranks:
            mine = self.cuda_devices[index * self.ranks:(index + 1) * self.ranks]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        return env

    @classmethod
    def of(cls, config, size: int) -> ReplicaPlacement:
        """config: the engine's EngineConfig (device, tensor_parallel_size)."""
        import torch

        cuda_devices = None
        if config.device.startswith("cuda"):
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            cuda_devices = ([d.strip() for d in visible.split(",") if d.strip()] if visible is not None
                            else [str(i) for i in range(torch.cuda.device_count())])
            if len(cuda_devices) < size * config.tensor_parallel_size:
                logger.warning("data parallel: %d replicas x %d ranks share %d CUDA device(s)", size,
                               config.tensor_parallel_size, len(cuda_devices))
        return cls(size=size, ranks=config.tensor_parallel_size, cpu_threads=torch.get_num_threads(),
                   cuda_devices=cuda_devices)


def start_replicas(argv: list[str], placement: ReplicaPlacement) -> list[Replica]:
    """Starts `placement.size` replicas with the command line this process got (its --port, --host
    and --data-parallel-size overridden: the last occurrence wins), each in its place."""
    from corellm.worker.tp_workers import free_local_port

    replicas = []
    for index in range(placement.size):
        port = free_local_port()
        cmd = [sys.executable, "-m", "corellm.cli", *argv, "--host", "127.0.0.1", "--port", str(port),
               "--data-parallel-size", "1"]
        env = {**os.environ, **placement.environment(index)}
        replicas.append(Replica(index, port, subprocess.Popen(cmd, env=env)))
    return replicas


async def wait_ready(replicas: list[Replica], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        for r in replicas:
            while True:
                if not r.alive():
                    raise RuntimeError(f"engine replica {r.index} exited with {r.process.returncode} while starting")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"engine replica {r.index} did not become healthy in {timeout:.0f} s")
                try:
                    async with session.get(r.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                        if resp.status == 200:
                            break
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.2)


def create_router_app(router: Router) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["router"] = router

    async def session_context(app: web.Application):
        router.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        yield
        await router.session.close()

    app.cleanup_ctx.append(session_context)
    app.router.add_get("/health", health)
    for add in (app.router.add_get, app.router.add_post):
        add("/ping", health)  # SageMaker's health check, GET or POST
    app.router.add_get("/load", load)
    app.router.add_get("/metrics", metrics)
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        app.router.add_post(path, to_every_replica)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve_router(replicas: list[Replica], host: str, port: int, started: float,
                       api_key: str | None) -> None:
    await wait_ready(replicas, timeout=600)
    runner = web.AppRunner(create_router_app(Router(replicas, api_key=api_key)), handler_cancellation=True,
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    logger.info("serving %d engine replicas on http://%s:%d (ready in %.1f s)", len(replicas), host, port,
                time.perf_counter() - started)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def run_data_parallel(argv: list[str], placement: ReplicaPlacement, host: str, port: int,
                      api_key: str | None = None) -> int:
    started = time.perf_counter()
    logger.info("data parallel: %d replicas, %d CPU threads each%s", placement.size,
                max(1, placement.cpu_threads // placement.size),
                "" if placement.cuda_devices is None else
                ", CUDA devices " + " | ".join(placement.environment(i).get("CUDA_VISIBLE_DEVICES", "shared")
                                               for i in range(placement.size)))
    replicas = start_replicas(argv, placement)
    try:
        asyncio.run(serve_router(replicas, host, port, started, api_key))
    finally:
        for r in replicas:
            if r.alive():
                r.process.send_signal(signal.SIGTERM)
        for r in replicas:
            try:
                r.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                r.process.kill()
    return 0
