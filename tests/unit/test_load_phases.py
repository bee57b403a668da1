"""A model's warm-up measures its engine alone: never beside another model's backend build
(:class:`~trtserve.engine.registry.LoadPhases`), because the curve it measures chooses the batch
cap the model starts with."""

from __future__ import annotations

import asyncio
import shutil
import threading

from trtserve.engine.registry import LoadPhases


async def _spin(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


class _Loads:
    """Builds and warm-ups through one :class:`LoadPhases`, each noting when it starts and ends."""

    def __init__(self) -> None:
        self.phases = LoadPhases()
        self.events: list[str] = []

    async def build(self, name: str, hold: asyncio.Event | None = None) -> None:
        async with self.phases.build():
            self.events.append(f"build {name}")
            if hold is not None:
                await hold.wait()
            self.events.append(f"built {name}")

    async def warm(self, name: str) -> None:
        async with self.phases.warm_up():
            self.events.append(f"warm {name}")
            await _spin()
            self.events.append(f"warmed {name}")


def test_a_warm_up_waits_for_the_builds_in_progress_and_runs_alone():
    async def go() -> list[str]:
        loads, release = _Loads(), asyncio.Event()
        builds = [asyncio.create_task(loads.build(n, release)) for n in ("a", "b")]
        await _spin()
        warms = [asyncio.create_task(loads.warm(n)) for n in ("c", "d")]
        await _spin()
        assert loads.events == ["build a", "build b"]  # both build at once; no warm-up beside them
        release.set()
        await asyncio.gather(*builds, *warms)
        return loads.events

    events = asyncio.run(go())
    assert sorted(events[2:4]) == ["built a", "built b"]
    assert events[4:] in (["warm c", "warmed c", "warm d", "warmed d"], ["warm d", "warmed d", "warm c", "warmed c"])


def test_a_build_asked_for_while_a_warm_up_waits_goes_first_and_the_warm_up_waits_for_it_too():
    async def go() -> list[str]:
        loads, release, later = _Loads(), asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(loads.build("a", release))
        await _spin()
        waiting = asyncio.create_task(loads.warm("w"))
        await _spin()
        late = asyncio.create_task(loads.build("b", later))  # a small model's build: not behind the warm-up
        await _spin()
        assert loads.events == ["build a", "build b"]
        release.set()
        await _spin()
        assert loads.events == ["build a", "build b", "built a"]  # b still builds: no warm-up yet
        later.set()
        await asyncio.gather(first, waiting, late)
        return loads.events

    assert asyncio.run(go()) == ["build a", "build b", "built a", "built b", "warm w", "warmed w"]


def test_a_build_asked_for_while_a_warm_up_runs_waits_for_its_end():
    async def go() -> list[str]:
        loads, hold = _Loads(), asyncio.Event()

        async def long_warm() -> None:
            async with loads.phases.warm_up():
                loads.events.append("warm w")
                await hold.wait()
                loads.events.append("warmed w")

        warming = asyncio.create_task(long_warm())
        await _spin()
        build = asyncio.create_task(loads.build("a"))
        await _spin()
        assert loads.events == ["warm w"]
        hold.set()
        await asyncio.gather(warming, build)
        return loads.events

    assert asyncio.run(go()) == ["warm w", "warmed w", "build a", "built a"]


def test_a_model_is_not_warmed_up_and_ready_while_another_models_backend_builds(tmp_path, engines):
    """Two copies of tiny load together; the second's build is held until the first's backend
    has been built. The first may not warm up (and so may not turn READY) until it is let go."""
    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.registry import ModelRegistry
    from trtserve.ipc.engine import ModelState

    config = (engines / "tiny" / "config.pbtxt").read_text()
    for name in ("first", "second"):
        shutil.copytree(engines / "tiny", tmp_path / name)
        (tmp_path / name / "config.pbtxt").write_text(config.replace('"tiny"', f'"{name}"'))
    release, first_built = threading.Event(), threading.Event()

    def factory(spec):
        if spec.name == "second":
            release.wait(60)
        backend = runtimes.create(spec)
        if spec.name == "first":
            first_built.set()
        return backend

    async def go() -> tuple[list[ModelState], dict[str, ModelState]]:
        registry = ModelRegistry(tmp_path, clock=MonotonicClock(), backend_factory=factory)
        loading = asyncio.create_task(registry.load_all())
        try:
            await asyncio.to_thread(first_built.wait, 60)
            states = []
            for _ in range(20):  # tiny's warm-up takes well under this (2 s) when nothing holds it
                await asyncio.sleep(0.1)
                states.append(registry.models["first"].state)
        finally:
            release.set()  # never leave the second build's thread blocked
            await loading
        try:
            return states, {name: e.state for name, e in registry.models.items()}
        finally:
            await registry.aclose()

    held, final = asyncio.run(go())
    assert first_built.is_set()
    assert set(held) == {ModelState.LOADING}
    assert final == {"first": ModelState.READY, "second": ModelState.READY}
