"""The peers' side of the PostgreSQL burn-down (`JOBMGR_BENCH_ONLY=peers`):
PgQueuer or procrastinate, on a fresh database of their own, enqueue N no-op
jobs in batches of 1,000 and drain them with K consumers, each as its own
documentation shows (PgQueuer: K queue managers taking batches of 64;
procrastinate: one worker of concurrency K). Prints one JSON line:
{"enqueue": jobs/s, "drain": jobs/s}.

Usage: python peers.py pgqueuer|procrastinate DSN N K
"""

import asyncio
import json
import sys
import time


async def pgqueuer(dsn: str, n: int, k: int) -> dict:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    await queries.install()
    started = time.perf_counter()
    for first in range(0, n, 1000):
        count = min(1000, n - first)
        await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
    enqueued = time.perf_counter()

    async def consumer() -> None:
        own = await asyncpg.connect(dsn)
        manager = QueueManager(Queries(AsyncpgDriver(own)))

        @manager.entrypoint("noop")
        async def noop(job) -> None:
            pass

        await manager.run(batch_size=64, mode=QueueExecutionMode.drain)
        await own.close()

    await asyncio.gather(*(consumer() for _ in range(k)))
    drained = time.perf_counter()
    left = await connection.fetchval("SELECT count(*) FROM pgqueuer WHERE status = 'queued'")
    await connection.close()
    if left:
        raise SystemExit(f"pgqueuer left {left} jobs queued")
    return {"enqueue": n / (enqueued - started), "drain": n / (drained - enqueued)}


async def procrastinate(dsn: str, n: int, k: int) -> dict:
    import procrastinate as p

    app = p.App(connector=p.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        pass

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        for first in range(0, n, 1000):
            count = min(1000, n - first)
            await noop.batch_defer_async(*([{}] * count))
        enqueued = time.perf_counter()
        await app.run_worker_async(concurrency=k, wait=False, install_signal_handlers=False)
        drained = time.perf_counter()
    return {"enqueue": n / (enqueued - started), "drain": n / (drained - enqueued)}


def main() -> None:
    which, dsn, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    run = {"pgqueuer": pgqueuer, "procrastinate": procrastinate}[which]
    print(json.dumps(asyncio.run(run(dsn, n, k))))


if __name__ == "__main__":
    main()
