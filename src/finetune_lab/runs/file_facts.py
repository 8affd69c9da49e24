"""What a run's hashed files record of where and as what it ran, held against its manifest.

A manifest's ``environment.hostname`` and ``seed`` are its own say-so: fault trial 28 renamed a
CPU run's host (or emptied it) with its torch, and the run escaped every check made against the
runs beside it on its machine (M-m2); a Transformers run relabelled as another seed in folder,
manifest and command was valid (M-m1). The files hashed when the run ended record both: every
event file's name holds the host that wrote it (``events.out.tfevents.<time>.<host>.<pid>.<n>``,
``socket.gethostname()``; no train.log names a host), and the Trainer's event file its
arguments, seed included.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import trainer_seeds

EVENT_NAME = re.compile(r"events\.out\.tfevents\.(?P<time>\d+)\.(?P<host>.+)\.(?P<pid>\d+)\."
                        r"(?P<n>\d+)(?:\.v2)?")
"""torch's (and TensorFlow 2's) event-file name; a host may hold dots, the pid and count not."""


def event_hosts(events: Sequence[Path]) -> tuple[str, ...]:
    """The hosts that wrote the last of ``events`` (the newest by the time in their names: a
    continued run's manifest records its last launch's environment), sorted; empty when no
    name holds a host."""
    named = [(int(m["time"]), m["host"]) for f in events
             if (m := EVENT_NAME.fullmatch(f.name)) is not None]
    last = max((t for t, _ in named), default=None)
    return tuple(sorted({h for t, h in named if t == last}))


def event_host(events: Sequence[Path]) -> str | None:
    """The one host that wrote the last of ``events``; None when none or several did."""
    hosts = event_hosts(events)
    return hosts[0] if len(hosts) == 1 else None


def host_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """``environment.hostname`` against the host its event files were written on (CPU and GPU
    runs alike: the device calls' records hold no hostname). Every committed run, of every
    experiment, records the host its event files name; a run whose files name none is left to
    :func:`~finetune_lab.runs.crosscheck.machine_problems`, which refuses it on a CPU."""
    hosts = event_hosts(events)
    env = man.get("environment")
    claimed = env.get("hostname") if isinstance(env, dict) else None
    if not hosts or claimed in hosts:
        return []
    return [f"environment.hostname {claimed!r}, but its event files were written on "
            f"{' and '.join(hosts)}: a run's host is the one its files name"]


def seed_record_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """``seed`` against the seed the Trainer's arguments, written into its event file, hold
    (a Transformers or LoRA run; fairseq's seed is held to its train.log elsewhere)."""
    seeds = trainer_seeds(events)
    if not seeds or seeds == {man.get("seed")}:
        return []
    return [f"seed {man.get('seed')!r}, but the Trainer that wrote its event file ran with seed "
            f"{', '.join(map(str, sorted(seeds)))}: the run was relabelled"]


def file_fact_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """Both checks above."""
    return host_problems(man, events) + seed_record_problems(man, events)
