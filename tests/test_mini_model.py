"""The mini model (`sprint mini-model`): a seeded random-init Qwen2 for the mini tokenizer, which vLLM's CPU
build serves and ms-swift trains (template chatml: the tokenizer's own chat template, token for token)."""

from __future__ import annotations

import json
import math
import subprocess
import urllib.request
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sprint.cli import main as cli_main
from sprint.core.errors import UserError
from sprint.format.prompt_format import build_prompt_format, load_agent_prompt
from sprint.llm.serve import default_python, free_port, local_vllm
from sprint.mini.model import MiniModelConfig, make_model, model_spec, torch_python
from sprint.mini.tokenizer import MiniTokenizerConfig, make_tokenizer
from sprint.training.finetune import default_swift_bin, swift_python
from tests.helpers import EAGER
from tests.test_mini_tokenizer import corpus_rows

SERVED = "mini-qwen2"


@pytest.fixture(scope="module")
def mini_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mini")
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus_rows()))
    make_tokenizer(MiniTokenizerConfig(corpus=[str(root / "corpus.jsonl")], out=str(root / "tok"),
                                       fields="question,thought,messages"))
    return root / "tok"


def small(tokenizer: Path, out: Path) -> MiniModelConfig:
    return MiniModelConfig(tokenizer=str(tokenizer), out=str(out), hidden_size=64, num_layers=2, num_heads=1,
                           num_kv_heads=1, intermediate_size=128, max_positions=1024, seed=7)


@pytest.fixture(scope="module")
def mini_model(mini_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        torch_python()
    except UserError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("model") / "mini"
    make_model(small(mini_tokenizer, out))
    return out


def test_spec_takes_vocabulary_and_special_tokens_from_the_tokenizer(mini_tokenizer: Path, tmp_path: Path) -> None:
    spec = model_spec(small(mini_tokenizer, tmp_path / "m"))
    tok = Tokenizer.from_file(str(mini_tokenizer / "tokenizer.json"))
    config = spec["config"]
    assert config["vocab_size"] == tok.get_vocab_size() and config["tie_word_embeddings"] is True
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (eos, pad, None)
    assert config["head_dim"] == 64 and spec["generation"]["eos_token_id"] == [eos, pad]
    assert spec["model_type"] == "qwen2"
    with pytest.raises(UserError, match="must divide"):
        MiniModelConfig(tokenizer="t", out="o", num_heads=3, num_kv_heads=2)
    with pytest.raises(UserError, match="lacks tokenizer.json"):
        model_spec(small(tmp_path, tmp_path / "m"))


def test_a_tokenizer_transformers_would_rebuild_is_refused_for_qwen2(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus_rows(10)))
    make_tokenizer(MiniTokenizerConfig(corpus=[str(tmp_path / "corpus.jsonl")], out=str(tmp_path / "tok"),
                                       fields="question,thought", pipeline="exact"))
    cfg = small(tmp_path / "tok", tmp_path / "m")
    with pytest.raises(UserError, match="--architecture qwen3"):
        model_spec(cfg)
    cfg.architecture = "qwen3"
    assert model_spec(cfg)["model_type"] == "qwen3"


