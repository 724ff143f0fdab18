"""The engine replicas' /metrics in one exposition (the data-parallel router's /metrics): each
replica's samples with a `replica="i"` label added, grouped per metric family as Prometheus' text
format wants (one HELP and one TYPE line a family, then all its samples), the families in the order
they first appear.

A replica's text is read line by line: `# HELP name` and `# TYPE name` open the family `name`, and
the sample lines after them (name{labels} value, or name value) are its own (a histogram's
_bucket / _sum / _count, a counter's _total / _created)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Family:
    comments: list[str] = field(default_factory=list)  # its HELP and TYPE lines, as the first replica gave them
    samples: list[str] = field(default_factory=list)


def merge_replica_metrics(texts: dict[int, str]) -> str:
    """{replica index: its /metrics text} -> one exposition with every sample labelled by replica."""
    families: dict[str, _Family] = {}
    for replica, text in sorted(texts.items()):
        current: _Family | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                current = families.get(name)
                if current is None:
                    current = families[name] = _Family()
                if len(current.comments) < 2 and line not in current.comments:
                    current.comments.append(line)
                continue
            if line.startswith("#") or current is None:
                continue  # another comment, or a sample before any family (not in prometheus_client's output)
            current.samples.append(_with_replica(line, replica))
    out = []
    for family in families.values():
        out += family.comments + family.samples
    return "\n".join(out) + "\n" if out else ""


def _with_replica(sample: str, replica: int) -> str:
    """`name{a="b"} 1.0` -> `name{replica="i",a="b"} 1.0`; `name 1.0` -> `name{replica="i"} 1.0`."""
    label = f'replica="{replica}"'
    brace = sample.find("{")
    space = sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        inner = sample[brace + 1:]
        return f"{sample[:brace]}{{{label}{'' if inner.startswith('}') else ','}{inner}"
    return f"{sample[:space]}{{{label}}}{sample[space:]}"
