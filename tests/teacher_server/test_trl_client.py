"""TRL's own teacher client, ``trl.generation.vllm_client.VLLMClient``, against the teacher server as TRL's server
distillation uses it (``base_url`` = the server's root, ``get_sequence_logprobs``): the same top-k and realized
logprobs as the local model, to 1e-5, whatever the temperature it sends."""

from __future__ import annotations

import math

import pytest
import torch

from adwin.teacher_server.service import TeacherService

vllm_client = pytest.importorskip("trl.generation.vllm_client")
pytestmark = pytest.mark.timeout(120)  # a server without /health makes VLLMClient poll for ever

SEQS = [[1, 14, 20, 5, 33, 9, 2], [4, 60, 7], [9, 9, 9, 9, 9, 1, 2, 3, 50, 41]]
PROMPT_LENGTHS = [3, 1, 5]


@pytest.fixture
def client(server: str, monkeypatch: pytest.MonkeyPatch):
    # VLLMClient refuses to start where vllm is not installed, though scoring over HTTP does not use it
    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *args, **kwargs: True)
    return vllm_client.VLLMClient(base_url=server)


def _local(service: TeacherService, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = service.scorer.model(input_ids=torch.tensor([seq])).logits[0]  # (n, V)
    return torch.log_softmax(logits.float(), dim=-1)  # (n, V): row j - 1 predicts seq[j]


@pytest.mark.parametrize("top", [1, 4, 8])
@pytest.mark.parametrize("chunk_size", [0, 1])
def test_vllm_client_gets_the_local_models_topk_and_realized_logprobs(client, service: TeacherService, top: int,
                                                                     chunk_size: int) -> None:
    assert client.model == service.name
    out = client.get_sequence_logprobs(SEQS, PROMPT_LENGTHS, top_logprobs=top, chunk_size=chunk_size)
    for b, (seq, start) in enumerate(zip(SEQS, PROMPT_LENGTHS, strict=True)):
        logp = _local(service, seq)
        assert len(out["logprobs"][b]) == len(seq) - start
        for i, j in enumerate(range(start, len(seq))):
            values, ids = logp[j - 1].topk(top)
            assert out["logprob_token_ids"][b][i] == ids.tolist()
            assert out["logprobs"][b][i] == pytest.approx(values.tolist(), abs=1e-5)
            assert out["actual_token_ids"][b][i] == [seq[j]]
            assert out["actual_logprobs"][b][i][0] == pytest.approx(float(logp[j - 1, seq[j]]), abs=1e-5)
            assert math.isfinite(out["actual_logprobs"][b][i][0])  # the realized token comes whatever its rank


def test_the_temperature_trl_sends_does_not_change_the_logprobs(client) -> None:
    reference = client.get_sequence_logprobs(SEQS, PROMPT_LENGTHS, top_logprobs=4, temperature=1.0)
    for temperature in (0.5, 2.0):
        assert client.get_sequence_logprobs(SEQS, PROMPT_LENGTHS, top_logprobs=4, temperature=temperature) == reference


def test_a_top_logprobs_over_the_servers_cap_fails_with_the_servers_reason(client) -> None:
    with pytest.raises(Exception, match="--max-logprobs"):  # VLLMClient raises a bare Exception with the body
        client.get_sequence_logprobs(SEQS, PROMPT_LENGTHS, top_logprobs=20)
