"""server/handoff.py: a request's worker thread hands its items to the event loop
without waiting for it, in order, and learns when the reader has left."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pydflash.server.handoff import Handoff, HandoffClosed


def test_items_from_a_thread_arrive_in_order_and_the_end_ends_the_iteration():
    async def main() -> list[int]:
        h = Handoff[int](asyncio.get_running_loop())

        def write() -> None:
            for i in range(1000):
                h.put(i)
            h.end()

        t = threading.Thread(target=write)
        t.start()
        got = [i async for i in h]  # woken from a wait as items come, and at the end
        t.join()
        return got

    assert asyncio.run(main()) == list(range(1000))


def test_the_writer_never_waits_for_the_loop():
    async def main() -> tuple[bool, list[int]]:
        h = Handoff[int](asyncio.get_running_loop())
        t = threading.Thread(target=lambda: [h.put(i) for i in range(5000)])
        t.start()
        # the loop reads nothing while the thread writes everything (it is blocked here, on purpose)
        t.join(timeout=30)
        finished = not t.is_alive()
        h.end()
        return finished, [i async for i in h]

    finished, got = asyncio.run(main())
    assert finished and got == list(range(5000))


def test_a_reader_that_left_refuses_what_comes_after():
    async def main() -> None:
        h = Handoff[str](asyncio.get_running_loop())
        h.put("a")
        h.close()
        with pytest.raises(HandoffClosed):
            h.put("b")
        h.end()  # the writer's last word after the reader left: no error
        with pytest.raises(StopAsyncIteration):  # what waited is dropped with the reader
            await asyncio.wait_for(h.get(), 1)

    asyncio.run(main())


def test_a_cancelled_read_leaves_the_handoff_usable():
    async def main() -> str:
        h = Handoff[str](asyncio.get_running_loop())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(h.get(), 0.05)
        threading.Thread(target=h.put, args=("late",)).start()
        return await asyncio.wait_for(h.get(), 5)

    assert asyncio.run(main()) == "late"


def test_drain_takes_what_waits_without_waiting():
    async def main() -> tuple[list[int], list[int]]:
        h = Handoff[int](asyncio.get_running_loop())
        for i in range(3):
            h.put(i)
        first = [await h.get(), *h.drain()]
        return first, h.drain()

    assert asyncio.run(main()) == ([0, 1, 2], [])
