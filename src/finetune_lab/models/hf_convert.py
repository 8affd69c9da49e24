"""fairseq RoBERTa -> Transformers ``RobertaForMaskedLM`` / ``RobertaForSequenceClassification``.

The mapping is one table (:func:`key_map`), checked numerically (:func:`equivalence_table`):
hidden states after the embeddings and after every layer, the MLM logits and the classification
logits must agree within ``1e-4`` on sample inputs, at the real (non-pad) positions.

Why each non-obvious entry is right:

* fairseq's learned positions start at ``padding_idx + 1 = 2`` and skip pads
  (``utils.make_positions``); Transformers' ``create_position_ids_from_input_ids`` does the same
  with ``pad_token_id = 1``, so the 258-row position table copies over unchanged.
* fairseq has no token-type embedding; Transformers adds ``token_type_embeddings[0]`` to every
  token, so it is set to zeros.
* RoBERTa scales no embeddings (``no_scale_embedding``) and normalises after the embedding sum
  (``layernorm_embedding`` -> ``embeddings.LayerNorm``); both are post-LN encoders.
* fairseq zeroes the embeddings of pad positions after that LayerNorm; Transformers does not.
  Pads are masked as attention keys in both, so every real position agrees; pad positions
  themselves are never compared (nor used by either head).
* fairseq's LM output projection is tied to ``embed_tokens``; so is Transformers'
  ``lm_head.decoder`` (its bias is ``lm_head.bias``).
* fairseq's ``pooler_dropout`` defaults to 0 (``roberta`` base architecture), so the converted
  classifier gets ``classifier_dropout = 0.0``, not Transformers' fallback to hidden dropout.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.argtypes import folder
from finetune_lab._files import (CONVERSION_RECORD, atomic_dir, check_replaceable, not_there,
                                 sha256_file, utc_now)
from finetune_lab.config import paths
from finetune_lab.errors import UserError, library_write
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.models.conversion_check import FILES_KEY, converted_output, file_records
from finetune_lab.models.hf_tokenizer import (BOS, EOS, FairseqIdTokenizer, pad_batch)
from finetune_lab.models.params import SMALL, RobertaSize, fairseq_model, hf_config
from finetune_lab.models.trust import load_trusted

TOLERANCE = 1e-4
HEAD = "sentence_classification_head"
COMMAND = "convert-hf"
_LAYER = {
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_layer_norm": "attention.output.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "final_layer_norm": "output.LayerNorm",
}


def key_map(layers: int) -> dict[str, str]:
    """fairseq ``RobertaModel`` state-dict key -> Transformers key (MLM and classifier models)."""
    enc, hf = "encoder.sentence_encoder.", "roberta."
    out = {
        f"{enc}embed_tokens.weight": f"{hf}embeddings.word_embeddings.weight",
        f"{enc}embed_positions.weight": f"{hf}embeddings.position_embeddings.weight",
        f"{enc}layernorm_embedding.weight": f"{hf}embeddings.LayerNorm.weight",
        f"{enc}layernorm_embedding.bias": f"{hf}embeddings.LayerNorm.bias",
        "encoder.lm_head.dense.weight": "lm_head.dense.weight",
        "encoder.lm_head.dense.bias": "lm_head.dense.bias",
        "encoder.lm_head.layer_norm.weight": "lm_head.layer_norm.weight",
        "encoder.lm_head.layer_norm.bias": "lm_head.layer_norm.bias",
        "encoder.lm_head.bias": "lm_head.bias",
        "encoder.lm_head.weight": "lm_head.decoder.weight",  # tied to embed_tokens in both
    }
    for i in range(layers):
        for fs_name, hf_name in _LAYER.items():
            for kind in ("weight", "bias"):
                out[f"{enc}layers.{i}.{fs_name}.{kind}"] = f"{hf}encoder.layer.{i}.{hf_name}.{kind}"
    for part in ("dense", "out_proj"):
        for kind in ("weight", "bias"):
            out[f"classification_heads.{HEAD}.{part}.{kind}"] = f"classifier.{part}.{kind}"
    return out


def normalise_fairseq_keys(state: Mapping[str, Any]) -> dict[str, Any]:
    """Accept old checkpoints whose encoder is called ``decoder`` (fairseq < 0.10)."""
    out = {}
    for k, v in state.items():
        if k.startswith("decoder."):
            k = "encoder." + k[len("decoder."):]
        out[k] = v
    return out


def size_from_state_dict(state: Mapping[str, Any], heads: int = SMALL.heads) -> RobertaSize:
    """The model's sizes, read off its tensors (heads cannot be: pass them)."""
    state = normalise_fairseq_keys(state)
    enc = "encoder.sentence_encoder."
    try:
        vocab, dim = state[f"{enc}embed_tokens.weight"].shape
        positions = state[f"{enc}embed_positions.weight"].shape[0]
        ffn = state[f"{enc}layers.0.fc1.weight"].shape[0]
    except KeyError as exc:
        raise UserError(f"not a fairseq RoBERTa state dict: it has no {exc.args[0]}") from None
    layers = 1 + max(int(k.split(".")[3]) for k in state if k.startswith(f"{enc}layers."))
    head = state.get(f"classification_heads.{HEAD}.out_proj.weight")
    classes = int(head.shape[0]) if head is not None else SMALL.classes
    return RobertaSize(vocab=int(vocab), dim=int(dim), layers=layers, ffn=int(ffn), heads=heads,
                       positions=int(positions), classes=classes)