def test_same_seed_same_weights(mini_model: Path, mini_tokenizer: Path, tmp_path: Path) -> None:
    report = make_model(small(mini_tokenizer, tmp_path / "again"))
    assert report["parameters"] > 0 and "model.safetensors" in report["files"]
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (mini_model / name).read_bytes(), name
    config = json.loads((mini_model / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is True


@pytest.mark.vllm
def test_vllm_serves_it(mini_model: Path, tmp_path: Path) -> None:
    """One completion with the prompt orchestration sends (chat template + `<think>\\n`), one continued chat turn."""
    python = default_python()
    if not python.exists():
        pytest.skip(f"vLLM venv missing ({python}); run scripts/install_vllm.sh")
    fmt = build_prompt_format("chat", "completions", str(mini_model), load_agent_prompt())
    prompt = fmt.head("Use 2 3 7 to make 13 .")
    tok = Tokenizer.from_file(str(mini_model / "tokenizer.json"))
    with local_vllm(mini_model, SERVED, free_port(), python=python, dtype="float32", max_model_len=1024,
                    log_path=tmp_path / "vllm.log", timeout=600, extra_args=EAGER) as base_url:
        def post(path: str, body: dict) -> dict:
            request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(request, timeout=120).read())

        done = post("/completions", {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 0})
        messages = [{"role": "user", "content": fmt.user_turn("Use 2 3 7 to make 13 .")},
                    {"role": "assistant", "content": "<think>\n"}]
        chat = post("/chat/completions", {"model": SERVED, "max_tokens": 4, "temperature": 0, "messages": messages,
                                          "add_generation_prompt": False, "continue_final_message": True})
    assert done["usage"]["prompt_tokens"] == len(tok.encode(prompt, add_special_tokens=False).ids)
    assert done["usage"]["completion_tokens"] <= 8 and done["choices"][0]["finish_reason"] in ("length", "stop")
    assert chat["usage"]["prompt_tokens"] == done["usage"]["prompt_tokens"]  # vLLM renders the same template


@pytest.mark.swift
@pytest.mark.slow
def test_swift_trains_it_two_steps(mini_model: Path, tmp_path: Path) -> None:
    """`sprint finetune` (the swift sft command of run_finetune.sh) with the CPU overrides and template chatml."""
    swift = default_swift_bin()
    if not swift.exists() or not swift_python(swift).exists():
        pytest.skip(f"ms-swift venv missing ({swift}); run scripts/install_swift.sh")
    fmt = build_prompt_format("raw", "completions", None, load_agent_prompt())
    rows = [{"id": str(i), "messages": [{"role": "user", "content": fmt.user_turn(r["question"])},
                                        {"role": "assistant", "content": r["messages"][1]["content"]}]}
            for i, r in enumerate(corpus_rows(8, seed=3))]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[6:]))
    out = tmp_path / "out"
    code = cli_main(["finetune", "--model", str(mini_model), "--train", str(tmp_path / "train.jsonl"),
                     "--val", str(tmp_path / "test.jsonl"), "--output-dir", str(out), "--template", "chatml",
                     "--torch-dtype", "float32", "--deepspeed", "none", "--max-steps", "2", "--eval-steps", "2",
                     "--save-steps", "2", "--max-length", "1024", "--lr", "1e-3", "--swift-bin", str(swift), "--",
                     "--gradient_accumulation_steps", "1", "--dataloader_num_workers", "0", "--report_to", "none",
                     "--logging_steps", "1"])
    assert code == 0
    logs = [json.loads(line) for line in (out / "logging.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file()
    assert json.loads((out / "args.json").read_text())["template"] == "chatml"
    # the checkpoint keeps the tokenizer, so vLLM can serve it as it is
    python = swift_python(swift)
    code = ("import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(t('<Plan_1>\\nTry 3 and 5 first .', add_special_tokens=False).input_ids)")
    ids = subprocess.run([str(python), "-c", code, str(checkpoint)], capture_output=True, text=True, timeout=300)
    tok = Tokenizer.from_file(str(mini_model / "tokenizer.json"))
    assert ids.stdout.strip().splitlines()[-1] == str(tok.encode("<Plan_1>\nTry 3 and 5 first .").ids)
    # what ms-swift trains on (template chatml) is, token for token, the tokenizer's chat template, which
    # inference renders (sprint.format.prompt_format); the loss is on the assistant turn and <|im_end|> only
    code = ("import json, sys; from swift import get_processor, get_template; "
            "p = get_processor(sys.argv[1], model_type='qwen2', use_hf=True); "
            "t = get_template(p, template_type='chatml'); t.set_mode('train'); "
            "e = t.encode({'messages': json.loads(sys.argv[2])}); "
            "print(json.dumps([e['input_ids'], [i for i, x in zip(e['input_ids'], e['labels']) if x != -100]]))")
    messages = rows[0]["messages"]
    done = subprocess.run([str(python), "-c", code, str(mini_model), json.dumps(messages)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    trained, labelled = json.loads(done.stdout.strip().splitlines()[-1])
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert trained == tok.encode(rendered, add_special_tokens=False).ids
    assert tok.decode(labelled, skip_special_tokens=False) == messages[1]["content"] + "<|im_end|>\n"
