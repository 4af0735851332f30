"""`python -m tests.support.hang`: a process whose event loop runs but whose one task waits
forever, as a hung worker's does (the fork server's stack dump must name where it waits)."""

from __future__ import annotations

import asyncio


async def wait_for_a_reply_that_never_comes() -> None:
    await asyncio.get_running_loop().create_future()


async def main() -> None:
    print("waiting", flush=True)
    await asyncio.create_task(wait_for_a_reply_that_never_comes())


if __name__ == "__main__":
    asyncio.run(main())