def convert_state_dict(state: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """Rename and cast (fp16 -> fp32) every fairseq tensor; add the zero token-type row.

    Raises when a fairseq weight would be left behind, so a new fairseq tensor cannot be
    silently dropped.
    """
    import torch

    state = normalise_fairseq_keys(state)
    mapping = key_map(layers)
    ignored = {"encoder.sentence_encoder.version"}
    left = sorted(k for k in state if k not in mapping and k not in ignored
                  and not k.endswith("._float_tensor"))
    if left:
        raise UserError(f"fairseq tensors with no Transformers counterpart: {', '.join(left[:8])}")
    out = {mapping[k]: v.detach().to(torch.float32).clone() for k, v in state.items()
           if k in mapping}
    emb = out["roberta.embeddings.word_embeddings.weight"]
    out["roberta.embeddings.token_type_embeddings.weight"] = torch.zeros(1, emb.shape[1])
    out["lm_head.decoder.bias"] = out["lm_head.bias"]
    return out


def hf_model_config(size: RobertaSize, dropout: float = 0.1, attention_dropout: float = 0.1):
    """:func:`params.hf_config` plus the dropouts fairseq uses (pooler dropout 0)."""
    cfg = hf_config(size)
    cfg.hidden_dropout_prob = dropout
    cfg.attention_probs_dropout_prob = attention_dropout
    cfg.classifier_dropout = 0.0
    return cfg


def _load_into(model, converted: Mapping[str, Any], expect_missing: set[str]) -> None:
    own = model.state_dict()
    wanted = {k: v for k, v in converted.items() if k in own}
    missing = set(own) - set(wanted) - expect_missing
    if missing:
        raise UserError(f"conversion left Transformers tensors unset: {sorted(missing)[:8]}")
    for k, v in wanted.items():
        if own[k].shape != v.shape:
            raise UserError(f"{k}: fairseq shape {tuple(v.shape)} != Transformers {tuple(own[k].shape)}")
    model.load_state_dict(wanted, strict=False)


def to_hf_masked_lm(state: Mapping[str, Any], size: RobertaSize):
    """A ``RobertaForMaskedLM`` holding the fairseq weights (eval mode)."""
    from transformers import RobertaForMaskedLM

    model = RobertaForMaskedLM(hf_model_config(size))
    _load_into(model, convert_state_dict(state, size.layers), expect_missing=set())
    model.tie_weights()
    return model.eval()


def to_hf_classifier(state: Mapping[str, Any], size: RobertaSize):
    """A ``RobertaForSequenceClassification``; its head from fairseq's when the state has one."""
    from transformers import RobertaForSequenceClassification

    model = RobertaForSequenceClassification(hf_model_config(size))
    converted = convert_state_dict(state, size.layers)
    has_head = any(k.startswith("classifier.") for k in converted)
    expect = set() if has_head else {k for k in model.state_dict() if k.startswith("classifier.")}
    _load_into(model, converted, expect_missing=expect)
    return model.eval()


# --- numerical check ------------------------------------------------------------------------


def sample_inputs(vocab: int, lengths: tuple[int, ...] = (12, 7, 30, 3), seed: int = 0,
                  max_len: int | None = None):
    """``<s> random pieces </s>`` rows of different lengths, right-padded with ``<pad>``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        n = min(n, (max_len or n + 2) - 2)
        body = torch.randint(4, vocab - 1, (n,), generator=g).tolist()  # no specials, no <mask>
        rows.append([BOS, *body, EOS])
    return pad_batch(rows)


def randomize_(model, seed: int = 0, scale: float = 0.1) -> None:
    """Add noise to *every* parameter (LayerNorms and biases too), in place.

    A freshly built model has LayerNorm weights 1 and biases 0, under which swapping two
    LayerNorms or two biases in the mapping would go unnoticed; after this it cannot.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _max_diff(a, b, mask) -> float:
    m = mask.bool().unsqueeze(-1).expand_as(a)
    return float((a - b).abs()[m].max())


def equivalence_table(fs_model, hf_mlm, hf_cls, batch: Mapping[str, Any]) -> pd.DataFrame:
    """Max |fairseq − Transformers| per quantity, at the real tokens of ``batch``, vs 1e-4."""
    import torch

    ids, mask = batch["input_ids"], batch["attention_mask"]
    fs_model.eval()
    with torch.no_grad():
        fs_logits, extra = fs_model(ids, features_only=False, return_all_hiddens=True)
        fs_states = [s.transpose(0, 1) for s in extra["inner_states"]]
        hf_out = hf_mlm(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        rows = [(f"hidden states, {'embeddings' if i == 0 else f'layer {i}'}",
                 _max_diff(fs_states[i], hf_out.hidden_states[i], mask))
                for i in range(len(fs_states))]
        rows.append(("MLM logits", _max_diff(fs_logits, hf_out.logits, mask)))
        if HEAD in getattr(fs_model, "classification_heads", {}):
            fs_cls, _ = fs_model(ids, features_only=True, classification_head_name=HEAD)
            hf_cls_logits = hf_cls(input_ids=ids, attention_mask=mask).logits
            rows.append(("classification logits", float((fs_cls - hf_cls_logits).abs().max())))
    df = pd.DataFrame(rows, columns=["quantity", "max abs difference"])
    df["tolerance"] = TOLERANCE
    df["equal"] = df["max abs difference"] <= TOLERANCE
    return df


def tiny_size(vocab: int = 120) -> RobertaSize:
    """The tests' and the chapter's stand-in when the real checkpoint is absent."""
    return RobertaSize(vocab=vocab, dim=32, layers=2, ffn=48, heads=4, positions=66)


def tiny_check(seed: int = 0) -> pd.DataFrame:
    """Build a tiny fairseq RoBERTa with a 2-class head, randomize it, convert, compare."""
    size = tiny_size()
    fs = fairseq_model(size, classification_head=True)
    randomize_(fs, seed)
    state = fs.state_dict()
    return equivalence_table(fs, to_hf_masked_lm(state, size), to_hf_classifier(state, size),
                             sample_inputs(size.vocab, seed=seed, max_len=size.max_positions))


# --- the real checkpoint --------------------------------------------------------------------


def load_fairseq_checkpoint(path: Path) -> tuple[dict[str, Any], int]:
    """``(model state, attention heads)`` of a fairseq checkpoint, through the safe loader."""
    ckpt = load_trusted(path)
    heads = SMALL.heads
    for holder in (ckpt.get("cfg"), ckpt.get("args")):
        model_cfg = holder.get("model") if isinstance(holder, Mapping) else holder
        value = getattr(model_cfg, "encoder_attention_heads", None)
        if value is None and isinstance(model_cfg, Mapping):
            value = model_cfg.get("encoder_attention_heads")
        if value:
            heads = int(value)
            break
    return ckpt["model"], heads


def fairseq_model_from_state(state: Mapping[str, Any], size: RobertaSize):
    """A fairseq ``RobertaModel`` of ``size`` holding ``state`` (fp32, eval mode)."""
    import torch

    state = normalise_fairseq_keys(state)
    has_head = any(k.startswith(f"classification_heads.{HEAD}.") for k in state)
    model = fairseq_model(size, classification_head=has_head)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    return model.eval()


def with_seeded_head(fs_model, size: RobertaSize, seed: int = 0):
    """``fs_model`` plus a 2-class head of seeded random weights, as fine-tuning adds one: so
    the classification path is checked on a pretrained checkpoint, which has no head."""
    import torch

    model = fairseq_model(size, classification_head=True)
    missing, unexpected = model.load_state_dict(fs_model.state_dict(), strict=False)
    if unexpected or any(not k.startswith(f"classification_heads.{HEAD}.") for k in missing):
        raise UserError(f"adding a head changed more than the head: missing {missing}, "
                        f"unexpected {unexpected}")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(f"classification_heads.{HEAD}."):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def checkpoint_check(path: Path, seed: int = 0) -> pd.DataFrame:
    """Load the real checkpoint in fairseq, convert it, compare on sample inputs (CPU).

    Hidden states and MLM logits come from the checkpoint as it is; the classification logits
    from its weights plus its own head, or a seeded random one if it has none.
    """
    state, heads = load_fairseq_checkpoint(path)
    size = size_from_state_dict(state, heads)
    fs = fairseq_model_from_state(state, size)
    if HEAD not in getattr(fs, "classification_heads", {}):
        fs = with_seeded_head(fs, size, seed)
    full = fs.state_dict()
    return equivalence_table(fs, to_hf_masked_lm(full, size), to_hf_classifier(full, size),
                             sample_inputs(size.vocab, seed=seed, max_len=size.max_positions))


def convert_checkpoint(checkpoint: Path, out: Path, tokenizer_dir: Path | None = None,
                       force: bool = False, keep_old: bool = False) -> Path:
    """Write a Transformers ``RobertaForMaskedLM`` folder + the fairseq-id tokenizer files.

    The folder holds ``config.json``, ``model.safetensors``, ``spm.model``, ``dict.txt``,
    ``fairseq_tokenizer.json`` and ``conversion.json`` (source sha256, check, each file's sha256).
    It is written whole and swapped in, replacing only a conversion (``force``: anything;
    ``keep_old``: what it replaces is kept beside it, whoever made it).
    """
    check_replaceable(Path(out), COMMAND, force=force, earlier=converted_output)

    checkpoint = Path(checkpoint)
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else checkpoint.parent
    state, heads = load_fairseq_checkpoint(checkpoint)
    size = size_from_state_dict(state, heads)
    fs = fairseq_model_from_state(state, size)
    mlm = to_hf_masked_lm(state, size)
    check = equivalence_table(fs, mlm, to_hf_classifier(state, size),
                              sample_inputs(size.vocab, max_len=size.max_positions))
    if not check["equal"].all():
        raise UserError(f"conversion of {checkpoint} is not equivalent:\n{check.to_string()}")
    tok = FairseqIdTokenizer.from_dir(tokenizer_dir, max_positions=size.max_positions)
    if tok.vocab_size != size.vocab:
        raise UserError(f"{tok.dict_path} gives {tok.vocab_size} ids but {checkpoint} has "
                        f"{size.vocab} embedding rows: pass the tokenizer the model was trained with")
    out = Path(out)
    with atomic_dir(out, COMMAND, force=force, earlier=converted_output,
                    keep_old=keep_old) as tmp:
        with library_write(out):
            mlm.save_pretrained(tmp)
        tok.save(tmp)
        (tmp / CONVERSION_RECORD).write_text(json.dumps({
            "source": {"path": str(checkpoint), "sha256": sha256_file(checkpoint)},
            "created": utc_now(),
            "size": size.__dict__,
            "check": json.loads(check.to_json(orient="records")),
            FILES_KEY: file_records(tmp),  # held to before any load (trial 27's E-m6)
        }, indent=2) + "\n", encoding="utf-8")
    return out


def default_hf_dir() -> Path:
    """Where ``convert-hf`` writes by default (derived data: the work dir)."""
    return paths().work / "hf" / "roberta-small-fr"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert-hf", help="convert the fairseq RoBERTa checkpoint to a Transformers folder",
        description=convert_checkpoint.__doc__)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="fairseq checkpoint (default: data/checkpoints/roberta-small-fr/model.pt)")
    p.add_argument("--tokenizer-dir", type=folder, default=None,
                   help="folder with the spm model and dict.txt (default: the checkpoint's folder)")
    p.add_argument("--out", type=folder, default=None, help="output folder (default: "
                   "<work dir>/hf/roberta-small-fr)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if convert-hf did not make it")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    ckpt = args.checkpoint or packaged_dir() / MODEL_FILE
    if ckpt.is_dir():  # the file in it, where there is one (trial 26's E-m11)
        raise UserError(f"{ckpt} is a folder: pass the checkpoint file in it ({ckpt / MODEL_FILE})"
                        if (ckpt / MODEL_FILE).is_file() else f"{ckpt} is a folder that holds no "
                        f"{MODEL_FILE}: pass a checkpoint file (a packaged checkpoint's "
                        f"{MODEL_FILE})")
    if not ckpt.is_file():  # gone, or a pipe or device (trial 13's X9)
        raise UserError(f"{ckpt} {not_there(ckpt)}: pass a checkpoint file, or pretrain and "
                        "package the model first (README)")
    out = convert_checkpoint(ckpt, args.out or default_hf_dir(), args.tokenizer_dir, args.force)
    print(f"convert-hf: wrote {out}")
    return 0
