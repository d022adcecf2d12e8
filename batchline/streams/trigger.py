"""Which tasks a batch's barrier must be sent to once some tasks have finished: the graph's
current "roots" (SPEC G4, after Flink FLIP-147, Appendix 1).

A barrier normally enters at the sources and flows downstream with the data. Once some tasks
have finished, that no longer reaches everyone: in ``A -> C <- B`` with ``A`` finished,
a barrier sent to ``B`` alone never tells ``C`` about ``A``'s side, and if ``C`` is a
two-phase-commit sink waiting for a completed checkpoint before it may finish, the job
deadlocks. So the barrier goes to every task that is still running and has no running
predecessor task: those are the roots of what is left of the graph.

The graph is given at the vertex level (an operator and its parallelism); its tasks are the
``(vertex_id, partition)`` pairs. An edge is ``ALL_TO_ALL`` (a shuffle) or ``POINTWISE`` (see
:func:`pointwise_downstream`). Checking every task against every predecessor task is
quadratic (an ``ALL_TO_ALL`` edge has ``m * n`` task pairs); :func:`tasks_to_trigger` instead
walks the vertices once in topological order and lets each vertex narrow the candidates of
its children, as in the appendix's second pseudo-code, in time linear in the vertices, the
edges and the tasks (see its docstring for the exact bound).

"Predecessor" means a direct upstream task. When tasks finish only after all their inputs
ended (the usual case) a task with no running direct predecessor has no running ancestor
either, so the two readings agree; with an arbitrary ``finished`` map this module keeps to
the direct one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from batchline.errors import ConfigurationError

__all__ = [
    "EdgeKind",
    "TriggerVertex",
    "pointwise_downstream",
    "pointwise_upstream",
    "tasks_to_trigger",
]


class EdgeKind(enum.Enum):
    """How the partitions of two connected vertices are wired."""

    ALL_TO_ALL = "all_to_all"
    """A shuffle: every upstream partition feeds every downstream one."""
    POINTWISE = "pointwise"
    """Per partition: each downstream partition reads a range of upstream ones (or the reverse)."""


@dataclass(frozen=True)
class TriggerVertex:
    """One vertex of the graph: an operator with ``parallelism`` tasks (partitions ``0..n-1``)."""

    vertex_id: int
    parallelism: int
    """Number of tasks, at least 1."""
    inputs: tuple[tuple[int, EdgeKind], ...] = ()
    """``(upstream vertex_id, edge kind)`` per input edge; every upstream comes earlier in the list."""


def pointwise_downstream(i: int, m: int, n: int) -> range:
    """The downstream partitions fed by upstream partition ``i`` of a POINTWISE edge from ``m``
    upstream to ``n`` downstream partitions.

    ``m <= n``: upstream ``i`` feeds ``[i*n//m, (i+1)*n//m)``. ``m > n``: downstream ``j`` reads
    ``[j*m//n, (j+1)*m//n)``, so ``i`` feeds the single ``j`` whose range holds it,
    ``((i+1)*n - 1) // m``. Either way the ranges partition the other side, so every partition
    on each side has at least one partner.
    """
    if m <= n:
        return range(i * n // m, (i + 1) * n // m)
    j = ((i + 1) * n - 1) // m
    return range(j, j + 1)


def pointwise_upstream(j: int, m: int, n: int) -> range:
    """The upstream partitions read by downstream partition ``j`` of a POINTWISE edge from ``m``
    upstream to ``n`` downstream partitions: the inverse of :func:`pointwise_downstream`.

    ``m >= n``: ``[j*m//n, (j+1)*m//n)``. ``m < n``: the single ``i`` with
    ``i*n//m <= j < (i+1)*n//m``, which is ``((j+1)*m - 1) // n``.
    """
    if m >= n:
        return range(j * m // n, (j + 1) * m // n)
    i = ((j + 1) * m - 1) // n
    return range(i, i + 1)


def tasks_to_trigger(
    vertices: Sequence[TriggerVertex],
    finished: Mapping[int, AbstractSet[int]],
    work: list[int] | None = None,
) -> list[tuple[int, int]]:
    """``(vertex_id, partition)`` pairs still running whose every predecessor task has finished,
    in the order of ``vertices`` and then of partitions.

    ``vertices`` must be in topological order (each input names a vertex listed earlier).
    ``finished[vertex_id]`` holds that vertex's finished partitions; a missing key means none.
    A running source task is always a root. ``work``, when given (``[0]``), is incremented by
    one for every vertex visited, edge examined and partition examined, so tests can check the
    cost without timing it.

    Steps (the appendix's second pseudo-code, corrected; see the comments):

    1. Index the vertices, check the graph and count each vertex's finished tasks.
    2. Every vertex starts with all its tasks as candidates.
    3. Visit the vertices in topological order. A vertex's running candidates are roots.
    4. A vertex that is not fully finished then narrows each child's candidates: to nothing
       over an ``ALL_TO_ALL`` edge, or when it has no finished task at all (the fast check:
       every POINTWISE child task reads at least one upstream task); otherwise, over a
       POINTWISE edge, it removes the child tasks reading one of its running tasks.

    Cost: ``O(V + E + tasks + sum of min(running(U), n(V)))`` over the POINTWISE edges
    ``U -> V`` whose upstream is partly finished; each such edge costs the smaller of pushing
    its running tasks down or pulling its child's tasks up. That sum is at most the number of
    task-level POINTWISE edges, and at most ``d * tasks`` when no vertex has more than ``d``
    POINTWISE inputs (or no vertex more than ``d`` POINTWISE outputs), so it is linear in the
    graph for bounded degree. ``ALL_TO_ALL`` edges always cost O(1), never ``m * n``. A graph
    where everything runs costs ``O(V + E)`` plus the source tasks it returns.

    Raises :class:`~batchline.errors.ConfigurationError` (a ``ValueError``) for a parallelism
    below 1, a repeated vertex id, an input naming a vertex not listed before it, or a
    ``finished`` entry naming an unknown vertex or a partition out of range.
    """
    count = 0

    # Step 1: positions, children lists and finished counts.
    position: dict[int, int] = {}
    parallelism: list[int] = []
    children: list[list[tuple[int, EdgeKind]]] = []
    for vertex in vertices:
        count += 1
        if vertex.parallelism < 1:
            raise ConfigurationError(
                f"vertex {vertex.vertex_id} has parallelism {vertex.parallelism}; give every vertex at least 1 task."
            )
        if vertex.vertex_id in position:
            raise ConfigurationError(
                f"vertex id {vertex.vertex_id} appears twice; give every vertex a unique id."
            )
        here = len(parallelism)
        for upstream_id, kind in vertex.inputs:
            count += 1
            upstream = position.get(upstream_id)
            if upstream is None:
                raise ConfigurationError(
                    f"vertex {vertex.vertex_id} reads vertex {upstream_id}, which is not listed before it; "
                    "list the vertices in topological order (parents before children) and check the input ids."
                )
            children[upstream].append((here, kind))
        position[vertex.vertex_id] = here
        parallelism.append(vertex.parallelism)
        children.append([])

    finished_sets: list[AbstractSet[int]] = [frozenset()] * len(parallelism)
    finished_count = [0] * len(parallelism)
    for vertex_id, parts in finished.items():
        count += 1
        where = position.get(vertex_id)
        if where is None:
            raise ConfigurationError(
                f"finished names vertex {vertex_id}, which is not in the graph; pass only the graph's vertex ids."
            )
        n = parallelism[where]
        for part in parts:
            count += 1
            if not 0 <= part < n:
                raise ConfigurationError(
                    f"finished names partition {part} of vertex {vertex_id}, which has partitions 0..{n - 1}; "
                    "pass only existing partitions."
                )
        finished_sets[where] = parts
        finished_count[where] = len(parts)

    # Step 2: "tasks_to_check" per vertex, held as two marks instead of sets: `emptied` says no
    # task is left, and `blocked` (allocated only when first needed) is a difference array over
    # the partitions, so removing a range of tasks costs O(1) whatever its length.
    #
    # The appendix says a vertex's tasks to check are the *union* of what each parent allows.
    # It must be the *intersection*: a task may be triggered only if, for EVERY input edge, all
    # its predecessors over that edge have finished; one running predecessor on any edge will
    # send it the barrier. (With "initialise to all tasks, then union" nothing would ever be
    # narrowed.) Removing tasks from one shared candidate set, edge after edge, is that
    # intersection.
    emptied = [False] * len(parallelism)
    blocked: list[list[int] | None] = [None] * len(parallelism)

    triggered: list[tuple[int, int]] = []
    # Step 3: topological order, as given.
    for here, vertex in enumerate(vertices):
        count += 1
        n = parallelism[here]
        done = finished_sets[here]
        done_count = finished_count[here]
        if done_count == n:
            continue  # fully finished: nothing to trigger, and it blocks none of its children
        running: list[int] | None = None
        if not emptied[here]:
            # The appendix splits only the tasks to check into running and finished, then
            # tests "finished < all_tasks" and narrows children by "running tasks of V" on that
            # split. Both must use ALL of V's tasks: a running task that is not a candidate
            # (it has a running predecessor itself) still blocks its children, and with an
            # arbitrary finished map a finished task need not be a candidate either.
            count += n
            running = [part for part in range(n) if part not in done]
            diff = blocked[here]
            if diff is None:
                triggered.extend((vertex.vertex_id, part) for part in running)
            else:
                count += n
                depth = 0
                for part in range(n):
                    depth += diff[part]
                    if depth == 0 and part not in done:
                        triggered.append((vertex.vertex_id, part))

        # Step 4: narrow the children's candidates.
        prefix: list[int] | None = None
        for child, kind in children[here]:
            count += 1
            child_n = parallelism[child]
            if emptied[child] or finished_count[child] == child_n:
                continue  # no candidate left there, or no task to trigger there
            if kind is EdgeKind.ALL_TO_ALL or done_count == 0:
                emptied[child] = True
                continue
            diff = blocked[child]
            if diff is None:
                count += child_n + 1
                diff = blocked[child] = [0] * (child_n + 1)
            if running is None:
                count += n
                running = [part for part in range(n) if part not in done]
            # The appendix keeps "tasks connected from running tasks of V"; those are exactly
            # the ones to REMOVE. A child task stays a candidate only if every upstream task it
            # reads over this edge has finished.
            if len(running) <= child_n:
                # Push: each running task removes the child tasks it feeds (one range).
                count += len(running)
                for part in running:
                    fed = pointwise_downstream(part, n, child_n)
                    diff[fed.start] += 1
                    diff[fed.stop] -= 1
            else:
                # Pull: each child task looks up its upstream range in a prefix count.
                if prefix is None:
                    count += n
                    prefix = [0] * (n + 1)
                    for part in range(n):
                        prefix[part + 1] = prefix[part] + (part not in done)
                count += child_n
                for part in range(child_n):
                    read = pointwise_upstream(part, n, child_n)
                    if prefix[read.stop] > prefix[read.start]:
                        diff[part] += 1
                        diff[part + 1] -= 1

    if work is not None:
        work[0] += count
    return triggered
