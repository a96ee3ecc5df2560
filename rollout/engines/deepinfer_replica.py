"""One DeepInfer replica: the 8 ranks of a DEP8 node, which the actor pool treats as one engine.

`engine.name: deepinfer` names this engine. On `start()` it reserves a Ray placement group
of one bundle per rank (STRICT_PACK: one node), runs the preflight on that node, picks a
rendezvous address and a free port there (unique per replica on the host), and starts one
rank actor per bundle, each with its own GPU (CUDA_VISIBLE_DEVICES) and the determinism
switches in its environment from process start. `generate()` splits the requests across
the ranks, calls all of them together (they step together: experts are sharded), and
merges the results back in request order. If any rank dies the replica is lost as a
whole (`EngineLost`): the pool replaces the actor holding it and retries the shard.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from rollout.engines.base import GenerationRequest, GenerationResult, HFTokenizerEngine
from rollout.engines.deepinfer import (
    MASTER_PORT_OFFSET,
    DeepInferOptions,
    DeepInferRank,
    Gpu,
    RankRequest,
    fingerprint,
    finish,
    preflight,
    prepare,
    rank_env,
)
from rollout.errors import EngineError, EngineLost, config_error_from_validation, first_line

log = logging.getLogger(__name__)


def split(n_requests: int, ranks: int) -> list[list[int]]:
    """Request indices per rank: round robin, so every rank gets a share of each shard."""
    return [list(range(r, n_requests, ranks)) for r in range(ranks)]


def _node_probe(options_json: str, needed_gpus: int, port: int | None) -> tuple[str, int, list]:
    """Runs in bundle 0 (the replica's node): preflight, then the rendezvous address."""
    import ray

    options = DeepInferOptions.model_validate_json(options_json)
    gpus = preflight(options, needed_gpus)
    if port is None:
        with socket.socket() as s:  # a free port for DeepInfer's rendezvous on this host
            s.bind(("", 0))
            port = s.getsockname()[1] + MASTER_PORT_OFFSET
    return ray.util.get_node_ip_address(), port, [g.__dict__ for g in gpus]


class RankActor:
    """One rank in its own process; wrapped by `ray.remote` with its bundle and environment."""

    def __init__(self, options_json: str, rank: int) -> None:
        import os

        import ray

        ids = ray.get_gpu_ids()
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids)) if ids else str(rank)
        self.rank = DeepInferRank(DeepInferOptions.model_validate_json(options_json), rank)
        self.rank.start()

    def versions(self) -> dict[str, str]:
        return self.rank.versions

    def tokenizer(self) -> Any:
        return self.rank.tokenizer()

    def generate(self, requests: list[RankRequest]) -> list:
        return self.rank.generate(requests)

    def close(self) -> None:
        self.rank.close()


class DeepInferReplica(HFTokenizerEngine):
    name = "deepinfer"

    @classmethod
    def path_options(cls) -> tuple[str, ...]:
        return ("model", "jit_cache_dir")

    def __init__(self, **options: Any) -> None:
        try:
            self.options = DeepInferOptions(**options)
        except ValidationError as exc:
            raise config_error_from_validation(exc, prefix="engine.options") from None
        self._ranks: list[Any] = []
        self._pg: Any = None
        self._tokenizer: Any = None
        self._fingerprint: dict[str, Any] | None = None
        self._eos: frozenset[int] = frozenset()

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._ranks:
            return
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        o = self.options
        bundle = {"CPU": o.cpus_per_engine} | (
            {"GPU": o.gpus_per_engine} if o.gpus_per_engine else {}
        )
        from rollout.runtime.actor import resource_group_name

        self._pg = placement_group(
            [bundle] * o.engines_per_replica, strategy="STRICT_PACK", name=resource_group_name()
        )
        try:
            ray.get(self._pg.ready(), timeout=o.start_timeout_s)
        except GetTimeoutError:
            remove_placement_group(self._pg)
            raise EngineError(
                f"no node had room for a replica ({o.engines_per_replica} x {bundle}) within "
                f"{o.start_timeout_s:.0f} s (engine.options.start_timeout_s)"
            ) from None

        def at(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=i
            )

        needed = math.ceil(o.engines_per_replica * o.gpus_per_engine)
        probe = ray.remote(_node_probe).options(num_cpus=0, scheduling_strategy=at(0))
        try:
            addr, port, gpus = ray.get(probe.remote(o.model_dump_json(), needed, o.master_port))
        except RayTaskError as exc:
            remove_placement_group(self._pg)
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, EngineError) else EngineError(str(exc))) from None
        env = rank_env(o) | {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        cls = ray.remote(RankActor)
        # Each rank takes its bundle's GPU from Ray (CUDA_VISIBLE_DEVICES set by Ray), so
        # replicas sharing a node get distinct devices.
        self._ranks = [
            cls.options(
                num_cpus=0,
                num_gpus=o.gpus_per_engine,
                max_restarts=0,
                scheduling_strategy=at(r),
                runtime_env={"env_vars": env},
            ).remote(o.model_dump_json(), r)  # fmt: skip
            for r in range(o.engines_per_replica)
        ]
        try:
            per_rank = ray.get(
                [a.versions.remote() for a in self._ranks], timeout=o.start_timeout_s
            )
            # the engine's own tokenizer (DeepInfer's BOS policy), so that prompts are
            # tokenized exactly as its own text path does
            self._tokenizer = ray.get(self._ranks[0].tokenizer.remote(), timeout=o.start_timeout_s)
        except (RayActorError, RayTaskError, GetTimeoutError) as exc:
            self.close()
            raise EngineError(f"a DeepInfer rank failed to start: {first_line(exc)}") from None
        if any(v != per_rank[0] for v in per_rank):
            self.close()
            raise EngineError(f"the ranks of one replica run different versions: {per_rank}")
        eos = self._tokenizer.eos_token_id
        self._eos = frozenset([eos] if isinstance(eos, int) else [])
        self._fingerprint = fingerprint(o, per_rank[0], [Gpu(**g) for g in gpus])
        log.info("deepinfer replica ready: %d ranks on %s, rendezvous port %d", o.engines_per_replica, addr, port)  # fmt: skip

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._ranks = []
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

    def _require_started(self) -> None:
        if not self._ranks:
            raise EngineError("the deepinfer replica is not started: call start() first")

    def encode(self, text: str) -> list[int]:
        """As DeepInfer's own text path: its tokenizer's `encode`, which inserts BOS (id 0)."""
        self._require_started()
        return list(self._tokenizer.encode(text))

    def encode_continuation(self, text: str) -> list[int]:
        """A completion after the prompt: no BOS in front of it."""
        self._require_started()
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    # -- generation -----------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        self._require_started()
        prepared = [prepare(r, i, self.options.max_model_len) for i, r in enumerate(requests)]
        parts = split(len(prepared), len(self._ranks))
        refs = [rank.generate.remote([prepared[i] for i in part])
                for rank, part in zip(self._ranks, parts, strict=True)]  # fmt: skip
        try:
            outputs = [out for chunk in ray.get(refs) for out in chunk]
        except RayActorError as exc:
            self.close()
            raise EngineLost(f"a DeepInfer rank died: {first_line(exc)}") from None
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, Exception) else EngineError(str(exc))) from None
        by_index = {out.index: out for out in outputs}
        if len(by_index) != len(prepared):
            raise EngineError(
                f"the ranks returned {len(by_index)} results for {len(prepared)} requests"
            )
        return [finish(r, p, by_index[p.index], self._eos, self.decode)
                for r, p in zip(requests, prepared, strict=True)]  # fmt: skip
