"""What a model is sent: the agent prompt, the user turn, the chat template, the stop strings.

Training (packing's SFT rows) and inference (orchestration, the baseline) build the user turn
with the same `sft_user_content`, so a fine-tuned planner sees at inference exactly the text it
was trained on. This module stays light (no transformers at import): `pack` imports it; the
chat template comes from the one tokenizer loader, `sprint.format.trajectory.load_tokenizer(chat=True)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.format import tags
from sprint.core.resources import prompt_file
from sprint.format.trajectory import load_tokenizer, render_question

AGENT_PROMPT_PATH = prompt_file("agent")
THINK = tags.THINK + "\n"
FINAL_OPEN = tags.FINAL + "\n"
PROMPT_MODES = ("chat", "raw")
APIS = ("completions", "chat")

# At most 4 stop strings per request (vLLM rejects more). Prefixes catch wrongly numbered tags.
PLANNER_STOPS = ("</Plan_", "<Execution_", "</Final_answer>", "</think>")
EXECUTOR_STOPS = ("</execution_", "<execution_", "</Execution_", "<Plan_")
FINAL_STOPS = (tags.FINAL_END, tags.THINK_END)
# vLLM's chat endpoint: continue the last (assistant) message instead of opening a new turn.
CONTINUE_EXTRA = (("add_generation_prompt", False), ("continue_final_message", True))


def sft_user_content(agent_prompt: str, question: str) -> str:
    """The user turn of training (and of inference): agent prompt, then the question block. With no
    agent prompt (`--agent-prompt none`) the turn starts at the question, as `PromptFormat` sends it."""
    head = agent_prompt.rstrip() + "\n\n" if agent_prompt.strip() else ""
    return head + render_question(question) + "\n\n"


def load_agent_prompt(path: str | Path | None = None) -> str:
    """The agent prompt (the shipped prompts/agent.txt unless `path`); "none" means no agent prompt at all."""
    if path is not None and str(path).lower() == "none":
        return ""
    p = Path(path) if path is not None else AGENT_PROMPT_PATH
    try:
        return p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read the agent prompt {p} ({exc.strerror}); pass --agent-prompt PATH") from None


def with_think(text: str) -> str:
    """End the generation prompt with exactly one `<think>\\n` (R1 templates already add it)."""
    if text.endswith(THINK):
        return text
    if text.endswith(tags.THINK):
        return text + "\n"
    return text + THINK


def load_chat_template(tokenizer: str) -> Callable[[str], str]:
    """A function rendering one user turn with the model's chat template plus the generation prompt.

    The rendered text goes to /v1/completions, whose tokenizer adds BOS itself; so a BOS that the
    template writes is removed when the tokenizer would add one anyway (no double BOS).
    """
    tok = load_tokenizer(tokenizer, chat=True,
                         hint="pass --tokenizer DIR (a folder with tokenizer_config.json), or --prompt-mode raw")
    if not getattr(tok, "chat_template", None):
        raise UserError(f"tokenizer {tokenizer!r} has no chat template; pass another --tokenizer or use --prompt-mode raw")
    bos = tok.bos_token or ""
    ids = tok("x").input_ids if bos else []
    strip_bos = bool(bos) and bool(ids) and ids[0] == tok.bos_token_id

    def render(user_turn: str) -> str:
        text = tok.apply_chat_template(
            [{"role": "user", "content": user_turn}], tokenize=False, add_generation_prompt=True
        )
        if strip_bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    return render


@dataclass
class PromptFormat:
    """How a request is built from a question and the assistant text generated so far.

    mode "chat": the user turn rendered with the model's chat template (what it was trained on);
    mode "raw": the authors' inference format, agent prompt + question + `<think>\\n` with no
    template. api "chat" sends messages to /v1/chat/completions with the assistant turn continued
    (vLLM's `continue_final_message`), for servers that only render templates themselves.
    """

    agent_prompt: str
    mode: str = "raw"
    api: str = "completions"
    template: Callable[[str], str] | None = None  # user turn -> rendered text (chat mode, completions)
    think: bool = True  # start the assistant turn with `<think>\n`

    def __post_init__(self) -> None:
        if self.mode not in PROMPT_MODES:
            raise UserError(f"unknown prompt mode {self.mode!r}; use chat or raw")
        if self.api not in APIS:
            raise UserError(f"unknown API {self.api!r}; use completions or chat")
        if self.api == "chat" and self.mode == "raw":
            raise UserError("--api chat always applies the server's chat template; use --prompt-mode chat with it")
        if self.api == "completions" and self.mode == "chat" and self.template is None:
            raise UserError("prompt mode chat needs the model's chat template; pass --tokenizer or use --prompt-mode raw")

    def user_turn(self, question: str) -> str:
        """The user message the model was fine-tuned on (packing renders the same one)."""
        return sft_user_content(self.agent_prompt, question)

    def head(self, question: str) -> str:
        """The completions text before the assistant's own output."""
        if self.mode == "raw":
            return self.user_turn(question) + (THINK if self.think else "")
        assert self.template is not None
        text = self.template(self.user_turn(question))
        return with_think(text) if self.think else text

    def request(self, question: str, continuation: str) -> tuple[str, Any, tuple]:
        """(endpoint, payload, extra params) for a call continuing the assistant text `continuation`."""
        if self.api == "completions":
            return "completions", self.head(question) + continuation, ()
        messages: list[dict[str, str]] = [{"role": "user", "content": self.user_turn(question)}]
        assistant = (THINK if self.think else "") + continuation
        if not assistant:
            return "chat", messages, ()
        messages.append({"role": "assistant", "content": assistant})
        return "chat", messages, CONTINUE_EXTRA


def build_prompt_format(
    mode: str, api: str, tokenizer: str | None, agent_prompt: str, think: bool = True
) -> PromptFormat:
    """The format of a run; loads the chat template only when the completions API needs it."""
    template = None
    if mode == "chat" and api == "completions":
        if not tokenizer:
            raise UserError("prompt mode chat needs a tokenizer; pass --tokenizer (or --model-path) or use --prompt-mode raw")
        template = load_chat_template(tokenizer)
    return PromptFormat(agent_prompt=agent_prompt, mode=mode, api=api, template=template, think=think)
