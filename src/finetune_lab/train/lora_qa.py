"""``finetune-lab lora-qa``: the lab's QLoRA fine-tune of a causal LM on the e-commerce FAQ.

The lab's recipe (Task 7): BLOOM-560m loaded in 4-bit NF4, LoRA on ``query_key_value``
(:mod:`finetune_lab.models.lora_configs`), the FAQ in the ``<human>``/``<assistant>`` format
(:mod:`finetune_lab.data.qa_prompts`, with an EOS added), batch 1 with 4 accumulation steps,
80 updates at 2e-4 with paged 8-bit AdamW, a cosine schedule with 5 % warm-up, the loss logged
every update. Generations for a few FAQ questions are made before and after training.

It is meant for users who have BLOOM-560m's weights and a GPU. Without CUDA, or without
bitsandbytes, it still runs, and says what it changed: 4-bit loading is off unless
``--force-4bit`` (bitsandbytes quantises on CPU too, slowly), paged 8-bit AdamW becomes
``adamw_torch``, bf16 mixed precision becomes fp32. Every such change is a *fallback* recorded
in the run's manifest (``extra.fallbacks``) and in its hyperparameters, so a CPU run can never
pass for the lab's. :func:`finetune_lab.models.bloom.make_tiny_bloom` writes a tiny random BLOOM
with an offline tokenizer, which is how CI tests the whole command on CPU. What the chapter shows
of the runs is :mod:`finetune_lab.book.lora_qa_report`.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from finetune_lab.argtypes import folder, run_name, seed_arg
from finetune_lab._files import read_json, write_json_atomic
from finetune_lab.data.qa_prompts import (
    CausalLMCollator,
    encode_faq,
    faq_path,
    format_prompt,
    load_faq,
)
from finetune_lab.errors import UserError
from finetune_lab.models.bloom import RANDOM_INIT_FLAG
from finetune_lab.models.four_bit import bitsandbytes_available, keep_cpu_4bit_trainable
from finetune_lab.models.lora_configs import LAB_BNB, LAB_LORA, bnb_config, lora_config
from finetune_lab.runs.recording import record_run

EXPERIMENT = "lora-qa"
FRAMEWORK = "transformers"
GENERATIONS_FILE = "generations.json"


@dataclass(frozen=True)
class QATrainingArgs:
    """The lab's ``TrainingArguments`` for the FAQ fine-tune."""

    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 4
    max_steps: int = 80
    learning_rate: float = 2e-4
    optim: str = "paged_adamw_8bit"
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.05
    logging_steps: int = 1
    max_length: int = 512  # longest FAQ example is < 300 bytes: nothing is truncated


@dataclass(frozen=True)
class GenerationArgs:
    """The lab's sampling settings for the before/after answers."""

    max_new_tokens: int = 200
    do_sample: bool = True
    temperature: float = 0.7
    top_p: float = 0.7


LAB_QA_ARGS = QATrainingArgs()
LAB_GENERATION = GenerationArgs()
DEFAULT_QUESTIONS = 3
"""Generations are made for the first this-many FAQ questions."""


# --- what this machine can do --------------------------------------------------------------

@dataclass
class Plan:
    """What the run will really use, and each way that differs from the lab's recipe."""

    use_4bit: bool
    optim: str
    mixed_precision: str  # "bf16" or "no"
    device: str
    fallbacks: list[str] = field(default_factory=list)


