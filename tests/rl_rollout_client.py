"""Ask a running `swift rollout` server (vLLM engine + the sprint scheduler) for GRPO rollouts.

Run by tests/test_rl_smoke.py with the RL environment's Python:

    .venv-rl/bin/python tests/rl_rollout_client.py BASE_URL ROWS.jsonl NUM_GENERATIONS MODEL_DIR OUT.json

It does what `swift rlhf` does with one generation batch in server mode, with ms-swift's own pieces:
each row becomes NUM_GENERATIONS `RolloutInferRequest`s (dataset columns in `data_dict`, one uuid
each), `VLLMInferClient.infer` posts them to /infer/, the returned `RolloutOutput`s are scored by
the reward functions ms-swift finds in `orms` once the plugin is loaded from its path, and each is
merged into its sample and encoded for the loss as the GRPO trainer does (`apply_rollout_output`,
`encode_sample` with the deepseek_r1 template in train mode), to see which tokens carry labels.

    .venv-rl/bin/python tests/rl_rollout_client.py --weight-sync BASE_URL ROWS.jsonl MODEL_DIR GROUP_PORT OUT.json

checks that a weight sync changes what the server computes (on a CPU: sprint.rl.cpu_sync, with
SPRINT_RL_CPU_WEIGHT_SYNC=1). It joins the server's weight-sync group as `swift rlhf` does
(`VLLMClient.init_communicator`), and sends the model's weights through ms-swift's own bucketed
path (`update_flattened_params`, then `process_weights_after_loading`) three times: unchanged,
with the final norm's weight zeroed (the hidden state is then 0, so are all logits, and every
sampled token's log-probability is -log(vocab size)), and unchanged again. After each sync it
asks for one rollout and records the log-probabilities of the tokens the server sampled.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.model import get_processor
from swift.rewards import orms
from swift.rl_core.data import OnPolicySample
from swift.rlhf_trainers.utils import FlattenedTensorBucket, encode_sample
from swift.rlhf_trainers.vllm_client import VLLMClient, VLLMInferClient
from swift.template import get_template
from swift.utils import import_external_file

PLUGIN = Path(__file__).resolve().parents[1] / "sprint" / "rl" / "plugin.py"
REWARDS = ("sprint_correct", "sprint_format", "sprint_latency")


def main() -> None:
    base_url, rows_path, generations, model_dir, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6]
    import_external_file(str(PLUGIN))
    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines() if line.strip()]
    requests = []
    for row in rows:
        extra = {k: v for k, v in row.items() if k != "messages"}
        for _ in range(generations):
            requests.append(RolloutInferRequest(messages=row["messages"], data_dict=extra,
                                                uuid=f"chatcmpl-{uuid.uuid4().hex}"))
    client = VLLMInferClient(base_urls=[base_url], connection_timeout=60)
    outputs = client.infer(requests, RequestConfig(max_tokens=64, temperature=1.0, top_p=1.0))
    template = get_template(get_processor(model_dir, model_type="qwen2"), template_type="deepseek_r1",
                            max_length=4096)
    template.set_mode("train")  # what `swift rlhf --rlhf_type grpo` sets
    by_id = {r.uuid: r for r in requests}
    records = []
    for o in outputs:
        request = by_id[o.response.id]
        row = request.data_dict
        sample = OnPolicySample.from_row({"messages": request.messages, **row})
        sample.request_id = o.response.id
        sample.apply_rollout_output(rollout_output=o)
        encoded = encode_sample(sample, template)
        labels = [t for t in encoded["labels"] if t != -100]
        records.append({"request": o.response.id, "task": row["task"], "gold": row["gold"],
                        "reference_tokens": row["reference_tokens"], "messages": o.messages,
                        "token_ids": o.response_token_ids, "loss_mask": o.response_loss_mask,
                        "rollout_infos": o.rollout_infos, "labels": labels,
                        "input_ids_tail": list(encoded["input_ids"][-len(o.response_token_ids[0]):])})
    kwargs = {"rollout_infos": [r["rollout_infos"] for r in records], "task": [r["task"] for r in records],
              "gold": [r["gold"] for r in records], "reference_tokens": [r["reference_tokens"] for r in records]}
    completions = [r["messages"][-1]["content"] for r in records]
    rewards = {name: orms[name]()(completions, **kwargs) for name in REWARDS}
    Path(out_path).write_text(json.dumps({"requests": [r.uuid for r in requests], "records": records,
                                          "rewards": rewards}))


def sampled_logprobs(client: VLLMInferClient, row: dict) -> list[float]:
    """The log-probabilities of every token the server sampled in one SPRINT rollout of `row`."""
    request = RolloutInferRequest(messages=row["messages"], data_dict={k: v for k, v in row.items() if k != "messages"},
                                  uuid=f"chatcmpl-{uuid.uuid4().hex}")
    outputs = client.infer([request], RequestConfig(max_tokens=16, temperature=1.0, top_p=1.0, logprobs=True))
    return [lp for o in outputs for lps in o.rollout_logprobs for lp in lps]


def weight_sync() -> None:
    base_url, rows_path, model_dir, group_port, out_path = sys.argv[2:7]
    import_external_file(str(PLUGIN))  # installs the trainer's side of sprint.rl.cpu_sync, as in `swift rlhf`
    row = json.loads(Path(rows_path).read_text().splitlines()[0])
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    weights = [(name, p.detach().clone()) for name, p in model.named_parameters()]
    client = VLLMClient(base_urls=[base_url], group_ports=int(group_port), connection_timeout=60)
    client.close_communicator()
    client.init_communicator(device="cpu")

    def sync(zero_norm: bool) -> list[float]:
        sent = [(n, torch.zeros_like(w) if zero_norm and n == "model.norm.weight" else w) for n, w in weights]
        bucket = FlattenedTensorBucket(named_tensors=sent)
        client.update_flattened_params(bucket.get_metadata(), bucket.get_flattened_tensor())
        client.process_weights_after_loading()
        client.reset_prefix_cache()
        return sampled_logprobs(client, row)

    result = {"vocab_size": model.config.vocab_size, "original": sync(False), "zero_norm": sync(True),
              "restored": sync(False)}
    client.close_communicator()
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--weight-sync"]:
        weight_sync()
    else:
        main()
