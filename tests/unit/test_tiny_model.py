"""The 「它」 data set (attn_lib.it_data) and the tiny model trained on it (attn_lib.tiny_model)."""
import torch

from attn_lib import it_data, tiny_model


def test_data_splits_are_disjoint_and_deterministic():
    train, test = it_data.make_split("train", 3000), it_data.make_split("test", 1000)
    assert len(train) == 3000 and len(test) == 1000
    assert {ex.frame for ex in train}.isdisjoint({ex.frame for ex in test})
    assert {ex.tokens for ex in train}.isdisjoint({ex.tokens for ex in test})
    assert {ex.frame for ex in test} == set(it_data.HELD_OUT_FRAMES)
    assert it_data.make_split("test", 50) == test[:50]  # same seed, same sentences
    train_words = {t for ex in train for t in ex.tokens}
    assert {t for ex in test for t in ex.tokens} <= train_words  # held-out frames recombine seen words


def test_data_labels_are_right_and_position_alone_fails():
    test = it_data.make_split("test", 1000)
    for ex in test:
        assert ex.tokens[ex.it_index] == "它"
        verb = ex.tokens[ex.it_index + (2 if ex.form == "被" else 1)]
        assert it_data.VERB_CLASS[verb] == it_data.CLASS_OF[ex.target] != it_data.CLASS_OF[ex.other]
        objects = [t for t in ex.tokens if t in it_data.CLASS_OF]
        assert ex.target in objects[:2] and ex.other in objects[:2]
    first = sum(ex.tokens[2] == ex.target for ex in test) / len(test)
    nearest = sum([t for t in ex.tokens[: ex.it_index] if t in it_data.CLASS_OF][-1] == ex.target
                  for ex in test) / len(test)
    assert 0.4 < first < 0.6 and nearest < 0.6  # "the first object", "the nearest noun": near chance


def test_tiny_model_learns_and_is_reproducible():
    data = it_data.encode(it_data.make_split("train", 3000))
    test = it_data.encode(it_data.make_split("test", 1000))
    runs, before = [], torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model = tiny_model.build_model("rope", seed=0)
            losses = tiny_model.train(model, data)
            runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    finally:
        torch.set_num_threads(before)
    assert runs[0][0] == runs[1][0]  # bit-identical losses with 1 and 2 threads
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert tiny_model.accuracy(model, test) > 0.9
    assert tiny_model.accuracy(tiny_model.without_head(model, 0), test) < 0.8