def plan_run(*, no_4bit: bool = False, force_4bit: bool = False,
             cuda: bool | None = None, bnb: bool | None = None,
             bf16_ok: bool | None = None) -> Plan:
    """Decide quantisation, optimizer and precision from the flags and the machine."""
    import torch

    if no_4bit and force_4bit:
        raise UserError("--no-4bit and --force-4bit contradict each other; pass one of them")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    bnb = bitsandbytes_available() if bnb is None else bnb
    if bf16_ok is None:
        bf16_ok = bool(cuda and torch.cuda.is_bf16_supported())
    fallbacks: list[str] = []

    if no_4bit:
        use_4bit = False
        fallbacks.append("4-bit NF4 loading off (--no-4bit): the base model is trained in "
                         "full precision (LoRA, not QLoRA)")
    elif not bnb and cuda:  # a GPU run would spend its time on something other than the lab's
        raise UserError("QLoRA on a GPU needs bitsandbytes, which is not importable here: "
                        "`pip install 'bitsandbytes>=0.50'` (a dependency of the project), or "
                        "pass --no-4bit to train LoRA on a full-precision base")
    elif not bnb:
        use_4bit = False
        fallbacks.append("4-bit NF4 loading off: bitsandbytes is not installed (LoRA, not QLoRA)")
    elif not cuda and not force_4bit:
        use_4bit = False
        fallbacks.append("4-bit NF4 loading off: no CUDA device (pass --force-4bit to quantise "
                         "on CPU with bitsandbytes, slowly)")
    else:
        use_4bit = True
        if not cuda:
            fallbacks.append("4-bit NF4 on CPU (--force-4bit): bitsandbytes' CPU kernels, "
                             "not the lab's GPU")

    optim = LAB_QA_ARGS.optim
    if not (cuda and bnb):
        optim = "adamw_torch"
        why = "no CUDA device" if not cuda else "bitsandbytes is not installed"
        fallbacks.append(f"optimizer {LAB_QA_ARGS.optim} -> adamw_torch: {why} (paged 8-bit "
                         "optimizers need bitsandbytes and CUDA memory)")
    mixed = "bf16" if bf16_ok else "no"
    if not bf16_ok:
        fallbacks.append("bf16 mixed precision off: no CUDA device with bf16; training in fp32")
    return Plan(use_4bit=use_4bit, optim=optim, mixed_precision=mixed,
                device="cuda" if cuda else "cpu", fallbacks=fallbacks)


# --- model ----------------------------------------------------------------------------------

def load_model(name: str, plan: Plan):
    """The causal LM, 4-bit NF4 (the lab's ``BitsAndBytesConfig``) when the plan says so."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        if plan.use_4bit:
            return AutoModelForCausalLM.from_pretrained(
                name, quantization_config=bnb_config(),
                device_map={"": 0} if plan.device == "cuda" else "cpu")
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        return model.to(plan.device)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:  # a cut file: 30b-12
        raise UserError(f"cannot load model {name!r} ({str(exc).splitlines()[0]}). Pass --model "
                        "a local folder "
                        "holding BLOOM-560m's config and weights (or a hub name this machine "
                        "can download)") from exc


def check_weights(folder: Path) -> None:
    """A local model folder holds weights whose header reads: refused before a run folder is
    made, which a refusal from the loader left behind as a failed run."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise UserError(f"{folder} holds no weights (model.safetensors): pass a BLOOM-560m "
                        "folder to --model")
    for path in (f for f in files if f.suffix == ".safetensors"):
        try:
            with safe_open(str(path), framework="numpy"):
                pass
        except (OSError, SafetensorError) as exc:
            raise UserError(f"{path} cannot be read ({str(exc).splitlines()[0]}): download it "
                            "again") from exc


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:  # ValueError: a folder with no tokenizer (30's E-17)
        raise UserError(f"cannot load the tokenizer of {name!r} ({str(exc).splitlines()[0]}): "
                        "pass a BLOOM-560m folder or hub name to --model") from exc
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def generate_answers(model, tokenizer, questions: Sequence[str], gen: GenerationArgs,
                     seed: int) -> list[dict[str, Any]]:
    """Sample an answer per question (seeded); record whether it stopped at EOS."""
    import torch

    model.eval()
    device = next(p for p in model.parameters() if p.device.type != "meta").device
    out = []
    for i, q in enumerate(questions):
        prompt = format_prompt(q)
        enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
        torch.manual_seed(seed + i)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=gen.max_new_tokens, do_sample=gen.do_sample,
                                 temperature=gen.temperature, top_p=gen.top_p,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        new = ids[0, enc["input_ids"].shape[1]:].tolist()
        out.append({
            "question": q, "prompt": prompt,
            "answer": tokenizer.decode(new, skip_special_tokens=True).strip(),
            "new_tokens": len(new),
            "stopped_at_eos": tokenizer.eos_token_id in new,
        })
    return out


