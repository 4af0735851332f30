"""What a fenced saver knows of the executions of this process: the lease each holds (by run and
token), their buffers of writes not yet committed, and which checkpoints they hold back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from langchain_core.runnables import RunnableConfig

from keel.core.context import RunContext
from keel.core.context import _current as _running
from keel.core.errors import LeaseLost
from keel.core.store.store import Store
from keel.langgraph.buffers import Buffer
from keel.langgraph.timeline import StepTimeline


class Executions(StepTimeline):
    """The leases this process holds and the buffers of its executions."""

    store: Store

    def bind(self, store: Store) -> None:
        self.store = store
        self.holders: dict[str, tuple[int, str]] = {}
        self.buffers: dict[tuple[str, int], Buffer] = {}
        self.progressed: set[tuple[str, int]] = set()
        """(run, token) of executions that committed a step: an interruption that ends one is
        not counted with those before it (`Executor._failed_attempt`)."""
        self.unwritten: set[tuple[str, int]] = set()
        """(run, token) of executions whose run never ran before (its claim said so): no
        checkpoint exists, so the loop's first read is answered without the database."""
        self.first_executions: set[tuple[str, int]] = set()
        """(run, token) of a run's first execution (its claim said so), on a thread of many
        runs too: its input's checkpoint waits for its first step's transaction, the admission
        record holding the same input durably meanwhile (see keel.langgraph.savers)."""
        self.plain_starts: set[tuple[str, int]] = set()
        """(run, token) of those whose graph's START step runs none of the user's code: its
        checkpoint waits for the first step's too (see keel.langgraph.savers)."""
        self.triggers: dict[tuple[str, int], Mapping[str, Sequence[str]]] = {}
        """(run, token) -> the graph's channels and the nodes each triggers (LangGraph's own
        `trigger_to_nodes`): how a checkpoint is known to be the run's last."""
        self.threads: dict[str, str] = {}
        """thread id -> the run of this process executing on it (a run on a thread of many runs;
        a run of its own thread is named by its id)."""
        self.roots: dict[tuple[str, int], str] = {}
        """(run, token) -> the id of the last root checkpoint the execution saved."""
        self.anchors: dict[tuple[str, int], str] = {}
        """(run, token) -> the id of its last root checkpoint known committed (where a stream
        chunk produced now is placed: keel.langgraph.chunks)."""
        self.before_commit: dict[tuple[str, int], Callable[[], Awaitable[None]]] = {}
        """(run, token) -> what commits before each of its step transactions (its captured
        stream chunks: a chunk is durable before the step after it)."""
        self.sends: dict[str, list[str]] = {}
        """Per checkpoint id, the nodes its pending `Send`s go to: a push task's path names
        only its index, and the timeline should name the node."""

    draining: bool = False
    """Set when the worker stops: runs give their lease back at their next step boundary."""

    # -- leases and executions ----------------------------------------------------------------

    def hold(
        self,
        run_id: str,
        token: int,
        worker_id: str,
        *,
        never_ran: bool = False,
        first_claim: bool = False,
        plain_start: bool = False,
        triggers: Mapping[str, Sequence[str]] | None = None,
        thread_id: str | None = None,
    ) -> None:
        """Fence the run's writes under `token`. `never_ran`: the claim found the run never
        started, so nothing of it was ever checkpointed (only a holder of a lease writes one,
        and this is the first lease). `first_claim`: the run's first execution, which may be
        on a thread that has checkpoints of earlier runs (`never_ran` implies it).
        `plain_start`: the graph's START step only maps the
        input onto channels (`graphs.plain_start`). `triggers`: the graph's
        `trigger_to_nodes`, to hold its last checkpoint back for the run's end. `thread_id`:
        the thread the run writes its checkpoints to, when it is not the run's own."""
        self.holders[run_id] = (token, worker_id)
        if thread_id is not None and thread_id != run_id:
            self.threads[thread_id] = run_id
        if triggers:
            self.triggers[(run_id, token)] = triggers
        if never_ran:
            self.unwritten.add((run_id, token))
        if never_ran or first_claim:
            self.first_executions.add((run_id, token))
            if plain_start:
                self.plain_starts.add((run_id, token))

    def alone(self) -> bool:
        """Whether at most one execution of this process holds a lease: nothing of another
        run competes with its transactions for the event loop."""
        return len(self.holders) <= 1

    def drop(self, run_id: str, token: int) -> None:
        """The execution under `token` ended: what it buffered is discarded (its step never
        checkpointed; the run resumes from the last checkpoint, effects from the ledger)."""
        self.buffers.pop((run_id, token), None)
        self.unwritten.discard((run_id, token))
        self.first_executions.discard((run_id, token))
        self.plain_starts.discard((run_id, token))
        self.triggers.pop((run_id, token), None)
        for kept in (self.roots, self.anchors, self.before_commit):
            kept.pop((run_id, token), None)
        # Only our own hold: this process may already run the same run again under a newer token.
        if self.holders.get(run_id, (None,))[0] == token:
            del self.holders[run_id]
            for thread, holder in list(self.threads.items()):
                if holder == run_id:
                    del self.threads[thread]

    def _run_of(self, config: RunnableConfig | None) -> str:
        """The run a checkpoint read or write of `config`'s thread belongs to: the calling
        execution's when it runs on that thread, else the run this process holds on it, else
        the thread itself (a run of its own thread)."""
        thread = str((config or {}).get("configurable", {}).get("thread_id"))
        ctx = _running.get()
        if ctx is not None and ctx.thread == thread:
            return ctx.run_id
        return self.threads.get(thread, thread)

    def _held(self, run_id: str) -> tuple[int, str, RunContext | None]:
        ctx = _running.get()
        # The writing execution's own token when it is known: a stale execution in this process
        # must not borrow the newer token a re-claim of the same run holds.
        if ctx is not None and ctx.run_id == run_id:
            return ctx.token, ctx.worker_id, ctx
        held = self.holders.get(run_id)
        if held is None:
            raise LeaseLost(f"run {run_id}: this process holds no lease for a checkpoint write")
        return held[0], held[1], None

    def _buffer(self, run_id: str, token: int, worker_id: str) -> Buffer:
        return self.buffers.setdefault((run_id, token), Buffer(token, worker_id))
