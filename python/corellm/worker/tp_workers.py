"""TensorParallelWorkers: the processes that hold ranks 1 .. size-1 of a tensor-parallel model
(rank 0 is the engine's own model runner), started with torch.multiprocessing.

    engine process (rank 0)                     worker process (rank r)
      start(): spawn this node's workers ────▶   (the other nodes' ranks come from
                                                 `corellm serve --headless`)
      join the group, then the channel ◀──────▶  join the group (gloo / NCCL), then the channel
                                                 load the model's share r (its heads, its rows)
      load share 0
      collective_rpc("setup_kv_cache") ──────▶   loop: receive a StepMessage — a call of a Worker
      each step: StepMessage.send, forward ───▶        method (its result gathered to rank 0), or a
                 (collectives with every rank)          step: the forward and the logits with rank 0
                                                        (all-reduces and gathers pair up) — until STOP
      stop() ────────────────────────────────▶   exit

Steps travel on a BroadcastChannel (distributed/broadcast_channel.py): shared memory on one
machine, a gloo group of their own across machines; a worker waits there as long as the engine
is idle. A worker that dies makes rank 0's next collective fail (gloo: the connection closes; a
hang ends at the group's timeout) instead of blocking the engine; a worker whose rank 0 died
stops."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from corellm.distributed.broadcast_channel import BroadcastChannel
from corellm.distributed.parallel_state import TensorParallel, collective_timeout, init_tensor_parallel
from corellm.distributed.spawned_processes import StartSignal
from corellm.lora.lora_adapter import LoraAdapter
from corellm.lora.lora_batch import LoraBatch
from corellm.model.tensor_parallel import shard_lora_adapter
from corellm.worker.sampled_rows import sampled_rows
from corellm.worker.step_activity import StepActivity
from corellm.worker.step_message import RESULT, RPC, STEP, STOP, StepMessage

logger = logging.getLogger("corellm")


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank loads: the model as the engine was asked for it."""

    model: str | None
    dtype: str
    device: str
    quantization: str | None
    size: int
    init_method: str
    threads: int  # CPU threads per rank
    ranks_per_node: int  # size / nnodes; rank r runs on node r // ranks_per_node
    shm_all_reduce: bool  # the all-reduces through shared memory (every rank on one machine, the CPU)
    max_model_len: int | None = None  # the engine's, as given (picks LongRoPE's factors, as on rank 0)
    hf_overrides: dict | None = None  # the engine's (EngineConfig)


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A worker's state — its share of the model, its KV cache — and what rank 0 can ask of it:
    run a step, or one of RPC_METHODS through TensorParallelWorkers.collective_rpc."""

    RPC_METHODS = ("setup_kv_cache", "memory_usage", "set_lora")

    def __init__(self, rank: int, model):
        self.rank, self.model = rank, model
        self.kv_caches, self.stack = None, None
        self.activity = StepActivity()  # the KV cache's commit waits for pauses in the steps
        self.lora_adapters: list[LoraAdapter | None] = []  # by slot: this rank's share of each

    def setup_kv_cache(self, num_blocks: int, block_size: int, kv_cache_dtype: torch.dtype) -> None:
        """The same blocks of the same elements as rank 0's, this rank's KV heads."""
        from corellm.model.native_stack import NativeDecoderStack, supports as native_stack_supports
        from corellm.worker.kv_cache import allocate_kv_caches

        m = self.model
        self.kv_caches = allocate_kv_caches(m.config, num_blocks, block_size, kv_cache_dtype, m.device, self.activity)
        self.stack = NativeDecoderStack(m, self.kv_caches) if native_stack_supports(m) else None

    def set_lora(self, slot: int, adapter: LoraAdapter) -> None:
        """Slot `slot` holds `adapter` (the whole model's, as rank 0 loaded it): this rank keeps
        its share (tensor_parallel.shard_lora_adapter), for the steps' tokens that name the slot."""
        share = shard_lora_adapter(adapter, self.model.full_config, self.rank, self.model.tp.size)
        self.lora_adapters += [None] * (slot + 1 - len(self.lora_adapters))
        self.lora_adapters[slot] = share
        if self.stack is not None:
            self.stack.set_lora(slot, share)

    def memory_usage(self) -> dict[str, int]:
        """This rank's weights and KV cache in bytes, and its process's resident memory."""
        kv = sum(t.numel() * t.element_size() for pair in self.kv_caches or [] for t in pair)
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"rank": self.rank, "pid": os.getpid(), "weight_bytes": sum(self.model.weight_bytes().values()),
                "kv_cache_bytes": kv, "resident_bytes": resident}

    def execute(self, step: StepMessage) -> None:
        """The step's forward and logits, as rank 0's model runner: the same collectives in order."""
        model, device = self.model, self.model.device
        if self.kv_caches is None:
            raise RuntimeError(f"rank {self.rank}: a step came before setup_kv_cache")
        with torch.inference_mode(), self.activity.running():
            inputs_embeds = None
            if step.image_row_bits is not None:  # rank 0's image rows in place of the placeholders
                image_rows = step.image_row_bits.view(model.dtype).to(device)
                inputs_embeds = model.embed_with_image_rows(step.input_ids.to(device), step.image_row_index.to(device),
                                                            image_rows)
            if self.stack is not None:
                hidden = self.stack.forward(step.input_ids, step.positions, step.attn, inputs_embeds=inputs_embeds,
                                            lora_slots=step.lora_slots)
            else:
                lora = None if step.lora_slots is None else LoraBatch(step.lora_slots, self.lora_adapters)
                hidden = model.forward(step.input_ids.to(device), step.positions.to(device), step.attn, self.kv_caches,
                                       inputs_embeds=inputs_embeds, lora=lora)
            for start, end in step.prompt_rows:  # rank 0's prompt logprobs: the same gathers, in order
                model.compute_logits(hidden[start:end])
            model.compute_logits(sampled_rows(hidden, step.logits_indices))