# --- the run --------------------------------------------------------------------------------

def hyperparameters(model: str, plan: Plan, train: QATrainingArgs, gen: GenerationArgs,
                    n_train: int) -> dict[str, Any]:
    """Everything that decides the result (seed and init are recorded beside, not here)."""
    lora = dict(LAB_LORA)
    return {
        "model": model,
        "lora": lora,
        "quantization": dict(LAB_BNB) if plan.use_4bit else None,
        "training": {**asdict(train), "optim": plan.optim, "optim_lab": LAB_QA_ARGS.optim},
        "mixed_precision": plan.mixed_precision,
        "generation": asdict(gen),
        "prompt_format": "<human>: {question}\\n<assistant>: {answer}{eos}",
        "n_train": n_train,
    }


def run_lora_qa(
    model: str,
    *,
    run: str | None = None,
    runs_root: Path | str | None = None,
    faq: Path | str | None = None,
    no_4bit: bool = False,
    force_4bit: bool = False,
    max_steps: int | None = None,
    max_new_tokens: int | None = None,
    n_questions: int = DEFAULT_QUESTIONS,
    seed: int = 42,
    overwrite: bool = False,
) -> Path:
    """Fine-tune ``model`` on the FAQ with the lab's recipe; return the recorded run folder."""
    import torch
    from torch.utils.tensorboard import SummaryWriter
    from transformers import Trainer, TrainingArguments, set_seed
    from transformers.integrations import TensorBoardCallback

    faq_file = Path(faq) if faq is not None else faq_path()
    pairs = load_faq(faq_file)
    plan = plan_run(no_4bit=no_4bit, force_4bit=force_4bit)
    train = QATrainingArgs(**{**asdict(LAB_QA_ARGS),
                              **({"max_steps": max_steps} if max_steps else {})})
    gen = GenerationArgs(**{**asdict(LAB_GENERATION),
                            **({"max_new_tokens": max_new_tokens} if max_new_tokens else {})})
    if train.max_steps != LAB_QA_ARGS.max_steps:
        plan.fallbacks.append(f"max_steps {train.max_steps} instead of the lab's "
                              f"{LAB_QA_ARGS.max_steps} (--max-steps)")
    if gen.max_new_tokens != LAB_GENERATION.max_new_tokens:
        plan.fallbacks.append(f"max_new_tokens {gen.max_new_tokens} instead of the lab's "
                              f"{LAB_GENERATION.max_new_tokens} (--max-new-tokens)")
    local = Path(model).expanduser()
    checkpoint = local if local.exists() else None
    init = "pretrained"
    if checkpoint is not None and (local / "config.json").is_file():
        config = read_json(local / "config.json")  # damaged: one line naming it (trial 30's E-16)
        if not isinstance(config, dict):
            raise UserError(f"{local / 'config.json'} is not a model configuration (a JSON "
                            "object): pass a BLOOM-560m folder to --model")
        init = "random" if config.get(RANDOM_INIT_FLAG) else init
    run_name = run or f"{'qlora' if plan.use_4bit else 'lora'}-{local.name or model}-seed{seed}"
    run_name = run_name.replace("/", "_")

    tokenizer = load_tokenizer(model)  # fails fast, before a run folder is created
    if checkpoint is not None:  # and so do weights missing or cut short (check 30b's 30b-13)
        check_weights(checkpoint)
    with record_run(EXPERIMENT, run_name, framework=FRAMEWORK, init=init, seed=seed,
                    hyperparameters=hyperparameters(model, plan, train, gen, len(pairs)),
                    data=[faq_file], checkpoint=checkpoint, runs_root=runs_root,
                    overwrite=overwrite,
                    extra={"fallbacks": list(plan.fallbacks), "generations": GENERATIONS_FILE,
                           "faq_language": "en (the lab's French translation is not available)"},
                    ) as handle:
        set_seed(seed)
        base = load_model(model, plan)
        if plan.use_4bit and plan.device == "cpu":
            keep_cpu_4bit_trainable(base)
        questions = [p.question for p in pairs[:n_questions]]
        before = generate_answers(base, tokenizer, questions, gen, seed)
        if plan.use_4bit:
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(
                base, gradient_checkpointing_kwargs={"use_reentrant": False})
        from peft import get_peft_model

        peft_model = get_peft_model(base, lora_config())
        trainable, total = (int(x) for x in peft_model.get_nb_trainable_parameters())
        examples, truncated = encode_faq(tokenizer, pairs, train.max_length)
        handle.manifest["extra"].update(trainable_params=trainable, all_params=total,
                                        truncated_examples=truncated)
        writer = SummaryWriter(log_dir=str(handle.run_dir))
        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(
                output_dir=tmp, per_device_train_batch_size=train.per_device_train_batch_size,
                gradient_accumulation_steps=train.gradient_accumulation_steps,
                max_steps=train.max_steps, learning_rate=train.learning_rate, optim=plan.optim,
                lr_scheduler_type=train.lr_scheduler_type, warmup_steps=train.warmup_ratio,
                logging_steps=train.logging_steps, save_strategy="no", report_to="none",
                bf16=plan.mixed_precision == "bf16", use_cpu=plan.device == "cpu", seed=seed,
                remove_unused_columns=False, disable_tqdm=True,
            )
            trainer = Trainer(model=peft_model, args=args, train_dataset=examples,
                              data_collator=CausalLMCollator(tokenizer.pad_token_id),
                              callbacks=[TensorBoardCallback(tb_writer=writer)])
            trainer.train()
        writer.close()
        after = generate_answers(peft_model, tokenizer, questions, gen, seed)
        write_json_atomic(handle.run_dir / GENERATIONS_FILE,
                          {"before": before, "after": after, "seed": seed,
                           "generation": asdict(gen)})
        del trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return handle.run_dir


