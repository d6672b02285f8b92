"""Logits processors on hand-made logits (worked examples), and their row-by-row use in
verification: row j of a speculative step equals the plain path's single row at that position."""
import math

import pytest
import torch

from backend.generation.logits_processors import LogitsProcessor, Penalties

INF = float("-inf")


def run(pen, logits, context, drafts=(), generated=0, bad=(), end_ids=(9,), temperature=0.0):
    proc = LogitsProcessor(pen, bad, end_ids, temperature)
    return proc(torch.tensor(logits, dtype=torch.float32), context, drafts, generated).tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_present_tokens():
    # tokens 3 (logit -1) and 5 (logit 4) are in the context: -1*2 = -2, 4/2 = 2; others unchanged
    out = run(Penalties(repetition_penalty=2.0), [[1, 1, 1, -1, 1, 4]], [3, 3, 5])
    assert out == [[1, 1, 1, -2, 1, 2]]
    # below 1 it encourages: 4 / 0.5 = 8, -1 * 0.5 = -0.5
    assert run(Penalties(repetition_penalty=0.5), [[0, 0, 0, -1, 0, 4]], [3, 5]) == [[0, 0, 0, -0.5, 0, 8]]


def test_presence_counts_once_frequency_counts_occurrences_prompt_included():
    ctx = [1, 1, 1, 2]  # token 1 three times, token 2 once (prompt tokens count, as in TensorRT-LLM)
    assert run(Penalties(presence_penalty=0.5), [[0, 0, 0, 0]], ctx) == [[0, -0.5, -0.5, 0]]
    assert run(Penalties(frequency_penalty=0.5), [[0, 0, 0, 0]], ctx) == [[0, -1.5, -0.5, 0]]
    assert run(Penalties(presence_penalty=1.0, frequency_penalty=-1.0), [[0, 0, 0, 0]], ctx) == [[0, 2, 0, 0]]


def test_additive_penalties_act_on_temperature_scaled_logits():
    """TensorRT-LLM subtracts from logits / T; target_probs divides by T afterwards."""
    out = run(Penalties(presence_penalty=1.0), [[0.0, 0.0]], [1], temperature=0.5)
    assert out == [[0.0, -0.5]]  # (0 - 0.5) / 0.5 = -1 = 0 / 0.5 - 1


def test_min_length_masks_end_tokens_until_enough_were_generated():
    pen = Penalties(min_length=3)
    logits = [[0.0] * 10] * 3
    # generated 1 before row 0: rows 0 and 1 (generated 1, 2) are masked, row 2 (generated 3) is not
    out = run(pen, logits, [4, 4], drafts=[5, 6], generated=1, end_ids=(9, 8))
    assert [r[8] for r in out] == [INF, INF, 0.0] and [r[9] for r in out] == [INF, INF, 0.0]
    assert run(pen, [[0.0] * 10], [4], generated=3)[0][9] == 0.0


def test_bad_words_single_token_always_and_multi_token_after_its_prefix():
    bad = [[7], [2, 3, 4]]  # word [2, 3, 4]: token 4 masked when the context ends with 2, 3
    logits = [[0.0] * 8] * 3
    out = run(Penalties(bad_words=("x", "y")), logits, [1, 2], drafts=[3, 5], bad=bad)
    assert all(r[7] == INF for r in out)
    assert [r[4] for r in out] == [0.0, INF, 0.0]  # row 1 sees [.., 2, 3]
    assert run(Penalties(bad_words=("y",)), [[0.0] * 8], [2, 3], bad=[[2, 3, 4]])[0][4] == INF


def test_verification_rows_equal_plain_rows_at_each_position():
    """Row j of a speculative step is processed exactly as plain decoding's single row after
    context + d_1..d_j: every processor, random logits."""
    g = torch.Generator().manual_seed(0)
    pen = Penalties(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, min_length=4,
                    bad_words=("a", "b"))
    proc = LogitsProcessor(pen, [[11], [5, 6]], [0], temperature=0.7)
    logits = torch.randn(5, 32, generator=g)
    context, drafts = [1, 5, 2, 5, 3], [6, 5, 6, 0]
    rows = proc(logits, context, drafts, generated=2)
    for j in range(5):
        alone = proc(logits[j: j + 1], context + drafts[:j], (), generated=2 + j)
        assert torch.equal(rows[j: j + 1], alone), j


def test_neutral_penalties_and_validation():
    assert Penalties().neutral
    assert not Penalties(min_length=1).neutral and not Penalties(bad_words=("x",)).neutral
    assert Penalties().problems(16) is None
    cases = [(Penalties(repetition_penalty=0.0), "repetition_penalty"),
             (Penalties(repetition_penalty=-1.0), "repetition_penalty"),
             (Penalties(repetition_penalty=math.nan), "repetition_penalty"),
             (Penalties(presence_penalty=math.nan), "presence_penalty"),
             (Penalties(frequency_penalty=math.inf), "frequency_penalty"),
             (Penalties(min_length=-1), "min_length"),
             (Penalties(min_length=17), "exceeds max_tokens 16"),
             (Penalties(bad_words=(b"x",)), "bad_words must be strings")]
    for pen, message in cases:
        assert message in pen.problems(16)
