"""Drive the SPRINT scheduler's `run()` in-process, loaded through ms-swift's plugin registry.

Run by tests/test_rl_scheduler.py with the RL environment's Python (it imports ms-swift):

    .venv-rl/bin/python tests/rl_scheduler_driver.py BASE_URL TOKENIZER ROWS.json OUT.json

The rollout engine here is the one piece that is not ms-swift's: `HTTPEngine.infer_async` sends each
call to an OpenAI-compatible server (the tests' scripted server) through sprint's own client and
answers with an ms-swift `ChatCompletionResponse` whose token ids are the policy tokenizer's
encoding of the text, as vLLM would return them. Everything else is the real thing: ms-swift loads
sprint/rl/plugin.py from its path (`import_external_file`, what `--external_plugins` does), the
scheduler comes from `swift.rollout.multi_turns`, the rewards from `swift.rewards.orms`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

from swift.infer_engine.protocol import (ChatCompletionResponse, ChatCompletionResponseChoice, ChatMessage,
                                         RequestConfig, RolloutInferRequest, UsageInfo)
from swift.rewards import orms
from swift.rollout import multi_turns
from swift.utils import import_external_file
from transformers import PreTrainedTokenizerFast

from sprint.llm.client import LLMClient, LLMConfig, Sampling

PLUGIN = Path(__file__).resolve().parents[1] / "sprint" / "rl" / "plugin.py"


class HTTPEngine:
    """`infer_async` answered by an OpenAI-compatible server; keeps what each call asked for."""

    def __init__(self, base_url: str, tokenizer) -> None:
        self.client = LLMClient(LLMConfig(base_url=base_url, model="test-model", max_concurrency=64, max_retries=0))
        self.tokenizer = tokenizer
        self.calls: list[dict] = []

    async def infer_async(self, infer_request: RolloutInferRequest, request_config: RequestConfig, **kwargs):
        self.calls.append({"messages": infer_request.messages, "stop": list(request_config.stop),
                           "max_tokens": request_config.max_tokens, "seed": request_config.seed,
                           "temperature": request_config.temperature, "return_details": request_config.return_details})
        sampling = Sampling(max_tokens=request_config.max_tokens, temperature=request_config.temperature,
                            top_p=request_config.top_p, stop=tuple(request_config.stop), seed=request_config.seed)
        done = await self.client.chat(infer_request.messages, sampling)
        ids = self.tokenizer.encode(done.text, add_special_tokens=False)
        choice = ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content=done.text),
                                              finish_reason=done.finish_reason, token_ids=ids)
        usage = UsageInfo(prompt_tokens=done.prompt_tokens, completion_tokens=len(ids),
                          total_tokens=done.prompt_tokens + len(ids))
        return ChatCompletionResponse(model="test-model", choices=[choice], usage=usage)


async def drive(base_url: str, tokenizer_dir: str, rows: list[dict]) -> dict:
    import_external_file(str(PLUGIN))
    # tokenizer.json directly: transformers 5.19 (the ms-swift/vLLM pin) loads the shared reconstructed
    # tokenizer's config as a Metaspace LlamaTokenizer, which is not byte-level (newlines get lost)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(tokenizer_dir) / "tokenizer.json"))
    engine = HTTPEngine(base_url, tokenizer)
    scheduler = multi_turns["sprint"](infer_engine=engine, max_turns=None, tokenizer=tokenizer)
    config = RequestConfig(max_tokens=512, temperature=0.7, top_p=0.9, logprobs=False)
    results = []
    for row in rows:
        request = RolloutInferRequest(messages=row["messages"], data_dict=row, uuid=f"chatcmpl-{uuid.uuid4().hex}")
        start = len(engine.calls)
        outputs = await scheduler.run(request, config)
        kwargs = {"rollout_infos": [o.rollout_infos for o in outputs], "task": [row["task"]] * len(outputs),
                  "gold": [row["gold"]] * len(outputs), "reference_tokens": [row["reference_tokens"]] * len(outputs)}
        completions = [o.messages[-1]["content"] for o in outputs]
        rewards = {name: orms[name]()(completions, **kwargs) for name in ("sprint_correct", "sprint_format", "sprint_latency")}
        results.append({
            "uuid": request.uuid,
            "calls": engine.calls[start:],
            "rewards": rewards,
            "outputs": [{
                "response_id": o.response.id,
                "messages": o.messages,
                "token_ids": o.response_token_ids,
                "loss_mask": o.response_loss_mask,
                "trained_text": tokenizer.decode([t for t, m in zip(o.response_token_ids[0], o.response_loss_mask[0]) if m]),
                "masked_text": tokenizer.decode([t for t, m in zip(o.response_token_ids[0], o.response_loss_mask[0]) if not m]),
                "rollout_infos": o.rollout_infos,
            } for o in outputs],
        })
    await engine.client.aclose()
    return {"scheduler": type(scheduler).__module__ + "." + type(scheduler).__name__,
            "reward_classes": {n: orms[n].__name__ for n in ("sprint_correct", "sprint_format", "sprint_latency")},
            "results": results}


def main() -> None:
    base_url, tokenizer_dir, rows_path, out_path = sys.argv[1:5]
    rows = json.loads(Path(rows_path).read_text())
    Path(out_path).write_text(json.dumps(asyncio.run(drive(base_url, tokenizer_dir, rows))))


if __name__ == "__main__":
    main()