# --- CLI ------------------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "lora-qa", help="Task 7: QLoRA fine-tune of a causal LM (BLOOM-560m) on the FAQ",
        description="The lab's QLoRA fine-tune; runs on CPU with recorded fallbacks.")
    p.add_argument("--model", required=True, metavar="NAME_OR_PATH",
                   help="BLOOM-560m (local folder or hub name) or any BLOOM-architecture model")
    p.add_argument("--run", type=run_name, default=None,
                   help="run folder name (default: from the model)")
    p.add_argument("--runs-root", type=folder, default=None, help="default: data/runs")
    p.add_argument("--faq", type=Path, default=None,
                   help="FAQ JSON (default: qa/ecommerce-faq.en.json under the data root)")
    p.add_argument("--no-4bit", action="store_true", help="load in full precision (LoRA)")
    p.add_argument("--force-4bit", action="store_true",
                   help="4-bit NF4 even without CUDA (bitsandbytes' CPU kernels)")
    p.add_argument("--max-steps", type=int, default=None, help="default: the lab's 80")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the lab's 200")
    p.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS,
                   help="generate for the first N FAQ questions, before and after")
    p.add_argument("--seed", type=seed_arg, default=42)
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    p.set_defaults(func=_cmd)


def check_model_argument(name: str) -> None:
    """A ``--model`` written as a path (``/``, ``.`` or ``~`` first) must exist: otherwise
    transformers reads it as a hub name and reports a puzzling repo-id error."""
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
        raise UserError(f"--model {name}: no such folder. Pass a local folder holding the "
                        "model's config and weights (BLOOM-560m for the lab), or a hub name")


def _cmd(args: argparse.Namespace) -> int:
    check_model_argument(args.model)
    run_dir = run_lora_qa(args.model, run=args.run, runs_root=args.runs_root, faq=args.faq,
                          no_4bit=args.no_4bit, force_4bit=args.force_4bit,
                          max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                          n_questions=args.questions, seed=args.seed, overwrite=args.overwrite)
    print(run_dir)
    return 0
