"""A fairseq run's manifest against the configuration its ``train.log`` prints.

Each fairseq process logs its whole configuration as it starts (the line
:func:`~finetune_lab.runs.log_timeline.processes` finds it by). The manifest's command, its
recipe (``hyperparameters``), its precision and its phases are held to it: a run relabelled
with another dropout, precision, bag-of-words weight or task-adaptive share, in its command and
recipe alike, stayed valid and changed the pretraining chapter's tables (trial 29's R-11 to
R-14), though the log it hashed says otherwise.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import log_text
from finetune_lab.runs.log_timeline import _parsed

LAUNCH_KEYS = frozenset({"max_update", "reset_dataloader", "stop_time_hours",
                         "finetune_from_model", "user_dir"})
"""What changes from one fairseq process of a long run to the next (a phase's corpus and last
update, a launch's time limit, the weights it starts from, where the project kept its fairseq
plug-ins when it ran): the command holds the last process's, and each phase is held to the
processes of its own (:func:`_phase_problems`)."""
NAMED_ELSEWHERE = frozenset({"tensorboard_logdir"})
"""Options another check holds to the run already: the folder its events went to, to the run's
own experiment and name (:func:`~finetune_lab.runs.log_timeline.timeline_problems`)."""
RECIPE_KEY = {"total_updates": "total_num_update", "epochs": "max_epoch",
              "validate_every": "validate_interval_updates"}
"""Recipe keys that fairseq's configuration names otherwise."""
PRECISION = {"bf16": (True, False), "fp16": (False, True), "fp32": (False, False)}
"""A recipe's precision as fairseq's ``bf16`` and ``fp16`` options."""


