"""The order in which Triton ranks a row of classification scores.

Triton sorts the indices of a row with libstdc++'s `std::sort` and the comparison "score of a >
score of b", then keeps the first k. `std::sort` is not stable, so among equal scores (and around
NaN, which compares false with everything) the order is whatever its introsort leaves. Clients
see that order, so it is reproduced here: numpy when the first k are unambiguous (distinct scores,
no NaN), else the same algorithm step by step (GCC's `__introsort_loop`, median-of-three pivot,
unguarded partition, heap sort past the depth limit, final insertion sort).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["top_k"]

# libstdc++'s _S_threshold: ranges up to this size are left to the final insertion sort.
_THRESHOLD = 16


def top_k(row: np.ndarray, k: int) -> list[int]:
    """The indices of the `k` (at most the row's length) highest scores of a flat numeric row,
    in the order Triton lists them."""
    n = row.size
    k = min(k, n)
    if k == 0:
        return []
    if not _ambiguous(row, k):
        # Descending, equal scores by index (the order insertion sort leaves them in): a stable
        # ascending sort of the reversed row, read backwards.
        ascending = np.argsort(row[::-1], kind="stable")
        return (n - 1 - ascending[::-1][:k]).tolist()
    return sort_indices_descending(row.tolist())[:k]


def _ambiguous(row: np.ndarray, k: int) -> bool:
    """Whether the first k of the ranking depend on how the sort treats equal scores or NaN."""
    if row.dtype.kind == "f" and np.isnan(row).any():
        return True
    if row.size <= _THRESHOLD:
        return False  # std::sort is then one insertion sort, which is stable: so is numpy's
    threshold = np.partition(row, row.size - k)[row.size - k]
    top = row[row >= threshold]
    # Unambiguous when exactly k scores reach the k-th highest and they are all different.
    return top.size != k or np.unique(top).size != k


def sort_indices_descending(values: list[Any]) -> list[int]:
    """`std::sort(idx.begin(), idx.end(), [&](a, b) { return values[a] > values[b]; })` over
    `idx` = 0..n-1, as libstdc++ (GCC 4.x to 14) does it."""
    order = list(range(len(values)))
    n = len(order)
    if n > 1:
        _introsort_loop(order, 0, n, 2 * (n.bit_length() - 1), values)
        _final_insertion_sort(order, 0, n, values)
    return order


def _introsort_loop(order: list[int], first: int, last: int, depth: int, v: list[Any]) -> None:
    while last - first > _THRESHOLD:
        if depth == 0:
            _heap_sort(order, first, last, v)
            return
        depth -= 1
        cut = _partition_pivot(order, first, last, v)
        _introsort_loop(order, cut, last, depth, v)
        last = cut


def _partition_pivot(order: list[int], first: int, last: int, v: list[Any]) -> int:
    mid = first + (last - first) // 2
    _move_median_to_first(order, first, first + 1, mid, last - 1, v)
    return _unguarded_partition(order, first + 1, last, first, v)


def _move_median_to_first(order: list[int], result: int, a: int, b: int, c: int, v: list[Any]):
    va, vb, vc = v[order[a]], v[order[b]], v[order[c]]
    if va > vb:
        if vb > vc:
            pick = b
        elif va > vc:
            pick = c
        else:
            pick = a
    elif va > vc:
        pick = a
    elif vb > vc:
        pick = c
    else:
        pick = b
    order[result], order[pick] = order[pick], order[result]


def _unguarded_partition(order: list[int], first: int, last: int, pivot: int, v: list[Any]) -> int:
    pivot_value = v[order[pivot]]
    while True:
        while v[order[first]] > pivot_value:
            first += 1
        last -= 1
        while pivot_value > v[order[last]]:
            last -= 1
        if not first < last:
            return first
        order[first], order[last] = order[last], order[first]
        first += 1


def _final_insertion_sort(order: list[int], first: int, last: int, v: list[Any]) -> None:
    if last - first > _THRESHOLD:
        _insertion_sort(order, first, first + _THRESHOLD, v)
        for i in range(first + _THRESHOLD, last):
            _unguarded_linear_insert(order, i, v)
    else:
        _insertion_sort(order, first, last, v)


def _insertion_sort(order: list[int], first: int, last: int, v: list[Any]) -> None:
    for i in range(first + 1, last):
        if v[order[i]] > v[order[first]]:
            moved = order[i]
            order[first + 1 : i + 1] = order[first:i]
            order[first] = moved
        else:
            _unguarded_linear_insert(order, i, v)


def _unguarded_linear_insert(order: list[int], last: int, v: list[Any]) -> None:
    moved = order[last]
    value = v[moved]
    previous = last - 1
    while value > v[order[previous]]:
        order[last] = order[previous]
        last = previous
        previous -= 1
    order[last] = moved


def _heap_sort(order: list[int], first: int, last: int, v: list[Any]) -> None:
    """`std::__partial_sort(first, last, last)`: make_heap, then sort_heap."""
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(order, first, parent, length, order[first + parent], v)
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        moved = order[last]
        order[last] = order[first]
        _adjust_heap(order, first, 0, last - first, moved, v)


def _adjust_heap(
    order: list[int], first: int, hole: int, length: int, moved: int, v: list[Any]
) -> None:
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if v[order[first + child]] > v[order[first + child - 1]]:
            child -= 1
        order[first + hole] = order[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        order[first + hole] = order[first + child - 1]
        hole = child - 1
    # __push_heap
    parent = (hole - 1) // 2
    value = v[moved]
    while hole > top and v[order[first + parent]] > value:
        order[first + hole] = order[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    order[first + hole] = moved
