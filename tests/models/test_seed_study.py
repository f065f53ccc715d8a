"""attn_lib.models.seed_study: chapter 10's seed study, on a small data set (the full one is tests/book/test_packaged_seed_study.py)."""
import pytest
import torch

from attn_lib.models import it_data
from attn_lib.models import tiny_model
from attn_lib.models.seed_study import DIGITS, KINDS, seed_study


def test_seed_study_measures_what_a_hand_written_run_measures():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        study = seed_study([2], n_train=200, n_test=60)
        assert torch.get_num_threads() == 1  # the study leaves the caller's setting alone
        model = tiny_model.build_model("rope", seed=2)
        tiny_model.train(model, it_data.encode(it_data.make_split("train", 200)), seed=2)
    finally:
        torch.set_num_threads(before)
    examples = it_data.make_split("test", 60)
    test = it_data.encode(examples)
    assert study["seeds"] == [2] and all(len(study[name]) == 1 for name in KINDS)
    assert study["rope"][0][0] == round(tiny_model.accuracy(model, test), DIGITS)
    roles = tiny_model.attention_by_role(examples, tiny_model.predict(model, test)[1])  # (H,R)
    verb = int(roles[:, 0].argmax())
    assert study["verb_head"] == [verb]
    assert study["roles"][0] == [[round(x, DIGITS) for x in row] for row in roles.tolist()]
    zeroed = tiny_model.accuracy(tiny_model.without_head(model, 1 - verb), test)
    assert study["without_other_head"] == [round(zeroed, DIGITS)]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"seeds": []}, ValueError, "seeds must be a non-empty sequence"),
    ({"seeds": [1.5]}, TypeError, r"seed must be an int >= 0, got 1\.5"),
    ({"seeds": [-1]}, ValueError, "seed must be an int >= 0, got -1"),
    ({"seeds": [0], "n_test": 0}, ValueError, "n_test must be a positive int, got 0"),
])
def test_seed_study_checks_its_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        seed_study(**kwargs)
