"""attn_lib.models.it_data: chapter 10's 「它」 data set: disjoint, deterministic splits whose labels are right and
that no shortcut (the first object, the nearest noun) solves."""
from attn_lib.models import it_data


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


def test_encode_pads_and_points_at_it():
    examples = it_data.make_split("train", 5)
    data = it_data.encode(examples)
    assert data["ids"].shape == (5, max(len(ex.tokens) for ex in examples))
    for b, ex in enumerate(examples):
        n = len(ex.tokens)
        assert int(data["lengths"][b]) == n and int(data["it_index"][b]) == ex.it_index
        assert [it_data.VOCAB[i] for i in data["ids"][b, :n].tolist()] == list(ex.tokens)
        assert all(it_data.VOCAB[i] == it_data.PAD for i in data["ids"][b, n:].tolist())
        assert it_data.OBJECTS[int(data["target"][b])] == ex.target
