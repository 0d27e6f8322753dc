"""How much of the communication backward hid: from this rank's timeline spans (the engine
records them when ``GRADWIRE_TIMELINE=FILE`` is set)."""

from . import _runtime

# Spans in which a gradient is being communicated (the engine's phases after negotiation).
_COMM = ("FUSE", "ENCODE", "WIRE", "DECODE", "UNFUSE")


def _union(spans):
    merged = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _measure(intervals):
    return sum(e - s for s, e in intervals)


def _intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_summary():
    """``{"comm_us", "hidden_us", "hidden_share", "backward_us", "steps_overlapped"}``: the
    time this rank spent communicating gradients (the union of the engine's fuse, encode,
    wire, decode and unfuse spans), the part of it inside backward (from the first gradient
    produced to ``step()``), that part's share, the time in backward, and how many backward
    windows saw communication. ``None`` without a timeline."""
    spans = _runtime.runtime().spans()
    if not spans:
        return None
    comm = _union([(s, e) for _, phase, s, e in spans if phase in _COMM])
    back = _union([(s, e) for _, phase, s, e in spans if phase == "BACKWARD"])
    hidden = _intersect(comm, back)
    total = _measure(comm)
    overlapped = sum(1 for w in back if _intersect([w], comm))
    return {
        "comm_us": total,
        "hidden_us": _measure(hidden),
        "hidden_share": (_measure(hidden) / total) if total else 0.0,
        "backward_us": _measure(back),
        "steps_overlapped": overlapped,
    }


__all__ = ["overlap_summary"]