class WorkerLoop:
    """A rank other than 0, in this process: joins the group, loads its share, then (run) runs
    what rank 0 sends — steps and collective_rpc calls — until STOP or a RESULT."""

    def __init__(self, rank: int, spec: WorkerSpec):
        from corellm.model.loader import load_model

        torch.set_num_threads(spec.threads)
        self.rank = rank
        device = torch.device(spec.device if spec.device == "cpu" else f"cuda:{rank % spec.ranks_per_node}")
        parent = os.getppid()  # rank 0, which spawned this process (under torchrun: its agent, which ends every rank)
        tp = init_tensor_parallel(rank, spec.size, spec.init_method, device, shm_all_reduce=spec.shm_all_reduce)
        self.channel = BroadcastChannel(tp, shared_memory=spec.ranks_per_node == spec.size,
                                        writer_alive=lambda: os.getppid() == parent)
        self.loaded = load_model(spec.model, dtype=spec.dtype, device=str(device), quantization=spec.quantization,
                                 progress=False, tensor_parallel=tp, max_model_len=spec.max_model_len,
                                 hf_overrides=spec.hf_overrides)
        self.worker = Worker(rank, self.loaded.model)
        self.stopped = False  # STOP received
        self._closed = False

    def run(self) -> bytes | None:
        """Runs rank 0's steps and calls until STOP (returns None; the loop is then stopped) or a
        RESULT (returns its bytes)."""
        while True:
            command, payload, step = StepMessage.receive(self.channel)
            if command == STOP:
                self.stopped = True
                return None
            if command == RESULT:
                return payload
            if command == RPC:
                method, args = pickle.loads(payload)
                try:
                    result = getattr(self.worker, method)(*args)
                except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it
                    result = RpcError(f"rank {self.rank}: {method}: {type(e).__name__}: {e}")
                torch.distributed.gather_object(result, None, dst=0, group=self.channel.group)
                continue
            assert command == STEP and step is not None
            self.worker.execute(step)

    def close(self) -> None:
        """Leaves the group (once)."""
        if not self._closed:
            self._closed = True
            torch.distributed.destroy_process_group()


def worker_main(rank: int, spec: WorkerSpec, started=None) -> None:
    """A worker process: tells its parent it has started (`started`: a StartSignal's sending end,
    when spawned), then its loop until rank 0 stops it (a RESULT, sent only to ranks that an LLM
    under torchrun runs, would be a protocol error here)."""
    StartSignal.send(started)
    loop = WorkerLoop(rank, spec)
    if loop.run() is not None:
        raise RuntimeError(f"rank {rank}: rank 0 sent a RESULT to a worker process")
    loop.close()


@dataclass(frozen=True)
class RpcError:
    """A worker method's failure, sent back to rank 0 in place of its result."""

    message: str


