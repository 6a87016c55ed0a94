"""Exact prefix reuse: a radix tree over token ids whose nodes may hold a state snapshot.

A snapshot at depth L is the complete per-slot state (attention KV rows [0, L), GDN recurrent +
conv state) after the first L tokens of the path, plus the logits row of token L-1, so a request
whose prompt starts with (or equals) the path restores it and prefills only the rest (nothing when
it is equal: the first token is sampled from the stored logits). Snapshots are taken by the
scheduler at prefill-chunk boundaries (every `interval` tokens), at the end of every prompt and at
the end of every generation (prompt + generated tokens but the last, which was never fed).

Memory is bounded: `device_bytes` for snapshots on the engine's device, least recently used first
out; an evicted snapshot moves to host memory while `host_bytes` allows (spill), else it is
dropped. A restored host snapshot is copied back by the restore itself. `on_drop(snapshot)` hears
of every snapshot the cache lets go (a --tp plan's other ranks then free their part of it). Only
the engine thread touches the cache (no locks); the counters are read by the metrics endpoint.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class _Node:
    __slots__ = ("edge", "children", "parent", "snap", "depth", "tier")

    def __init__(self, edge: tuple[int, ...], parent: "_Node | None", depth: int):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.snap: Any = None
        self.depth = depth
        self.tier = ""  # "device" | "host" while snap is set


class PrefixCache:
    def __init__(self, device_bytes: int, host_bytes: int = 0, *, to_host=None, on_drop=None):
        self.device_budget = max(0, int(device_bytes))
        self.host_budget = max(0, int(host_bytes))
        self._to_host = to_host  # snapshot -> host copy (None: no spilling)
        self._on_drop = on_drop  # snapshot -> None, for every snapshot let go (None: nothing to tell)
        self.root = _Node((), None, 0)
        self._lru: "OrderedDict[int, _Node]" = OrderedDict()  # id(node) -> node, oldest first
        self.device_used = 0
        self.host_used = 0
        self.lookups = 0
        self.hits = 0
        self.hit_tokens = 0
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.device_budget > 0

    @property
    def snapshots(self) -> int:
        return len(self._lru)

    # ------------------------------------------------------------------ lookup
    def lookup(self, tokens: list[int]) -> tuple[int, Any]:
        """(L, snapshot) for the deepest snapshot whose path is a prefix of `tokens` (L <= len);
        (0, None) when none."""
        self.lookups += 1
        node, i, best = self.root, 0, None
        n = len(tokens)
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                break
            e = child.edge
            if tuple(tokens[i:i + len(e)]) != e:
                break  # diverges inside the edge: no node (so no snapshot) there
            node, i = child, i + len(e)
            if node.snap is not None:
                best = node
        if best is None:
            return 0, None
        self._lru.move_to_end(id(best))
        self.hits += 1
        self.hit_tokens += best.depth
        return best.depth, best.snap

    def contains(self, tokens: list[int]) -> bool:
        node = self._find(tokens)
        return node is not None and node.snap is not None

    def _find(self, tokens: list[int]) -> _Node | None:
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None or tuple(tokens[i:i + len(child.edge)]) != child.edge:
                return None
            node, i = child, i + len(child.edge)
        return node if i == len(tokens) else None

    # ------------------------------------------------------------------ insert
    def insert(self, tokens: list[int], make_snapshot) -> bool:
        """Store the snapshot of `tokens` (`make_snapshot()` is called only when the path has none
        yet and it fits the budget). Returns whether a new snapshot was stored."""
        if not self.enabled or not tokens:
            return False
        node = self._node_for(list(tokens))
        if node.snap is not None:
            self._lru.move_to_end(id(node))
            return False
        snap = make_snapshot()
        if snap.nbytes > self.device_budget:
            if self._on_drop is not None:
                self._on_drop(snap)
            self._prune(node)
            return False
        node.snap, node.tier = snap, "device"
        self._lru[id(node)] = node
        self.device_used += snap.nbytes
        self._evict(keep=node)
        return True

    def _node_for(self, tokens: list[int]) -> _Node:
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = _Node(tuple(tokens[i:]), node, len(tokens))
                node.children[tokens[i]] = new
                return new
            e = child.edge
            k = 0
            while k < len(e) and i + k < len(tokens) and e[k] == tokens[i + k]:
                k += 1
            if k < len(e):  # split the edge at k
                mid = _Node(e[:k], node, node.depth + k)
                node.children[tokens[i]] = mid
                child.edge = e[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            node, i = child, i + k
        return node

    # ------------------------------------------------------------------ eviction
    def _evict(self, keep: _Node | None = None) -> None:
        while self.device_used > self.device_budget:
            victim = next((n for n in self._lru.values() if n.tier == "device" and n is not keep), None)
            if victim is None:
                break
            snap = victim.snap
            self.device_used -= snap.nbytes
            self.evictions += 1
            if self._to_host is not None and snap.nbytes <= self.host_budget:
                while self.host_used + snap.nbytes > self.host_budget:
                    old = next(n for n in self._lru.values() if n.tier == "host")
                    self._drop(old)
                victim.snap, victim.tier = self._to_host(snap), "host"
                self.host_used += snap.nbytes
            else:
                self._drop(victim)

    def _drop(self, node: _Node) -> None:
        if node.tier == "host":
            self.host_used -= node.snap.nbytes
        self._lru.pop(id(node), None)
        if self._on_drop is not None:
            self._on_drop(node.snap)
        node.snap, node.tier = None, ""
        self._prune(node)

    def _prune(self, node: _Node) -> None:
        """Remove snapshot-less leaves upwards (and fold a snapshot-less single child into its parent edge)."""
        while node is not self.root and node.snap is None and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        if node is not self.root and node.snap is None and len(node.children) == 1:
            (child,) = node.children.values()
            parent = node.parent
            child.edge = node.edge + child.edge
            child.parent = parent
            parent.children[node.edge[0]] = child

    def clear(self) -> None:
        for n in list(self._lru.values()):
            self._drop(n)

    def stats(self) -> dict[str, int]:
        return {"snapshots": self.snapshots, "device_bytes": self.device_used, "host_bytes": self.host_used,
                "lookups": self.lookups, "hits": self.hits, "hit_tokens": self.hit_tokens,
                "evictions": self.evictions}
