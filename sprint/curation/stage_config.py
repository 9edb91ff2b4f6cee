"""The settings every LLM-calling curation stage shares, and what they become: sampling and client settings.

One flag each, defaults written once (`sprint.core.options`); a stage subclasses `LLMStageConfig`
to add its own. Batch mode and the runner both read these, so they sit below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sprint.core.errors import UserError
from sprint.core.options import option, optional_int
from sprint.llm.client import DEFAULT_MAX_CONNECTION_FAILURES, LLMConfig, Sampling

DEFAULT_MODEL = "gpt-4o"  # the paper's curation model
DEFAULT_SERVER_URL = "https://api.openai.com/v1"
DEFAULT_MAX_INPUT_TOKENS = 32_000  # curation prompts of the paper's traces stay far below; a runaway trace does not
CHARS_PER_TOKEN = 4  # the usual English-text rule of thumb: a size estimate needs no tokenizer
TOO_LONG = "too_long"


@dataclass
class LLMStageConfig:
    """The settings every LLM-calling curation stage shares (one flag each; defaults written once)."""

    input: str = option(help="input dataset: a hub id, a .jsonl/.json/.parquet file or a stage folder",
                        flags=("--input", "-i"), var="DATA")
    out_dir: str = option(help="output folder (records.jsonl + manifest.json); resumed if it exists",
                          flags=("--out-dir", "-o"), var="OUT_DIR")
    split: str | None = option("train", "dataset split (hub datasets, files with a split column)", var="SPLIT")
    subset: str | None = option(None, "dataset configuration name (hub datasets)", var="SUBSET")
    range_spec: str | None = option(None, "rows to process, e.g. 0:100 (default: all)", flags=("--range",),
                                    metavar="START:END", var="RANGE")
    overwrite: bool = option(False, "discard an existing output folder made with a different configuration")
    progress: bool = option(True, "no progress bar", flags=("--no-progress",))
    model: str = option(DEFAULT_MODEL, "model name", var="MODEL")
    server_url: str = option(DEFAULT_SERVER_URL,
                             "OpenAI-compatible base URL (vLLM: http://127.0.0.1:8000/v1); the key comes from OPENAI_API_KEY",
                             var="SERVER_URL")
    num_workers: int = option(8, "concurrent requests", var="NUM_WORKERS")
    max_tokens: int = option(2048, "answer length limit", var="MAX_TOKENS")
    temperature: float = option(0.0, "sampling temperature (0, as in the paper)", var="TEMPERATURE")
    timeout: float = option(600.0, "seconds per request attempt", var="TIMEOUT")
    max_retries: int = option(3, "retries of transient failures per request", var="MAX_RETRIES")
    cache_dir: str | None = option(None, "response cache folder (default: OUT_DIR/llm_cache)", var="CACHE_DIR")
    use_cache: bool = option(True, "do not read or write the response cache", flags=("--no-cache",))
    prompt_file: str | None = option(None, "use this prompt template instead of the packaged one", flags=("--prompt",),
                                     var="PROMPT")
    check_server: bool = option(True, "skip the GET /models check before starting", flags=("--no-check",))
    max_connection_failures: int = option(
        DEFAULT_MAX_CONNECTION_FAILURES,
        "stop the run after this many failed connections in a row to the server (0: never); re-run to continue",
        var="MAX_CONNECTION_FAILURES")
    max_input_tokens: int = option(
        DEFAULT_MAX_INPUT_TOKENS, "an item whose prompt is estimated (characters / 4) over this many tokens is skipped "
        "as too_long before any call (0: no limit)", var="MAX_INPUT_TOKENS")
    allow_long: bool = option(False, "send items over --max-input-tokens anyway (also redoes items marked too_long)",
                              var="ALLOW_LONG")
    tpm: int | None = option(None, "tokens-per-minute budget: requests are paced to stay within it (prompt + max_tokens "
                             "estimated, corrected by the usage the API returns); default: no limit", type=optional_int,
                             var="TPM")
    rpm: int | None = option(None, "requests-per-minute budget; default: no limit", type=optional_int, var="RPM")
    batch: bool = option(False, "send the requests through the OpenAI Batch API (half price; results within 24 h): "
                         "upload, poll, ingest; a re-run resumes a submitted batch", var="BATCH")
    batch_file_only: bool = option(False, "write the requests as a Batch API JSONL (OUT_DIR/batch/) and stop, e.g. "
                                   "for vLLM's offline `run_batch`; ingest its output with --batch-results")
    batch_results: str | None = option(None, "ingest this Batch API output JSONL (OpenAI's or vLLM run_batch's) into "
                                       "the response cache and the records", metavar="FILE")
    batch_poll: float = option(30.0, "seconds between polls of a submitted batch")


def sampling_for(max_tokens: int, temperature: float) -> Sampling:
    """The stage's sampling settings, refused as a user error (not a traceback) when out of range."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer, got {max_tokens!r}")
    if not temperature >= 0:
        raise UserError(f"--temperature must be >= 0, got {temperature!r}")
    return Sampling(max_tokens=max_tokens, temperature=temperature)


def llm_config(
    *, server_url: str, model: str, num_workers: int, timeout: float, max_retries: int, cache_dir: Path | None,
    max_connection_failures: int = DEFAULT_MAX_CONNECTION_FAILURES, tpm: int | None = None, rpm: int | None = None,
) -> LLMConfig:
    """The run's client settings; each out-of-range value is one clear user error before any call."""
    if not server_url:
        raise UserError("no server URL; pass --server-url (e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1)")
    if not server_url.startswith(("http://", "https://")):
        raise UserError(
            f"server URL {server_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1"
        )
    if not model:
        raise UserError("no model name; pass --model")
    if num_workers < 1:
        raise UserError(f"--num-workers must be at least 1, got {num_workers}")
    if not timeout > 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if max_retries < 0:
        raise UserError(f"--max-retries must be 0 or more, got {max_retries}")
    return LLMConfig(
        base_url=server_url.rstrip("/"),
        model=model,
        max_concurrency=num_workers,
        timeout=timeout,
        max_retries=max_retries,
        cache_dir=cache_dir,
        max_connection_failures=max_connection_failures,
        tpm=tpm,
        rpm=rpm,
    )


def input_identity(source: str) -> str:
    """The input as recorded in the run's identity: an absolute path for local files."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source