class TensorParallelWorkers:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.tp: TensorParallel | None = None
        self.channel: BroadcastChannel | None = None
        self._processes: list[mp.Process] = []
        self._threads_before = torch.get_num_threads()  # rank 0's share of the cores until stop()

    @staticmethod
    def spec_for(config) -> WorkerSpec:
        """The workers' spec for an EngineConfig; the cores this process may use split between this
        node's ranks: torch's thread count (the machine's cores, or a data-parallel replica's
        share), or under torchrun, which sets OMP_NUM_THREADS=1 for every rank, the machine's."""
        per_node = config.tensor_parallel_size // config.nnodes
        cores = (os.cpu_count() or 1) if config.torchrun else torch.get_num_threads()
        init = "env://" if config.torchrun else f"tcp://{config.master_addr}:{config.master_port or free_local_port()}"
        return WorkerSpec(config.model, config.dtype, config.device, config.quantization, config.tensor_parallel_size,
                          init, max(1, cores // per_node), per_node,
                          shm_all_reduce=config.nnodes == 1 and not config.disable_custom_all_reduce,
                          max_model_len=config.max_model_len, hf_overrides=config.hf_overrides)

    def _spawn(self, ranks: range) -> list[StartSignal]:
        context = mp.get_context("spawn")
        signals = []
        for rank in ranks:
            signal = StartSignal(context)
            p = context.Process(target=worker_main, args=(rank, self.spec, signal.sender), daemon=True,
                                name=f"corellm-tp{rank}")
            p.start()
            signal.handed_to(p)
            self._processes.append(p)
            signals.append(signal)
        return signals

    def _await_started(self, signals: list[StartSignal]) -> None:
        """Waits until every spawned worker has started (before the group's rendezvous, which would
        only time out), within the collective timeout (CORELLM_COLLECTIVE_TIMEOUT_S); one that died
        or hangs ends the others and raises, naming it."""
        deadline = time.monotonic() + collective_timeout().total_seconds()
        try:
            for signal in signals:
                signal.wait(deadline, "tensor-parallel worker")
        except BaseException:
            for p in self._processes:
                p.kill()
                p.join(timeout=5)
            self._processes = []
            raise

    @classmethod
    def start(cls, config) -> TensorParallelWorkers:
        """Node 0: spawns this node's ranks but rank 0 and joins the group as rank 0 (the other
        nodes' ranks come from `corellm serve --headless`; under torchrun, every rank comes from it)."""
        workers = cls(cls.spec_for(config))
        spec = workers.spec
        if not config.torchrun:
            workers._await_started(workers._spawn(range(1, spec.ranks_per_node)))
        torch.set_num_threads(spec.threads)
        workers.tp = init_tensor_parallel(0, spec.size, spec.init_method, torch.device(spec.device),
                                          shm_all_reduce=spec.shm_all_reduce)
        workers.channel = BroadcastChannel(workers.tp, shared_memory=spec.ranks_per_node == spec.size)
        reduce_over = "shared memory" if workers.tp.shm_all_reduce is not None else torch.distributed.get_backend()
        logger.info("tensor parallel: %d ranks on %d node(s) (%d worker processes here), %d CPU threads each, "
                    "steps over %s, all-reduces over %s", spec.size, spec.size // spec.ranks_per_node,
                    spec.ranks_per_node - 1, spec.threads, workers.channel.transport, reduce_over)
        return workers

    @classmethod
    def run_headless(cls, config) -> int:
        """Another node (node_rank > 0): runs its ranks until rank 0 stops them; the exit status is
        0 when every one of them ended well."""
        workers = cls(cls.spec_for(config))
        first = config.node_rank * workers.spec.ranks_per_node
        workers._await_started(workers._spawn(range(first, first + workers.spec.ranks_per_node)))
        logger.info("headless node %d: ranks %d..%d joining %s", config.node_rank, first,
                    first + workers.spec.ranks_per_node - 1, workers.spec.init_method)
        for p in workers._processes:
            p.join()
        return max((abs(p.exitcode or 0) for p in workers._processes), default=0)

    @classmethod
    def run_torchrun_rank(cls, config, rank: int) -> int:
        """A rank other than 0 started by torchrun: runs the worker loop in this process until
        rank 0 stops it."""
        worker_main(rank, cls.spec_for(config))
        return 0

    def collective_rpc(self, method: str, *args) -> list:
        """Runs Worker.<method>(*args) on every worker (ranks 1 ..) and returns their results in rank
        order; ValueError for a method workers do not have, RuntimeError naming the rank where one
        raised. (Rank 0's own part is the model runner's.)"""
        if method not in Worker.RPC_METHODS:
            raise ValueError(f"collective_rpc: workers have no method {method!r} (they have "
                             f"{', '.join(Worker.RPC_METHODS)})")
        StepMessage.send_bytes(self.channel, RPC, pickle.dumps((method, args)))
        results = [None] * self.spec.size
        torch.distributed.gather_object(None, results, dst=0, group=self.channel.group)
        errors = [r.message for r in results[1:] if isinstance(r, RpcError)]
        if errors:
            raise RuntimeError("; ".join(errors))
        return results[1:]

    def send_result(self, result) -> None:
        """Rank 0's answer to an LLM call every rank made (LLM under torchrun): the other ranks'
        WorkerLoop.run returns it, pickled."""
        StepMessage.send_bytes(self.channel, RESULT, pickle.dumps(result))

    def setup(self, num_blocks: int, block_size: int, kv_cache_dtype: torch.dtype) -> None:
        """Every worker allocates its KV cache: the same blocks of the same elements as rank 0's,
        its own KV heads."""
        self.collective_rpc("setup_kv_cache", num_blocks, block_size, kv_cache_dtype)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self._processes)

    def describe_dead(self) -> str:
        return ", ".join(f"{p.name} exited with {p.exitcode}" for p in self._processes if not p.is_alive())

    def stop(self) -> None:
        """Ends the workers' loops, then their processes (killed if they do not exit in time)."""
        if self.tp is None:
            return
        try:
            if self.alive():
                StepMessage.send_command(self.channel, STOP)
        except RuntimeError as e:  # a worker died: the broadcast cannot complete
            logger.warning("tensor parallel: stopping the workers: %s", e)
        for p in self._processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        torch.distributed.destroy_process_group()
        torch.set_num_threads(self._threads_before)
        self.tp = self.channel = None


__all__ = ["STEP", "TensorParallelWorkers", "WorkerLoop", "WorkerSpec", "worker_main"]