def _value(node: ast.AST) -> Any:
    """A literal of the printed configuration: Python literals, an argparse ``Namespace``
    (a model's options) as a dict, and a choice printed bare (``sample_break_mode=none``)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(n) for n in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.Name):
        return float(node.id) if node.id in ("inf", "nan") else node.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "Namespace" and not node.args:
        return {k.arg: _value(k.value) for k in node.keywords if k.arg}
    raise ValueError(f"not a printed value: {type(node).__name__}")


@functools.lru_cache(maxsize=1024)
def printed_config(message: str) -> dict[str, Any] | None:
    """Every option of one configuration line, by name (a model's ``Namespace`` holds the
    command line's; the groups add the rest); None when the line is no configuration."""
    try:
        tree = _value(ast.parse(message, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, dict):
        return None
    found = dict(tree["model"]) if isinstance(tree.get("model"), dict) else {}
    for group in tree.values():
        for key, value in (group.items() if isinstance(group, dict) else ()):
            found.setdefault(key, value)
    return found or None


def _same(given: Any, printed: Any) -> bool:
    """A value as the manifest gives it (a command-line word, a recipe value) and as fairseq
    printed it (a learning rate as a one-item list, betas as the text typed)."""
    if isinstance(printed, list) and len(printed) == 1:
        printed = printed[0]
    if isinstance(given, bool) or isinstance(printed, bool):
        return given == printed
    if isinstance(given, list):
        given = ",".join(map(str, given))
    try:  # a number, or one printed as text (a Namespace's ``total_num_update='1125'``)
        return math.isclose(float(given), float(printed), rel_tol=1e-9)
    except (TypeError, ValueError):
        if isinstance(printed, (int, float)):
            return False
    if isinstance(printed, list):
        printed = ",".join(map(str, printed))
    words = str(given).replace(" ", "").strip("()[]")
    return words == str(printed).replace(" ", "").strip("()[]")


def _tail(path: Any) -> list[str]:
    return str(path).replace("\\", "/").rstrip("/").split("/")[-2:]


def _command_problems(command: Sequence[str], config: dict[str, Any], at: str,
                      last: bool) -> list[str]:
    """Each option the command gives (a flag alone: on) as the process printed it; a path
    only by its last two parts, as the project's place differs between machines."""
    problems = []
    words = list(command)
    start = next((i + 1 for i, w in enumerate(words) if w == "fairseq_cli.train"), None)
    if last and start is not None and start < len(words) and not words[start].startswith("--") \
            and "data" in config and _tail(words[start]) != _tail(config["data"]):
        problems.append(f"its command trains on {words[start]}, but {at} trained on "
                        f"…/{'/'.join(_tail(config['data']))}")
    for i, word in enumerate(words):
        key = word[2:].replace("-", "_")
        if not word.startswith("--") or key not in config or key in NAMED_ELSEWHERE \
                or (not last and key in LAUNCH_KEYS):
            continue
        values = []
        for value in words[i + 1:]:
            if value.startswith("--"):
                break
            values.append(value)
        if not values:
            ok = config[key] is True
        elif len(values) == 1 and "/" in values[0]:
            ok = _tail(values[0]) == _tail(config[key])
        else:
            ok = _same(values if len(values) > 1 else values[0], config[key])
        if not ok:
            problems.append(f"its command gives {word} {' '.join(values)}".rstrip()
                            + f", but {at} was configured with {key}={config[key]!r}")
    return problems


def _recipe_problems(hp: dict[str, Any], config: dict[str, Any], at: str) -> list[str]:
    """Each recipe value fairseq also prints; a batch given in tokens (``--max-tokens``) is
    that many tokens, and the precision is fairseq's ``bf16`` and ``fp16``."""
    problems = []
    for key, value in sorted(hp.items()):
        name = RECIPE_KEY.get(key, key)
        if value is None or isinstance(value, dict) or name not in config:
            continue
        if key == "batch_size" and config.get("max_tokens") and isinstance(value, int) \
                and isinstance(hp.get("tokens_per_sample"), int):
            name, value = "max_tokens", value * hp["tokens_per_sample"]
        if not _same(value, config[name]):
            problems.append(f"hyperparameters.{key} {value!r}, but {at} was configured with "
                            f"{name}={config[name]!r}")
    bow, criterion = hp.get("bow_weight"), str(config.get("criterion"))
    if isinstance(bow, (int, float)) and (bow > 0) != criterion.endswith("_bow"):  # 29b's F8
        problems.append(f"hyperparameters.bow_weight {bow}, but {at} trained with the "
                        f"criterion {criterion}")
    if "precision" in hp and hp["precision"] not in PRECISION:  # check 29b's F10
        problems.append(f"hyperparameters.precision {hp['precision']!r} is none of "
                        f"{', '.join(PRECISION)}")
    want = PRECISION.get(hp.get("precision"))
    got = (config.get("bf16") is True, config.get("fp16") is True)
    if want is not None and got != want:
        printed = {v: k for k, v in PRECISION.items()}[got] if got in PRECISION.values() else got
        problems.append(f"hyperparameters.precision {hp['precision']}, but {at} was "
                        f"configured for {printed}")
    return problems


def _phase_problems(man: dict[str, Any], configs: Sequence[tuple[str, dict[str, Any]]]
                    ) -> list[str]:
    """A long run's phases (``hyperparameters.phases``, its corpora ``inputs.data`` in the same
    order) against its processes: one after another, each phase's processes trained on its
    corpus up to its last update; and the task-adaptive share against the phases."""
    hp = man.get("hyperparameters") or {}
    phases, data = hp.get("phases"), (man.get("inputs") or {}).get("data")
    if not isinstance(phases, list) or not isinstance(data, list) or not phases:
        return []
    ran: list[tuple[list[str], Any]] = []
    for _at, config in configs:
        step = (_tail(config.get("data")), config.get("max_update"))
        if not ran or ran[-1] != step:
            ran.append(step)
    told = [(_tail(d.get("path")) if isinstance(d, dict) else None,
             p.get("until_update") if isinstance(p, dict) else None)
            for d, p in zip(data, phases)]
    if len(data) != len(phases) or ran != told:
        return [f"hyperparameters.phases {[p.get('until_update') for p in phases if isinstance(p, dict)]} "
                f"on {['/'.join(t[0] or []) for t in told]}, but its train.log's processes "
                f"trained to {[u for _d, u in ran]} on {['/'.join(d) for d, _u in ran]}"]
    names = [p.get("name") for p in phases]
    for name, (folder, _until) in zip(names, told):  # trial 30's R-2: names swapped
        kind = next((k for k in ("tapt", "dapt") if folder and k in folder[0]), "general")
        if name != kind:
            return [f"hyperparameters.phases names {name!r} the phase that trained on "
                    f"…/{'/'.join(folder or [])}, a {kind} corpus"]
    share, total = hp.get("tapt_fraction"), hp.get("max_update")
    if isinstance(share, (int, float)) and isinstance(total, int) and total > 0:
        if len(phases) == 2:
            fits = phases[0].get("until_update") == max(1, round(total * (1 - share)))
        elif len(phases) == 1:  # all task-adaptive, or none (check 29b's F9: 0.3 of one)
            fits = share == (1 if names == ["tapt"] else 0)
        else:
            fits = share != 1
        if not fits:
            return [f"hyperparameters.tapt_fraction {share} does not give its phases "
                    f"{[(p.get('name'), p.get('until_update')) for p in phases]} of "
                    f"{total} updates"]
    return []


def config_problems(path: Path, man: dict[str, Any]) -> list[str]:
    """A fairseq run's command, recipe and phases against each configuration its hashed
    ``train.log`` prints (a configuration line that cannot be read is itself a reason)."""
    if man.get("framework") != "fairseq" or "train.log" not in (man.get("logs") or {}):
        return []
    try:
        text = log_text(path / "train.log")
    except OSError:
        return []  # the log's own check names it (missing, changed)
    lines, procs, _why = _parsed(text)
    configs = []
    for proc in procs:
        at = f"its train.log's fairseq process of {lines[proc.first][0]}"
        config = printed_config(lines[proc.config][3])
        if config is None:
            return [f"{at} printed a configuration that cannot be read"]
        configs.append((at, config))
    if not configs:
        return []
    command = [str(w) for w in man.get("command") or []]
    hp = man.get("hyperparameters") if isinstance(man.get("hyperparameters"), dict) else {}
    for i, (at, config) in enumerate(configs):
        last = i == len(configs) - 1  # an earlier process: the launch-varying values aside
        recipe = hp if last else {k: v for k, v in hp.items() if k not in LAUNCH_KEYS}
        problems = _command_problems(command, config, at, last) \
            + _recipe_problems(recipe, config, at)
        if problems:
            return problems
    return _budget_problems(hp, *configs[-1]) or _phase_problems(man, configs)


def _budget_problems(hp: dict[str, Any], at: str, config: dict[str, Any]) -> list[str]:
    """A token budget against the updates its last process was given, and a time budget
    (``budget_minutes``) against its stop time (trial 30's R-10: 8 minutes shown as 12)."""
    tokens, per, last = (hp.get(k) for k in ("budget_tokens", "tokens_per_update", "max_update"))
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tokens, per, last)) \
            and math.ceil(tokens / per) != last:  # check 30b's 30b-5: 12 M tokens shown as 24 M
        return [f"hyperparameters.budget_tokens {tokens:,} is not the {last:,} updates of "
                f"{per:,} tokens that {at} was configured to train"]
    budget = hp.get("budget_minutes")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool):
        return []
    hours = config.get("stop_time_hours")
    if not isinstance(hours, (int, float)) or abs(budget - 60 * hours) > 0.01:
        return [f"hyperparameters.budget_minutes {budget:g}, but {at} was configured with "
                f"stop_time_hours={hours!r}"]
    return []
